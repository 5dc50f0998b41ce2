"""The runtime half of the knobs: apply a configuration's model transforms to a model, in one declared order.

A knob that changes how the model trains (checkpointing, compile, the loss kernel, FP8 linears, process-wide
kernel settings) declares its transform and its stage in its own file; `prepare_model` applies them. The trial
engines call it, and so can a training script of your own:

    from trainscout.runtime import plan_of, prepare_model
    plan = plan_of(json.load(open("out/trainscout.json")))    # the exported configuration
    model = prepare_model(model.to("cuda"), plan)              # before DDP / FSDP wraps it
    model = prepare_model(model, plan, after_sharding=True)    # whole-model compile, where the plan asks for it

The order is torchtitan's `parallelize` order: process-wide settings first; then module swaps (FP8 linears, so
that everything after sees the final modules); tensor and context parallel (each handed the trial's ParallelDims,
spaces/parallel.py, and so its DeviceMesh); the loss; activation checkpointing wraps layers; per-layer compile
"after AC wrapping and before FSDP"; then the engine shards the model over the data ranks; then the whole model may
be compiled. `dims` defaults to the plan's on the initialised process group's ranks (one rank without one).
Importing this module imports no torch.
"""
from __future__ import annotations

from trainscout.spaces import Knob, ParallelDims, Plan, all_knobs, plugins
from trainscout.spaces.knob import STAGES, in_order  # stage -> what runs there, in this order
from trainscout.spaces.layers import decoder_layers
from trainscout.spaces.roles import Runtime

BEFORE_SHARDING = STAGES[:-1]

__all__ = ["BEFORE_SHARDING", "STAGES", "ParallelDims", "decoder_layers", "parallel_dims", "plan_of", "prepare_model",
           "transforms", "wrap_step"]


def transforms(stages=STAGES) -> list[Knob]:
    """The knobs with a model transform at one of these stages, in the order they are applied: by stage, then by
    each knob's declared `order` within its stage (experts' kernel before fp8 swaps the linears), never by name."""
    out = [k for k in all_knobs() if k.runtime.stage is not None]
    for k in out:
        if k.runtime.stage not in STAGES:
            raise ValueError(f"knob {k.name!r} declares stage {k.runtime.stage!r}: use one of {', '.join(STAGES)}")
    return in_order(k for k in out if k.runtime.stage in stages)


def parallel_dims(plan: Plan, world: int | None = None) -> ParallelDims:
    """The plan's parallel dimensions on `world` ranks (None: the initialised process group's, else one)."""
    if world is None:
        import torch.distributed as dist
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return ParallelDims.of(plan, world)


def prepare_model(model, plan: Plan, *, after_sharding: bool = False, dims: ParallelDims | None = None):
    """Apply the plan's model transforms: those before sharding (default), or the one after it. Returns the model
    to train (the same object unless a transform wraps it). Transforms that take `dims` get the trial's."""
    for knob in transforms(("sharded",) if after_sharding else BEFORE_SHARDING):
        if dims is None and plugins.takes_dims(knob):
            dims = parallel_dims(plan)
        model = plugins.transform(knob, model, plan, dims)  # a plugin's failure names the plugin
    return model


def wrap_step(step, plan: Plan, dims: ParallelDims):
    """One micro-batch's forward and backward, `step(model, batch, scale, **loss_kwargs) -> loss`, as the knobs run
    it (their Runtime.wrap_step, in the transforms' order: the first one's wrapper outermost)."""
    wrappers = [k for k in all_knobs() if type(k.runtime).wrap_step is not Runtime.wrap_step]
    for knob in reversed(in_order(wrappers)):
        step = knob.runtime.wrap_step(step, plan, dims)
    return step


def plan_of(exported: dict, *, world_size: int | None = None, device: str = "cuda") -> Plan:
    """The plan of an exported configuration (trainscout.json: model config, knob config, recipe, hardware)."""
    from trainscout.spaces import Context, resolve
    from trainscout.spaces.model_config import sizes
    mc = exported.get("model_config") or {}
    recipe, hw = exported.get("recipe") or {}, exported.get("hardware") or {}
    ctx = Context(world_size=world_size or hw.get("world_size") or 1, device=device,
                  num_layers=sizes(mc).layers if mc else 1, global_batch=int(recipe.get("global_batch", 1)),
                  installed=installed_packages(), capability=hw.get("capability", ""), model_config=mc)
    return resolve(exported["config"], ctx)[1]


def installed_packages() -> frozenset:
    """The optional packages knobs name (their Runtime.packages) that are importable here."""
    import importlib.util
    names = {p for k in all_knobs() for p in k.runtime.packages}
    return frozenset(p for p in names if importlib.util.find_spec(p) is not None)
