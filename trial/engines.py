"""Engines: how one rank runs a micro-batch and an optimizer step under a plan.

Each engine exposes `micro_step(batch, is_last)` (forward + backward; the last micro-batch of an optimizer step
is the one that synchronises gradients) and `optimizer_step()` (clip, step, zero the gradients). Knob order
follows torchtitan: activation checkpointing wraps layers first, then per-layer compile, then sharding (FSDP2 /
DeepSpeed), then whole-model compile.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from trainscout.spaces import Plan

DTYPES = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16, "fp32": None}


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList holding the model's decoder layers (the classes transformers marks as not splittable)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(module[0]).__name__ in names:
            return module
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no ModuleList of {sorted(names)})")


def apply_activation_checkpointing(layers: nn.ModuleList, every: int) -> None:
    """Recompute every `every`-th layer in backward (1 = all layers), with PyTorch's non-reentrant checkpoint."""
    if not every:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    for i in range(0, len(layers), every):
        layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def select_sdpa(backend: str) -> None:
    """sdpa_backend: leave only that scaled_dot_product_attention kernel enabled in this process (auto: all, PyTorch
    picks). Process-wide flags (the CPU dispatcher reads them too), so torch.compile traces the same choice."""
    b = torch.backends.cuda
    for name, enable in (("flash", b.enable_flash_sdp), ("efficient", b.enable_mem_efficient_sdp),
                         ("cudnn", b.enable_cudnn_sdp), ("math", b.enable_math_sdp)):
        enable(backend in ("auto", name))


def compile_layers(layers: nn.ModuleList, plan: Plan) -> None:
    """compile_scope=layers: each decoder layer compiled on its own, after checkpointing and before sharding."""
    if plan.compile and plan.compile_scope == "layers":
        for i in range(len(layers)):
            layers[i] = torch.compile(layers[i])


def compiled(model, plan: Plan):
    """The whole model compiled (compile_scope=model), or the model itself."""
    return torch.compile(model) if plan.compile and plan.compile_scope == "model" else model


def loss_kernel(fn, plan: Plan):
    """A loss function as loss_kernel says: compiled on its own (upcast, shift, cross-entropy fused), or as is."""
    return torch.compile(fn) if plan.loss_kernel == "compiled" else fn


def before_sharding(model, plan: Plan, device: torch.device) -> nn.ModuleList:
    """The PyTorch engines' first steps: move, checkpoint, compile each layer and the loss; returns the layers."""
    model.to(device)
    layers = decoder_layers(model)
    apply_activation_checkpointing(layers, plan.checkpoint_every)
    compile_layers(layers, plan)
    model.loss_function = loss_kernel(model.loss_function, plan)
    return layers


def adamw(params, recipe: dict, device: torch.device) -> torch.optim.Optimizer:
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=recipe["lr"], betas=tuple(recipe["betas"]),
                             weight_decay=recipe["weight_decay"], fused=fused, foreach=None if fused else True)


def _loss(model, batch):
    return model(input_ids=batch, labels=batch).loss


class TorchEngine:
    """Plain PyTorch on one rank, DistributedDataParallel on several; autocast for mixed precision."""

    def __init__(self, model, plan: Plan, recipe: dict, device: torch.device, world: int):
        before_sharding(model, plan, device)
        self.ddp = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel
            model = self.ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model = compiled(model, plan)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = adamw(self.params, recipe, device)
        self.dtype = DTYPES[plan.precision]
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if plan.precision == "fp16-mixed" else None
        self.clip = recipe["grad_clip"]

    def micro_step(self, batch, is_last: bool, scale: float):
        sync = contextlib.nullcontext() if (self.ddp is None or is_last) else self.ddp.no_sync()
        with sync:
            with torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
                loss = _loss(self.model, batch) * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        return loss

    def optimizer_step(self):
        if self.scaler:
            self.scaler.unscale_(self.opt)
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class FsdpEngine(TorchEngine):
    """FSDP2: fully_shard each decoder layer, then the root; gradients reduce-scattered on the last micro-batch."""

    def __init__(self, model, plan: Plan, recipe: dict, device: torch.device, world: int):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        layers = before_sharding(model, plan, device)
        dtype = DTYPES[plan.precision]
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        reshard = plan.fsdp.get("reshard_after_forward", True)
        for layer in layers:
            fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        self.fsdp_model = model
        self.model = compiled(model, plan)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = adamw(self.params, recipe, device)
        self.scaler = None
        self.clip = recipe["grad_clip"]

    def micro_step(self, batch, is_last: bool, scale: float):
        self.fsdp_model.set_requires_gradient_sync(is_last)
        loss = _loss(self.model, batch) * scale
        loss.backward()
        return loss


class DeepSpeedEngine:
    """DeepSpeed ZeRO 1/2/3 with optional CPU offload; DeepSpeed's own mixed precision and accumulation."""

    def __init__(self, model, plan: Plan, recipe: dict, device: torch.device, world: int, measured_accum: int):
        import deepspeed
        apply_activation_checkpointing(decoder_layers(model), plan.checkpoint_every)
        model.loss_function = loss_kernel(model.loss_function, plan)
        self.config = deepspeed_config(plan, recipe, measured_accum)
        offload = "offload_optimizer" in plan.zero
        client_opt = None if offload else adamw([p for p in model.parameters() if p.requires_grad], recipe, device)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               optimizer=client_opt, config=self.config)
        if plan.compile:
            self.engine.compile()

    def micro_step(self, batch, is_last: bool, scale: float):
        loss = _loss(self.engine, batch)  # DeepSpeed divides by its accumulation count itself
        self.engine.backward(loss)
        if not is_last:
            self.engine.step()  # not a boundary: only advances DeepSpeed's micro-step counter
        return loss

    def optimizer_step(self):
        self.engine.step()


def deepspeed_config(plan: Plan, recipe: dict, grad_accum: int) -> dict:
    """The DeepSpeed JSON config of a plan (also what `trainscout export --format deepspeed` writes)."""
    cfg = {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": recipe["grad_clip"],
        "zero_optimization": dict(plan.zero),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if plan.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif plan.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if "offload_optimizer" in plan.zero:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": recipe["lr"], "betas": list(recipe["betas"]),
                                                        "weight_decay": recipe["weight_decay"]}}
    return cfg


def build(plan: Plan, model, recipe: dict, device: torch.device, world: int, measured_accum: int):
    if plan.engine == "deepspeed":
        return DeepSpeedEngine(model, plan, recipe, device, world, measured_accum)
    if plan.engine == "fsdp":
        return FsdpEngine(model, plan, recipe, device, world)
    if plan.engine == "pipeline":
        from .pipeline import PipelineEngine
        return PipelineEngine(model, plan, recipe, device, world)
    return TorchEngine(model, plan, recipe, device, world)


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def save(engine, model, names: dict, out_dir: str, rank: int) -> None:
    """The trained weights as a transformers checkpoint (config.json + safetensors) in out_dir, written by rank 0.
    Sharded engines gather first with their own APIs (FSDP2: get_model_state_dict; ZeRO-3: DeepSpeed's
    consolidated 16-bit state dict); pipeline ranks send their stages' parameters to rank 0."""
    import torch.distributed as dist
    if isinstance(engine, DeepSpeedEngine):
        ds = engine.engine
        sd = ds._zero3_consolidated_16bit_state_dict() if ds.zero_optimization_stage() == 3 else ds.module.state_dict()
    elif isinstance(engine, FsdpEngine):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        sd = get_model_state_dict(engine.fsdp_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    elif getattr(engine, "pp_group", None) is not None:  # pipeline ranks send their stages' parameters to rank 0
        parts = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object({names[id(p)]: p.detach().cpu() for p in engine.params}, parts, dst=0)
        sd = {k: v for part in (parts or []) for k, v in part.items()}
    else:  # plain and DDP: rank 0 holds every parameter
        sd = {names[id(p)]: p for p in engine.params} if rank == 0 else {}
    if rank == 0:
        sd = {_clean(k): v.detach().cpu().contiguous() for k, v in sd.items()}
        model.save_pretrained(out_dir, state_dict=sd, safe_serialization=True)
    dist.barrier()
