"""Plain PyTorch on one rank, DistributedDataParallel on several; autocast for mixed precision."""
from __future__ import annotations

import contextlib

from trainscout.runtime import prepare_model

from .base import Engine, adamw, autocast_dtype, causal_lm_loss, register_engine


@register_engine
class TorchEngine(Engine):
    """Plain PyTorch on one rank, DDP on several."""

    name = "ddp"
    builds_on_device = True  # model.to(device) first thing (FSDP2 too: it shards a model on the device)

    def __init__(self, model, plan, recipe, device, world, measured_accum=1):
        import torch
        model.to(device)
        prepare_model(model, plan)
        wrapped = self.shard(model, plan, device, world)
        self.model = prepare_model(wrapped, plan, after_sharding=True)
        self.params = [p for p in wrapped.parameters() if p.requires_grad]
        self.opt = adamw(self.params, recipe, device)
        self.dtype = autocast_dtype(plan.precision)
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if plan.precision == "fp16-mixed" else None
        self.clip = recipe["grad_clip"]

    def shard(self, model, plan, device, world):
        """The model as this engine distributes it: DDP on several ranks, as it is on one."""
        self.ddp = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel
            model = self.ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return model

    def micro_step(self, batch, is_last: bool, scale: float):
        import torch
        sync = contextlib.nullcontext() if (self.ddp is None or is_last) else self.ddp.no_sync()
        with sync:
            with torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
                loss = causal_lm_loss(self.model, batch) * scale
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        return loss

    def optimizer_step(self):
        import torch
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

    def full_state_dict(self, names, rank):
        return {names[id(p)]: p for p in self.params} if rank == 0 else {}  # rank 0 holds every parameter

    @classmethod
    def model_states(cls, c, plan, N, D, mixed):
        # fp32 weights, gradients and AdamW states; autocast's bf16 copies of the linears (of a tied head too); DDP's
        # buckets
        return {"weights": 4 * N + (2 * c["cast"] * N / c["N"] if mixed else 0), "gradients": 4 * N, "optimizer": 8 * N,
                "buffers": 4 * N if D > 1 else 0.0}
