"""FSDP2: fully_shard each decoder layer, then the root; gradients reduce-scattered on the last micro-batch. With
CPUOffloadPolicy (fsdp=full_shard_offload) the shards, their gradients and AdamW live on the host."""
from __future__ import annotations

import math

from trainscout.runtime import decoder_layers

from .base import autocast_dtype, causal_lm_loss, master_bytes, optimizer_bytes, register_engine
from .plain import TorchEngine


@register_engine
class FsdpEngine(TorchEngine):
    """PyTorch FSDP2 (fully_shard) per decoder layer and at the root."""

    name = "fsdp"
    launcher = "accelerate"
    portability = 1
    compute = "16-bit"  # MixedPrecisionPolicy(param_dtype): the layers run on 16-bit copies of the weights
    host_optimizer = "torch_adamw"  # CPUOffloadPolicy: torch's AdamW steps the fp32 shards on the host

    def __init__(self, model, plan, recipe, device, world, measured_accum=1, dims=None):
        import torch
        if not _offloads(plan):
            super().__init__(model, plan, recipe, device, world, measured_accum, dims)
            return
        # CPUOffloadPolicy: TorchEngine's build with the host as its device (model.to moves the model there; shard()
        # reads compute_device: fully_shard then moves one layer at a time to the GPU, shards it and keeps the shard
        # on the host) and the optimizer made for the host's parameters (optimizer_impl=auto is fused there: torch's
        # fused AdamW has a CPU kernel, 0.12 s a step over 25M parameters on 2 cores against foreach's 1.6 s)
        self.compute_device = device
        super().__init__(model, plan, recipe, torch.device("cpu"), world, measured_accum, dims)
        self.device_type = device.type
        if device.type == "cuda":
            # the worker builds the model on the GPU (builds_on_device) and it has left whole for the host: that
            # transient is the build's, not the training's (a model whose fp32 weights do not fit the GPU cannot be
            # built there: a limit of the worker, not of the offload)
            torch.cuda.reset_peak_memory_stats(device)

    def shard(self, model, plan, device, world):
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        dtype = autocast_dtype(plan.precision)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        reshard = plan.engine_config.get("reshard_after_forward", True)
        device = getattr(self, "compute_device", device)  # under offload the GPU (the model comes on the host)
        mesh = self.dims.gradient_mesh(device.type)  # data x context ranks (None: the whole world); TP shards stay
        extra = {}
        if _offloads(plan):
            from torch.distributed.fsdp import CPUOffloadPolicy
            extra["offload_policy"] = CPUOffloadPolicy(pin_memory=plan.engine_config["cpu_offload"]["pin_memory"])
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, **extra)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, **extra)
        self.plan = plan
        self.fsdp_model = model  # FSDP2's own mixed precision: no autocast, no scaler (fp16 is refused)
        return model

    def forward_backward(self, model, batch, scale: float, **loss_kwargs):
        loss = causal_lm_loss(model, batch, **loss_kwargs) * scale
        loss.backward()
        return loss

    def micro_step(self, batch, is_last: bool, scale: float):
        # under offload every micro-batch's gradients go to the host's shards: without the sync FSDP2 would keep every
        # layer's unsharded gradient on the GPU until the last micro-batch (2 bytes a parameter, all of them)
        self.fsdp_model.set_requires_gradient_sync(is_last or _offloads(self.plan))
        return self.step(self.model, batch, scale)

    def full_state_dict(self, names, rank):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.fsdp_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    @classmethod
    def model_states(cls, c, plan, N, D, mixed):
        if _offloads(plan):
            # on the GPU: the gathered 16-bit (fp32: 32-bit) copies of two layers and of what the root holds
            # (embedding, head, final norm: the root's parameters stay gathered from forward to backward); the
            # master weights, their gradients and AdamW's states are the host's (memory.host_peak). The unsharded
            # gradients of one layer or of the root, before they are reduce-scattered and copied to the host, are
            # made after the logits and the later layers' activations are freed: at the peak (the loss's backward)
            # none is there, and none is counted (an H100, Pythia-1B at 8 x 2048: 27.80 GiB measured, 27.92 analytic
            # without them, 28.88 with them)
            w = 2 if mixed else master_bytes(plan)
            root = max(0.0, N - c["L"] * c["per_layer"])
            return {"weights": w * (2 * c["per_layer"] + root), "gradients": 0.0, "optimizer": 0.0, "buffers": 0.0}
        # shards of the master weights, gradients and AdamW states (fp32: 4 bytes each); the gathered 16-bit copies
        # of two layers
        m = master_bytes(plan)
        return {"weights": m * N / D + (2 if mixed else 4) * 2 * c["per_layer"], "gradients": m * N / D,
                "optimizer": optimizer_bytes(plan) * N / D, "buffers": 0.0}

    @classmethod
    def host_states(cls, plan, D, pinned, rows):
        """CPUOffloadPolicy: each parameter's shard (its first dimension split over the D ranks, padded) and, after
        every micro-batch's reduce-scatter, its gradient, both in pinned host memory (torch's pinned allocator rounds
        each up to a power of two: Pythia-1B's 3.77 GiB of fp32 shards took 4.25); AdamW's states in plain host memory
        (optimizer_bytes a parameter, no rounding); and the largest shard's gradient once more, copied unpinned before
        it is added to the accumulated one (a step's later micro-batches). Measured on an H100 (Pythia-1B, fresh
        process, bench/savers_probe_gpu.py fsdp): 8.52 GiB pinned, 17.93 GiB peak RSS in all."""
        if not _offloads(plan):
            return None
        m = master_bytes(plan)
        shards = [-(-r // D) * (n // max(r, 1)) * m for r, n in rows()]
        block = (lambda b: 1 << max(0, math.ceil(math.log2(b)))) if pinned else (lambda b: b)
        return 2 * sum(block(b) for b in shards if b) + optimizer_bytes(plan) * sum(shards) / m + max(shards, default=0)

    @classmethod
    def offloaded(cls, plan):
        return (True, True) if _offloads(plan) else (False, False)

    @classmethod
    def hf_args(cls, rec, paths):
        if _offloads(rec.plan):
            return {"fsdp": "full_shard offload",
                    "fsdp_config": {"version": 2, "reshard_after_forward": True, "cpu_offload": True}}
        reshard = rec.plan.engine_config.get("reshard_after_forward", True)
        return {"fsdp": "full_shard" if reshard else "shard_grad_op",
                "fsdp_config": {"version": 2, "reshard_after_forward": reshard}}  # transformers 5.x's key

    @classmethod
    def accelerate(cls, rec, paths):
        return {"distributed_type": "FSDP",
                "fsdp_config": {"fsdp_version": 2,
                                "fsdp_reshard_after_forward": rec.plan.engine_config.get("reshard_after_forward", True),
                                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                **({"fsdp_offload_params": True} if _offloads(rec.plan) else {})}}


def _offloads(plan) -> bool:
    """Whether the plan keeps FSDP2's shards on the host (fsdp=full_shard_offload: CPUOffloadPolicy)."""
    return "cpu_offload" in plan.engine_config
