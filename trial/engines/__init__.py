"""Engines: how one rank trains under a plan, one module each (plain/DDP, FSDP2, DeepSpeed ZeRO, pipeline), found
by name in a registry. Importing the package imports no torch (the memory model and the exports read the engines'
class-level terms)."""
from __future__ import annotations

from . import deepspeed, fsdp, pipeline, plain  # noqa: F401 - each registers its engine
from .base import LAUNCHERS, REGISTRY, Engine, adamw, get, register_engine

__all__ = ["LAUNCHERS", "REGISTRY", "Engine", "adamw", "build", "get", "register_engine", "save"]


def build(plan, model, recipe: dict, device, world: int, measured_accum: int) -> Engine:
    """The plan's engine, built around the model: the knobs' transforms applied, sharded, ready to step. The
    parallel dimensions (and their DeviceMesh) are made here, once, and handed to the engine and the transforms."""
    from trainscout.spaces import ParallelDims
    return get(plan.engine)(model, plan, recipe, device, world, measured_accum, dims=ParallelDims.of(plan, world))


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def save(engine: Engine, model, names: dict, out_dir: str, rank: int, dtype: str | None = None) -> None:
    """The trained weights as a transformers checkpoint (config.json + safetensors) in out_dir, written by rank 0
    from the engine's full state dict (sharded engines gather it with their own APIs), in the master weights' dtype
    unless dtype casts them (its config.json's "dtype" says which)."""
    import torch
    import torch.distributed as dist
    sd = engine.full_state_dict(names, rank)
    if rank == 0:
        cast = getattr(torch, dtype) if dtype else None
        sd = {_clean(k): (v.to(cast) if cast is not None and v.is_floating_point() else v).detach().cpu().contiguous()
              for k, v in sd.items()}
        weights = [v.dtype for v in sd.values() if v.is_floating_point()]  # save_pretrained empties sd
        model.save_pretrained(out_dir, state_dict=sd, safe_serialization=True)
        if weights:  # transformers writes its module's dtype (DeepSpeed's bf16 copies): the file's is what it holds
            import json
            import os
            path = os.path.join(out_dir, "config.json")
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
            config["dtype"] = str(max(set(weights), key=weights.count)).replace("torch.", "")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2, sort_keys=True)
    dist.barrier()
