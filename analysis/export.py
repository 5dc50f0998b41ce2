"""Exports of a measured configuration that tools load unmodified: HF TrainingArguments JSON, DeepSpeed JSON,
an accelerate config and the launch command; each with a provenance file (model, recipe, hardware, versions)."""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shlex

import yaml

from trainscout.spaces import ConfigError, Plan, all_knobs, fmt, get
from trainscout.trial import contention, engines
from trainscout.trial.records import Record, TOKENS_PER_S, metric_columns

FORMATS = ("hf", "deepspeed", "accelerate", "command")
# the measurement's metrics trainscout.json carries
EXPORTED_METRICS = metric_columns(TOKENS_PER_S, "step_s", "mfu", "hfu", "flops_convention", "projected_days")
# The order of training_args.json's and accelerate.yaml's fields (the knobs' among them: Export.fields), as they were
# always written; then the engine's fields, then any other field a knob adds.
HF_ORDER = ("output_dir", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "learning_rate",
            "adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm", "lr_scheduler_type", "warmup_steps", "bf16",
            "fp16", "activation_checkpointing", "torch_compile", "optim", "report_to", "save_strategy", "save_steps",
            "save_total_limit", "activation_checkpointing_kwargs", "tf32", "use_cpu")
ACCELERATE_ORDER = ("compute_environment", "num_machines", "machine_rank", "num_processes", "mixed_precision",
                    "use_cpu", "distributed_type")


def _knob_fields(fmt: str, plan: Plan, device: str) -> dict:
    """Every knob's fields of export format fmt (its Export.fields)."""
    return {f: v for k in all_knobs() for f, v in k.export.fields(fmt, plan, device).items()}


def _ordered(fields: dict, order: tuple, engine: dict) -> dict:
    """fields in `order`, then the engine's (which win over a field of the same name), then the rest."""
    out = {f: fields[f] for f in order if f in fields}
    out.update(engine)
    return out | {f: v for f, v in fields.items() if f not in out}


def hf_args(rec: Record, output_dir: str, paths: dict[str, str]) -> dict:
    """keyword arguments of transformers.TrainingArguments for the measured configuration and the recipe."""
    plan, recipe = rec.plan, rec.recipe
    args = {
        "output_dir": output_dir,
        "gradient_accumulation_steps": rec.grad_accum,
        "max_steps": recipe["total_steps"],
        "learning_rate": recipe["lr"], "adam_beta1": recipe["betas"][0], "adam_beta2": recipe["betas"][1],
        "weight_decay": recipe["weight_decay"], "max_grad_norm": recipe["grad_clip"],
        "lr_scheduler_type": "cosine", "warmup_steps": max(1, recipe["total_steps"] // 100),
        "optim": "adamw_torch_fused" if rec.device == "cuda" else "adamw_torch",
        "report_to": "none",
        # a checkpoint about every hour of the measured step time, the last two kept
        "save_strategy": "steps", "save_steps": max(1, round(3600 / rec.m["step_s"])), "save_total_limit": 2,
        **_knob_fields("hf", plan, rec.device),
    }
    if rec.device != "cuda":
        args["use_cpu"] = True
    return _ordered(args, HF_ORDER, engines.get(plan.engine).hf_args(rec, paths))


def checked_hf_args(rec: Record, output_dir: str, paths: dict[str, str],
                    folder: str | None = None) -> tuple[dict, list[str]]:
    """hf_args spelled for the installed transformers and built by its TrainingArguments (a field it refuses fails
    the export, not the user's run), in `folder` (the export's, which its relative paths name); with what the built
    arguments would run differently from the measurement."""
    import torch
    import transformers
    from transformers import TrainingArguments

    from trainscout.runtime import hf
    args = hf.for_installed(hf_args(rec, output_dir, paths))
    with contextlib.chdir(folder or "."):  # the paths in the arguments are relative to the export folder
        if rec.device == "cuda" and not torch.cuda.is_available():
            # a GPU measurement exported on a machine without one: TrainingArguments' device checks (bf16, tf32 need
            # that GPU) cannot pass here, so the fields and values are checked as for the CPU and the device at launch
            built = TrainingArguments(**copy.deepcopy({**args, "use_cpu": True, "tf32": None, "fp16": False}))
        else:
            built = TrainingArguments(**copy.deepcopy(args))  # it normalises fsdp_config in place
    notes = []
    if (args.get("fsdp_config") or {}).get("version") == 2 and \
            (getattr(built, "fsdp_plugin_args", None) or {}).get("fsdp_version") != 2:
        notes.append(f"training_args.json alone runs FSDP1 with transformers {transformers.__version__} (FSDP2 from "
                     "TrainingArguments needs 5.x): launch it with accelerate launch --config_file accelerate.yaml, "
                     "which asks for FSDP2 (fsdp_version: 2)")
    return args, notes


def hook_only(rec: Record) -> list[str]:
    """The measured knob settings that TrainingArguments cannot express (Export.hook_only, in Export.hook_rank order):
    trainscout.runtime.hf.prepare applies them (without it a stock Trainer runs without them)."""
    from trainscout.runtime import hf
    plan = rec.plan or Plan()
    knobs = sorted(all_knobs(), key=lambda k: k.export.hook_rank)
    return [s for k in knobs if (s := k.export.hook_only(k.name, rec.config.get(k.name, k.export.without_hook), plan,
                                                         hf))]


def hook_costs(rec: Record, hook: list[str], measurements: list[Record]) -> dict:
    """For each setting only the hook applies: the measurement of the same configuration with what a stock
    Trainer runs instead (Export.without_hook), on the same model, recipe and GPU, where the store holds one; its
    tokens/s and the ratio to this measurement (None: not measured)."""
    out = {}
    for item in hook:
        knob = item.split("=", 1)[0]
        instead = dict(rec.config, **{knob: get(knob).export.without_hook})
        twin = next((m for m in measurements if m.ok and m.config == instead and m.model == rec.model
                     and m.recipe == rec.recipe and m.hardware.get("gpu") == rec.hardware.get("gpu")
                     and m.world_size == rec.world_size), None)
        out[item] = None if twin is None else {
            "without": f"{knob}={instead[knob]}", "key": twin.key, TOKENS_PER_S: twin.measured.tokens_per_s,
            "ratio": twin.measured.tokens_per_s / rec.measured.tokens_per_s}
    return out


def accelerate_config(rec: Record, paths: dict[str, str]) -> dict:
    """The accelerate config (accelerate.yaml) of the measured run: processes, precision, the engine's section."""
    plan = rec.plan
    # several CPU ranks: accelerate's MULTI_CPU launches one process without mpirun (a 2-rank export ran one), its
    # MULTI_GPU launcher starts num_processes (torch elastic); the exported TrainingArguments' use_cpu=True makes
    # them CPU ranks (gloo); a script of your own passes Accelerator(cpu=True)
    cfg = {"compute_environment": "LOCAL_MACHINE", "num_machines": 1, "machine_rank": 0,
           "num_processes": rec.world_size, "use_cpu": rec.device != "cuda" and rec.world_size == 1,
           "distributed_type": "NO" if rec.world_size == 1 else "MULTI_GPU",
           **_knob_fields("accelerate", plan, rec.device)}  # the precision; whole-model compile (per layer: the hook's)
    cfg = _ordered(cfg, ACCELERATE_ORDER, engines.get(plan.engine).accelerate(rec, paths))
    if "deepspeed_config_file" in (cfg.get("deepspeed_config") or {}):
        cfg.pop("mixed_precision", None)  # accelerate refuses it beside a DeepSpeed file, which sets the precision
    return cfg


def check_accelerate(path: str) -> None:
    """Load an accelerate config as `accelerate launch --config_file` does (from its folder, which its relative
    paths name), and for DeepSpeed run the check the launched Accelerator runs on it (the fields a DeepSpeed file
    owns): a config accelerate refuses fails the export, not the user's job."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    path = os.path.abspath(path)
    with contextlib.chdir(os.path.dirname(path)):
        args, defaults, mp_from_config = _validate_launch_command(
            launch_command_parser().parse_args(["--config_file", path, "train.py"]))
        ds = (defaults.deepspeed_config or {}) if defaults else {}
        if args.use_deepspeed and "deepspeed_config_file" in ds:
            from accelerate.utils import DeepSpeedPlugin
            fields = list(ds) + (["mixed_precision"] if mp_from_config else [])
            from unittest import mock  # the launch's environment for the check, this process's restored after
            with mock.patch.dict(os.environ, {"ACCELERATE_CONFIG_DS_FIELDS": ",".join(fields).lower()}):
                DeepSpeedPlugin(hf_ds_config=ds["deepspeed_config_file"])


def set_knobs(rec: Record) -> list:
    """The registered knobs the measured configuration sets away from their defaults."""
    cfg = rec.config or {}
    return [k for k in all_knobs() if k.name in cfg and cfg[k.name] != k.default]


def carried(rec: Record) -> tuple[tuple[str, ...], dict[str, str]]:
    """The formats that carry the measurement (its engine's, less those a knob it sets cannot go in), and why each
    other format is refused (format -> the engine's or the knob's reason, with the fix)."""
    engine = engines.get(rec.plan.engine)
    why = {f: engine.not_carried for f in FORMATS if f not in engine.formats}
    for knob in set_knobs(rec):
        carried = knob.export.formats
        if carried is not None:
            why.update({f: knob.export.not_carried for f in FORMATS if f not in carried and f not in why})
    return tuple(f for f in FORMATS if f not in why), why


def launch(rec: Record) -> dict:
    """How to launch the export with a training script of your own (HF Trainer + trainscout.runtime.hf), from the
    export folder: {"launcher", "command"}. The rule: one rank of an engine a plain process runs (plain PyTorch):
    `python`; several ranks of it: `torchrun --nproc_per_node N`; an engine that needs accelerate's setup (FSDP2,
    DeepSpeed: HF Trainer refuses FSDP in one process), or several CPU ranks: `accelerate launch --config_file
    accelerate.yaml`; an engine no stock trainer has (the pipeline): `trainscout train` alone."""
    engine = engines.get(rec.plan.engine)
    n = rec.world_size or 1
    kind = max([engine.launcher] + [k.export.launcher for k in set_knobs(rec) if k.export.launcher],
               key=engines.LAUNCHERS.index)
    if kind == "python" and n > 1:
        kind = "accelerate" if rec.device != "cuda" else "torchrun"
    command = {"python": "python your_train.py",
               "torchrun": f"torchrun --nproc_per_node {n} your_train.py",
               "accelerate": "accelerate launch --config_file accelerate.yaml your_train.py",
               "trainscout": "trainscout train --config . --steps 1000"}[kind]
    return {"launcher": kind, "command": command}


def launch_script(rec: Record, how: dict) -> str:
    """launch.sh: `trainscout train` with the export (every path relative to the folder, which may move), and the
    launch of a script of your own."""
    import transformers

    from trainscout.trial.models import model_names
    model = f" --model {shlex.quote(rec.model)}" if rec.model in model_names() else ""  # else: trainscout.json's config
    return "\n".join([
        "#!/usr/bin/env bash",
        "# This exported configuration, launched (trainscout export). Every path is relative to this folder: move it",
        "# anywhere. Your own training script (HF Trainer; README: your own trainer) is launched from here with:",
        f"#   {how['command']}",
        f"# training_args.json was written for transformers {transformers.__version__}: load it with",
        "#   trainscout.runtime.hf.training_arguments(FOLDER), which adapts it to the installed version.",
        "# This script trains with trainscout's own trainer (synthetic tokens; add --data tokens.bin): ./launch.sh",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f'exec trainscout train --config .{model} --steps "${{STEPS:-1000}}" "$@"', ""])


def shared_note(rec: Record) -> list[str]:
    """A note on a measurement other trials shared the CPU or GPU of (trial.contention), [] for a clean one."""
    if not (shared := contention.label(rec.metrics)):
        return []
    return [f"measured while {shared} shared its device on the node: its tokens/s is lower than alone and is not "
            "served to later searches; measure it alone (search --max-concurrent 1)"]


def export(rec: Record, out_dir: str, formats=FORMATS, measurements: list[Record] | None = None,
           verified: dict | None = None) -> list[str]:
    """Write the chosen formats into out_dir; returns the files written. A format that cannot carry the measured
    engine is refused (ConfigError, nothing written) when asked for by name, and left out of FORMATS (all) with the
    reason in trainscout.json ("not_exported"). With the store's measurements, trainscout.json's "hook_cost" says
    what each hook-only setting was measured to be worth (hook_costs); "quality" whether it trains the same model as
    its reference (trial/quality.py; verified: the store's `verify --quality` result of this measurement)."""
    from trainscout.spaces import current
    from trainscout.trial.quality import status as quality_status
    plan = rec.plan
    formats, refused, why = _carried_formats(rec, formats)
    if os.path.exists(os.path.join(out_dir, "trainscout.json")):  # another export's files would be overwritten
        raise ConfigError("--out", f"--out {out_dir} holds an export already (trainscout.json): give a new folder, or "
                                   "remove that one first")
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def write(name, text) -> str:
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(path)
        return path

    notes, written_for = _write_configs(rec, formats, out_dir, write)
    how = launch(rec)
    if "command" in formats:
        os.chmod(write("launch.sh", launch_script(rec, how)), 0o755)
    hook = hook_only(rec)
    config, retired = current(rec.config)  # a first record's settings that are no knob any more: left out, said
    provenance = {"model": rec.model, "model_config": rec.model_config, "config": config, "plan": plan.to_dict(),
                  "recipe": rec.recipe, "hardware": rec.hardware, "versions": rec.versions, "key": rec.key,
                  "started_at": rec.started_at, "hook": hook, "launch": how,
                  "hook_cost": hook_costs(rec, hook, measurements or []),
                  "not_exported": {f: why[f] for f in refused},
                  "notes": [*plan.notes, *notes, *shared_note(rec), *retired],
                  "quality": dict(zip(("status", "why"), quality_status(rec.m, verified, rec.config, rec.device))),
                  **written_for}  # transformers_version: the one training_args.json was written for
    write("trainscout.json", json.dumps(provenance | {"metrics": {k: rec.m.get(k) for k in EXPORTED_METRICS}},
                                        indent=2))
    return written


def _carried_formats(rec: Record, formats) -> tuple[list[str], list[str], dict]:
    """(the formats asked for that can carry the measurement, those that cannot, why not per format): ConfigError
    where one that cannot was asked for by name (not FORMATS, all)."""
    engine = engines.get(rec.plan.engine)
    ok, why = carried(rec)  # the engine's formats, less those a set knob (tensor_parallel, ...) cannot go in
    refused = [f for f in formats if f not in ok]
    if refused and tuple(formats) != FORMATS:
        what = rec.plan.engine if refused[0] not in engine.formats else \
            ", ".join(f"{k.name}={fmt(rec.config[k.name])}" for k in set_knobs(rec)
                      if k.export.not_carried == why[refused[0]])
        raise ConfigError("--format", f"--format {refused[0]} cannot carry a {what} measurement: {why[refused[0]]}")
    return [f for f in formats if f in ok], refused, why


def _write_configs(rec: Record, formats: list[str], out_dir: str, write) -> tuple[list[str], dict]:
    """The engine's config files, training_args.json and accelerate.yaml, as the formats ask, by write(name, text):
    (the notes of the HF arguments, {transformers' version key: the version they were written for} or {})."""
    files = engines.get(rec.plan.engine).files(rec)  # the engine's own config files (DeepSpeed's JSON)
    paths = {name: name for name in files}  # relative to the folder: an export folder can move (it held absolute ones)
    notes: list[str] = []
    if "deepspeed" in formats or "hf" in formats or "accelerate" in formats:
        for name, obj in files.items():
            write(name, json.dumps(obj, indent=2))
    written_for = {}
    if "hf" in formats:
        import transformers

        from trainscout.runtime.hf import VERSION_KEY
        hf_json, notes = checked_hf_args(rec, "run", paths, folder=out_dir)
        # a plain TrainingArguments file: TrainingArguments(**json.load(f)) and HfArgumentParser.parse_json_file
        # refuse any key that is not a field. The transformers it was written for (field names change:
        # transformers 4.50 refused 5.x's activation_checkpointing) goes to trainscout.json, where hf.read_arguments
        # finds it
        write("training_args.json", json.dumps(hf_json, indent=2))
        written_for = {VERSION_KEY: transformers.__version__}
    if "accelerate" in formats:
        check_accelerate(write("accelerate.yaml", yaml.safe_dump(accelerate_config(rec, paths), sort_keys=False)))
    return notes, written_for
