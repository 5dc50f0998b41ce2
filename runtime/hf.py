"""Run an exported configuration in a stock HF Trainer: `prepare` applies the model transforms trainscout measured
(per-layer compile, the loss kernel, checkpointing every n-th layer, FP8 linears, the SDPA backend, TF32) to your
model, and `training_arguments` builds transformers.TrainingArguments of the installed version from the export,
with the fields the hook now owns switched off (so nothing is applied twice):

    from transformers import AutoModelForCausalLM, Trainer
    from trainscout.runtime import hf
    model = AutoModelForCausalLM.from_config(hf.model_config("out"))   # or your own model of that shape
    model = hf.prepare(model, "out")                                    # before Trainer wraps it
    args = hf.training_arguments("out", output_dir="run", max_steps=1000)
    Trainer(model=model, args=args, train_dataset=dataset).train()

`out` is the folder `trainscout export` wrote (trainscout.json + training_args.json). Importing this module imports
neither torch nor transformers.
"""
from __future__ import annotations

import json
import os

from . import plan_of, prepare_model

# TrainingArguments fields whose name changed between transformers versions: ours -> the older spelling
RENAMED = {"activation_checkpointing": "gradient_checkpointing",
           "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs"}
VERSION_KEY = "transformers_version"  # trainscout.json: the transformers training_args.json was written for (older
# exports held it in training_args.json itself, which a stock TrainingArguments(**json) refuses: dropped)
PATH_FIELDS = ("deepspeed",)  # written relative to the export folder, so that the folder can move


def load(export: str | dict) -> dict:
    """trainscout.json of an export folder (or the file, or the dict itself)."""
    if isinstance(export, dict):
        return export
    path = os.path.join(export, "trainscout.json") if os.path.isdir(export) else export
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def model_config(export: str | dict):
    """The exported model's transformers config (the model the measurement ran), its dtype the measurement's master
    weights' (fp32 under every mixed precision): from_config builds those, not the config.json's "torch_dtype"."""
    from transformers import AutoConfig
    exp = load(export)
    cfg = {k: v for k, v in exp["model_config"].items() if k not in ("dtype", "torch_dtype")}
    return AutoConfig.for_model(**cfg, dtype=(exp.get("plan") or {}).get("master_dtype", "float32"))


def prepare(model, export: str | dict, *, world_size: int | None = None):
    """The model with every measured transform applied before sharding, as the trial engines apply them. A
    whole-model compile (compile_scope=model) is left to TrainingArguments(torch_compile=True), HF's own."""
    exp = load(export)
    model.config.use_cache = False
    model = prepare_model(model, plan_of(exp, world_size=world_size,
                                         device=(exp.get("hardware") or {}).get("device", "cuda")))
    return loss_only(model)


def loss_only(model):
    """The model's forward without logits where it computed the loss for training (labels given, gradients on).

    Why: accelerate (under HF Trainer) wraps a mixed-precision forward in convert_outputs_to_fp32, which copies every
    16-bit output to fp32: a full fp32 copy of the logits per micro-batch that the Trainer never reads (seq x vocab x
    4 bytes per sequence; docs/knobs-why.md, loss_kernel). Evaluation and generation (no labels, or no gradients)
    keep their logits."""
    import functools

    import torch
    forward = model.forward

    @functools.wraps(forward)
    def without_logits(*args, **kwargs):
        out = forward(*args, **kwargs)
        if kwargs.get("labels") is not None and torch.is_grad_enabled() and getattr(out, "loss", None) is not None:
            out["logits"] = None
        return out
    model.forward = without_logits
    return model


def hook_owned(export: str | dict) -> dict:
    """TrainingArguments fields `prepare` takes over: off in the arguments, applied to the model instead."""
    from trainscout.spaces import Plan
    plan = Plan.from_dict(load(export).get("plan") or {})
    owned = {"activation_checkpointing": False,  # prepare checkpoints every n-th layer itself
             "activation_checkpointing_kwargs": None}
    if plan.compile and plan.compile_scope == "layers":
        owned["torch_compile"] = False  # prepare compiled each layer; HF would compile the whole model again
    return owned


def installed_fields() -> set[str]:
    """The field names of the installed transformers' TrainingArguments."""
    import dataclasses

    from transformers import TrainingArguments
    return {f.name for f in dataclasses.fields(TrainingArguments)}


def native_every_n() -> bool:
    """Whether the installed transformers checkpoints every n-th layer itself (activation_checkpointing_kwargs=
    {"every_n_layers": n}, transformers 5.2x); before that only `prepare` can."""
    import inspect

    from transformers import PreTrainedModel
    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
    return enable is not None and "every_n_layers" in inspect.signature(enable).parameters


def for_installed(args: dict) -> dict:
    """Arguments spelled for the installed transformers (activation_checkpointing is gradient_checkpointing before
    transformers 5.2x, and back; checkpointing every n-th layer is left to `prepare` where the version cannot; `fsdp`
    as True or as the strategy string, whichever it takes; an older export's transformers_version dropped); a field
    this version does not know raises ValueError naming it."""
    fields, out = installed_fields(), {}
    args = {k: v for k, v in args.items() if k != VERSION_KEY}
    back = {old: new for new, old in RENAMED.items()}
    args = {(back[k] if k not in fields and back.get(k) in fields else k): v for k, v in args.items()}
    if "fsdp" in args:
        args = _fsdp_for_installed(args)
    if (args.get("activation_checkpointing_kwargs") or {}).get("every_n_layers", 1) > 1 and not native_every_n():
        args.pop("activation_checkpointing_kwargs")
        args["activation_checkpointing"] = False  # all-or-nothing here: the hook checkpoints every n-th layer
    for k, v in args.items():
        name = k if k in fields else RENAMED.get(k)
        if name not in fields:
            import transformers
            raise ValueError(f"TrainingArguments of transformers {transformers.__version__} has no field {k!r}")
        out[name] = v
    return out


def fsdp_flag() -> bool:
    """Whether the installed TrainingArguments takes `fsdp=True` with everything in fsdp_config (5.x: a string or a
    list of FSDPOption is deprecated there and warns); older versions name the sharding strategy as a string."""
    from transformers import TrainingArguments
    return hasattr(TrainingArguments, "_apply_legacy_fsdp_to_config")


def _fsdp_for_installed(args: dict) -> dict:
    """`fsdp` as the installed transformers wants it: True with the strategy in fsdp_config (reshard_after_forward:
    full_shard True, shard_grad_op False; offload: cpu_offload), or the strategy string for a version without that."""
    fsdp, cfg = args["fsdp"], dict(args.get("fsdp_config") or {})
    if not fsdp:
        return args
    if fsdp_flag():
        if fsdp is True:
            return args
        for item in (fsdp.split() if isinstance(fsdp, str) else list(fsdp)):
            if item in ("full_shard", "shard_grad_op"):
                cfg.setdefault("reshard_after_forward", item == "full_shard")
            elif item == "offload":
                cfg.setdefault("cpu_offload", True)
            elif item != "auto_wrap":
                return args  # a strategy only the old spelling has (FSDP1's hybrid_shard, ...): left as written
        return {**args, "fsdp": True, "fsdp_config": cfg}
    if fsdp is not True:
        return args
    items = ["full_shard" if cfg.get("reshard_after_forward", True) else "shard_grad_op"]
    return {**args, "fsdp": " ".join(items + (["offload"] if cfg.get("cpu_offload") else []))}


def read_arguments(export: str) -> dict:
    """The export's training_args.json as keyword arguments of the installed transformers' TrainingArguments: spelled
    for it (for_installed; trainscout.json names the version it was written for) and with the paths it holds made
    absolute against the export folder (written relative, so the folder can move). Every field as written otherwise."""
    with open(os.path.join(export, "training_args.json"), encoding="utf-8") as f:
        args = json.load(f)
    for name in PATH_FIELDS:
        path = args.get(name)
        if isinstance(path, str) and not os.path.isabs(path) and os.path.exists(os.path.join(export, path)):
            args[name] = os.path.abspath(os.path.join(export, path))
    return for_installed(args)


def training_arguments(export: str, **overrides):
    """transformers.TrainingArguments from the export's training_args.json, for the installed version (read_arguments:
    renamed fields, fsdp's spelling, paths relative to the folder), with the hook's fields off (hook_owned)
    and your overrides (output_dir, max_steps, ...) on top."""
    from transformers import TrainingArguments
    args = read_arguments(export)
    args.update(for_installed(hook_owned(export)))
    args.update(for_installed(overrides))
    return TrainingArguments(**args)
