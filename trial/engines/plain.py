"""Plain PyTorch on one rank, DistributedDataParallel on several; autocast for mixed precision."""
from __future__ import annotations

import contextlib

from trainscout.runtime import parallel_dims, prepare_model, wrap_step

from .base import (Engine, autocast_dtype, causal_lm_loss, clip_grad_norm_, master_bytes, optimizer, optimizer_bytes,
                   register_engine)


@register_engine
class TorchEngine(Engine):
    """Plain PyTorch on one rank, DDP on several."""

    name = "ddp"
    builds_on_device = True  # model.to(device) first thing (FSDP2 too: it shards a model on the device)

    def __init__(self, model, plan, recipe, device, world, measured_accum=1, dims=None):
        import torch
        self.dims = dims or parallel_dims(plan, world)
        model.to(device)
        prepare_model(model, plan, dims=self.dims)
        wrapped = self.shard(model, plan, device, world)
        self.model = prepare_model(wrapped, plan, after_sharding=True, dims=self.dims)
        self.step = wrap_step(self.forward_backward, plan, self.dims)  # as the knobs run a micro-batch
        self.params = [p for p in wrapped.parameters() if p.requires_grad]
        self.opt = optimizer(self.params, plan, recipe, device)  # every knob's optimizer hook applied
        self.dtype = autocast_dtype(plan.precision)
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if plan.precision == "fp16-mixed" else None
        self.clip = recipe["grad_clip"]

    def shard(self, model, plan, device, world):
        """The model as this engine distributes it: DDP over the ranks that hold the same weights (every rank
        without a mesh), as it is on one."""
        self.ddp = self.replicated = None
        if self.dims.replicas > 1:
            from torch.distributed.tensor import DTensor
            mesh = self.dims.gradient_mesh(device.type)  # None: the whole world, the default group
            if any(isinstance(p, DTensor) for p in model.parameters()):
                # a transform sharded the weights (tensor parallel): DDP takes no DTensors; FSDP2's replicate does
                # (gradients all-reduced over the data ranks, torchtitan's DDP + TP)
                from torch.distributed._composable.replicate_with_fsdp import replicate
                self.replicated = replicate(model, mesh=mesh if mesh is not None else self.dims.mesh(device.type)["dp"])
                return model
            from torch.nn.parallel import DistributedDataParallel
            model = self.ddp = DistributedDataParallel(model,
                                                       device_ids=[device.index] if device.type == "cuda" else None,
                                                       process_group=None if mesh is None else mesh.get_group())
        return model

    def forward_backward(self, model, batch, scale: float, **loss_kwargs):
        """One micro-batch's forward and backward under autocast; its loss times scale."""
        import torch
        with torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            loss = causal_lm_loss(model, batch, **loss_kwargs) * scale
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        return loss

    def micro_step(self, batch, is_last: bool, scale: float):
        if self.replicated is not None:
            self.replicated.set_requires_gradient_sync(is_last)
        sync = contextlib.nullcontext() if (self.ddp is None or is_last) else self.ddp.no_sync()
        with sync:
            return self.step(self.model, batch, scale)

    def optimizer_step(self):
        if self.scaler:
            self.scaler.unscale_(self.opt)
        if self.clip:
            clip_grad_norm_(self.params, self.clip)
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_state_dict(self, names, rank):
        return {names[id(p)]: p for p in self.params} if rank == 0 else {}  # rank 0 holds every parameter

    @classmethod
    def model_states(cls, c, plan, N, D, mixed):
        # master weights, gradients (fp32: 4 bytes each) and the optimizer's states (optimizer_bytes: AdamW's two in
        # the master dtype, or what optimizer_state keeps); autocast's bf16 copies of the linears (of a tied head
        # too), none over 16-bit weights (precision=bf16: no autocast); DDP's buckets (the gradients' dtype)
        m = master_bytes(plan)
        cast = 2 * c["cast"] * N / c["N"] if mixed and m == 4 else 0
        return {"weights": m * N + cast, "gradients": m * N,
                "optimizer": optimizer_bytes(plan) * N, "buffers": m * N if D > 1 else 0.0}
