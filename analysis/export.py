"""Exports of a measured configuration that tools load unmodified: HF TrainingArguments JSON, DeepSpeed JSON,
an accelerate config and the launch command; each with a provenance file (model, recipe, hardware, versions)."""
from __future__ import annotations

import copy
import json
import os
import shlex

import yaml

from trainscout.spaces import ConfigError, Plan
from trainscout.trial import engines
from trainscout.trial.records import Record

FORMATS = ("hf", "deepspeed", "accelerate", "command")


def hf_args(rec: Record, output_dir: str, paths: dict[str, str]) -> dict:
    """keyword arguments of transformers.TrainingArguments for the measured configuration and the recipe."""
    plan, recipe = Plan.from_dict(rec.plan), rec.recipe
    args = {
        "output_dir": output_dir,
        "per_device_train_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": rec.grad_accum,
        "max_steps": recipe["total_steps"],
        "learning_rate": recipe["lr"], "adam_beta1": recipe["betas"][0], "adam_beta2": recipe["betas"][1],
        "weight_decay": recipe["weight_decay"], "max_grad_norm": recipe["grad_clip"],
        "lr_scheduler_type": "cosine", "warmup_steps": max(1, recipe["total_steps"] // 100),
        "bf16": plan.precision == "bf16-mixed", "fp16": plan.precision == "fp16-mixed",
        "activation_checkpointing": bool(plan.checkpoint_every),
        "torch_compile": plan.compile,
        "optim": "adamw_torch_fused" if rec.device == "cuda" else "adamw_torch",
        "report_to": "none",
        # a checkpoint about every hour of the measured step time, the last two kept
        "save_strategy": "steps", "save_steps": max(1, round(3600 / rec.m["step_s"])), "save_total_limit": 2,
    }
    if plan.checkpoint_every > 1:  # transformers 5.2x; for_installed leaves it to the hook before that
        args["activation_checkpointing_kwargs"] = {"every_n_layers": plan.checkpoint_every}
    if rec.device == "cuda":
        args["tf32"] = plan.tf32
    else:
        args["use_cpu"] = True
    args.update(engines.get(plan.engine).hf_args(rec.to_dict(), paths))  # the engines read it by key
    return args


def checked_hf_args(rec: Record, output_dir: str, paths: dict[str, str]) -> tuple[dict, list[str]]:
    """hf_args spelled for the installed transformers and built by its TrainingArguments (a field it refuses fails
    the export, not the user's run); with what the built arguments would run differently from the measurement."""
    import torch
    import transformers
    from transformers import TrainingArguments

    from trainscout.runtime import hf
    args = hf.for_installed(hf_args(rec, output_dir, paths))
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


# what a stock Trainer runs instead of a hook-only setting (training_args.json alone)
WITHOUT_HOOK = {"compile_scope": "model", "activation_checkpointing": "none", "loss_kernel": "eager",
                "sdpa_backend": "auto", "fp8": "off"}


def hook_only(rec: Record) -> list[str]:
    """The measured knob settings that TrainingArguments cannot express: trainscout.runtime.hf.prepare applies them
    (without it a stock Trainer runs without them)."""
    from trainscout.runtime import hf
    plan, cfg = rec.plan, rec.config
    out = []
    if plan.get("compile") and plan.get("compile_scope") == "layers":
        out.append("compile_scope=layers")
    if plan.get("checkpoint_every", 0) > 1 and not hf.native_every_n():
        out.append(f"activation_checkpointing={plan['checkpoint_every']}")
    for knob in ("loss_kernel", "sdpa_backend", "fp8"):
        if cfg.get(knob, WITHOUT_HOOK[knob]) != WITHOUT_HOOK[knob]:
            out.append(f"{knob}={cfg[knob]}")
    return out


def hook_costs(rec: Record, hook: list[str], measurements: list[Record]) -> dict:
    """For each setting only the hook applies: the measurement of the same configuration with what a stock
    Trainer runs instead (WITHOUT_HOOK), on the same model, recipe and GPU, where the store holds one; its tokens/s
    and the ratio to this measurement (None: not measured)."""
    out = {}
    for item in hook:
        knob = item.split("=", 1)[0]
        instead = dict(rec.config, **{knob: WITHOUT_HOOK.get(knob)})
        twin = next((m for m in measurements if m.ok and m.config == instead and m.model == rec.model
                     and m.recipe == rec.recipe and m.hardware.get("gpu") == rec.hardware.get("gpu")
                     and m.world_size == rec.world_size), None)
        out[item] = None if twin is None else {
            "without": f"{knob}={instead[knob]}", "key": twin.key, "tokens_per_s": twin.m["tokens_per_s"],
            "ratio": twin.m["tokens_per_s"] / rec.m["tokens_per_s"]}
    return out


def accelerate_config(rec: Record, paths: dict[str, str]) -> dict:
    """The accelerate config (accelerate.yaml) of the measured run: processes, precision, the engine's section."""
    plan = Plan.from_dict(rec.plan)
    mp = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(plan.precision, "no")
    cfg = {"compute_environment": "LOCAL_MACHINE", "num_machines": 1, "machine_rank": 0,
           "num_processes": rec.world_size, "mixed_precision": mp, "use_cpu": rec.device != "cuda",
           "distributed_type": "NO" if rec.world_size == 1 else ("MULTI_GPU" if rec.device == "cuda" else "MULTI_CPU")}
    cfg.update(engines.get(plan.engine).accelerate(rec.to_dict(), paths))
    if "deepspeed_config_file" in (cfg.get("deepspeed_config") or {}):
        del cfg["mixed_precision"]  # accelerate refuses it beside a DeepSpeed file, which sets the precision itself
    if plan.compile and plan.compile_scope == "model":  # per-layer compile is the hook's (runtime.hf.prepare)
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    return cfg


def check_accelerate(path: str) -> None:
    """Load an accelerate config as `accelerate launch --config_file` does, and for DeepSpeed run the check the
    launched Accelerator runs on it (the fields a DeepSpeed file owns): a config accelerate refuses fails the
    export, not the user's job."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    args, defaults, mp_from_config = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", path, "train.py"]))
    ds = (defaults.deepspeed_config or {}) if defaults else {}
    if args.use_deepspeed and "deepspeed_config_file" in ds:
        from accelerate.utils import DeepSpeedPlugin
        fields = list(ds) + (["mixed_precision"] if mp_from_config else [])
        from unittest import mock  # the launch's environment for the check, this process's restored after
        with mock.patch.dict(os.environ, {"ACCELERATE_CONFIG_DS_FIELDS": ",".join(fields).lower()}):
            DeepSpeedPlugin(hf_ds_config=ds["deepspeed_config_file"])


def launch_command(rec: Record, out_dir: str) -> str:
    """launch.sh's command: `trainscout train` with the export, and how to launch your own script with it."""
    from trainscout.trial.models import model_names
    n = rec.world_size
    model = f" --model {shlex.quote(rec.model)}" if rec.model in model_names() else ""  # else: trainscout.json's config
    return (f"trainscout train --config {shlex.quote(os.path.abspath(out_dir))}{model} --steps 1000  "
            f"# or your own script: accelerate launch --config_file "
            f"{shlex.quote(os.path.join(out_dir, 'accelerate.yaml'))} --num_processes {n} your_train.py, with "
            f"TrainingArguments(**json.load(open({os.path.join(out_dir, 'training_args.json')!r})))")


def export(rec: Record, out_dir: str, formats=FORMATS, measurements: list[Record] | None = None,
           verified: dict | None = None) -> list[str]:
    """Write the chosen formats into out_dir; returns the files written. A format that cannot carry the measured
    engine is refused (ConfigError, nothing written) when asked for by name, and left out of FORMATS (all) with the
    reason in trainscout.json ("not_exported"). With the store's measurements, trainscout.json's "hook_cost" says
    what each hook-only setting was measured to be worth (hook_costs); "quality" whether it trains the same model as
    its reference (trial/quality.py; verified: the store's `verify --quality` result of this measurement)."""
    from trainscout.trial.quality import status as quality_status
    plan = Plan.from_dict(rec.plan)
    engine = engines.get(plan.engine)
    notes: list[str] = []
    refused = [f for f in formats if f not in engine.formats]
    if refused and tuple(formats) != FORMATS:
        raise ConfigError("--format", f"--format {refused[0]} cannot carry a {plan.engine} measurement: {engine.not_carried}")
    formats = [f for f in formats if f in engine.formats]
    os.makedirs(out_dir, exist_ok=True)
    written = []
    files = engine.files(rec.to_dict())  # the engine's own config files (DeepSpeed's JSON)
    paths = {name: os.path.abspath(os.path.join(out_dir, name)) for name in files}

    def write(name, text):
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(path)

    if "deepspeed" in formats or "hf" in formats or "accelerate" in formats:
        for name, obj in files.items():
            write(name, json.dumps(obj, indent=2))
    if "hf" in formats:
        hf_json, notes = checked_hf_args(rec, os.path.join(out_dir, "run"), paths)
        write("training_args.json", json.dumps(hf_json, indent=2))
    if "accelerate" in formats:
        write("accelerate.yaml", yaml.safe_dump(accelerate_config(rec, paths), sort_keys=False))
        check_accelerate(written[-1])
    if "command" in formats:
        write("launch.sh", "#!/usr/bin/env bash\n" + launch_command(rec, out_dir) + "\n")
    hook = hook_only(rec)
    provenance = {"model": rec.model, "model_config": rec.model_config, "config": rec.config, "plan": rec.plan,
                  "recipe": rec.recipe, "hardware": rec.hardware, "versions": rec.versions, "key": rec.key,
                  "started_at": rec.started_at, "hook": hook,
                  "hook_cost": hook_costs(rec, hook, measurements or []),
                  "not_exported": {f: engine.not_carried for f in refused},
                  "notes": [*(rec.plan or {}).get("notes", []), *notes],
                  "quality": dict(zip(("status", "why"), quality_status(rec.m, verified, rec.config, rec.device)))}
    write("trainscout.json", json.dumps(provenance | {"metrics": {k: rec.m.get(k) for k in (
        "tokens_per_s", "step_s", "mfu", "hfu", "flops_convention", "projected_days")}}, indent=2))
    return written
