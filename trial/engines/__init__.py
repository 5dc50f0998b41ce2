"""Engines: how one rank trains under a plan, one module each (plain/DDP, FSDP2, DeepSpeed ZeRO, pipeline), found
by name in a registry. Importing the package imports no torch (the memory model and the exports read the engines'
class-level terms)."""
from __future__ import annotations

from . import deepspeed, fsdp, pipeline, plain  # noqa: F401  (each registers its engine)
from .base import LAUNCHERS, REGISTRY, Engine, adamw, get, register_engine

__all__ = ["LAUNCHERS", "REGISTRY", "Engine", "adamw", "build", "get", "register_engine", "save"]


def build(plan, model, recipe: dict, device, world: int, measured_accum: int) -> Engine:
    """The plan's engine, built around the model: the knobs' transforms applied, sharded, ready to step. The
    parallel dimensions (and their DeviceMesh) are made here, once, and handed to the engine and the transforms."""
    from trainscout.spaces import ParallelDims
    return get(plan.engine)(model, plan, recipe, device, world, measured_accum, dims=ParallelDims.of(plan, world))


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def save(engine: Engine, model, names: dict, out_dir: str, rank: int) -> None:
    """The trained weights as a transformers checkpoint (config.json + safetensors) in out_dir, written by rank 0
    from the engine's full state dict (sharded engines gather it with their own APIs)."""
    import torch.distributed as dist
    sd = engine.full_state_dict(names, rank)
    if rank == 0:
        sd = {_clean(k): v.detach().cpu().contiguous() for k, v in sd.items()}
        model.save_pretrained(out_dir, state_dict=sd, safe_serialization=True)
    dist.barrier()
