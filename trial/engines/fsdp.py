"""FSDP2: fully_shard each decoder layer, then the root; gradients reduce-scattered on the last micro-batch."""
from __future__ import annotations

from trainscout.runtime import decoder_layers

from .base import autocast_dtype, causal_lm_loss, master_bytes, register_engine
from .plain import TorchEngine


@register_engine
class FsdpEngine(TorchEngine):
    """PyTorch FSDP2 (fully_shard) per decoder layer and at the root."""

    name = "fsdp"
    launcher = "accelerate"
    portability = 1
    compute = "16-bit"  # MixedPrecisionPolicy(param_dtype): the layers run on 16-bit copies of the weights

    def shard(self, model, plan, device, world):
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        dtype = autocast_dtype(plan.precision)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        reshard = plan.engine_config.get("reshard_after_forward", True)
        mesh = self.dims.gradient_mesh(device.type)  # data x context ranks (None: the whole world); TP shards stay
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        self.fsdp_model = model  # FSDP2's own mixed precision: no autocast, no scaler (fp16 is refused)
        return model

    def forward_backward(self, model, batch, scale: float, **loss_kwargs):
        loss = causal_lm_loss(model, batch, **loss_kwargs) * scale
        loss.backward()
        return loss

    def micro_step(self, batch, is_last: bool, scale: float):
        self.fsdp_model.set_requires_gradient_sync(is_last)
        return self.step(self.model, batch, scale)

    def full_state_dict(self, names, rank):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.fsdp_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    @classmethod
    def model_states(cls, c, plan, N, D, mixed):
        # shards of the master weights, gradients and AdamW states (fp32: 4 bytes each); the gathered 16-bit copies
        # of two layers
        m = master_bytes(plan)
        return {"weights": m * N / D + (2 if mixed else 4) * 2 * c["per_layer"], "gradients": m * N / D,
                "optimizer": 2 * m * N / D, "buffers": 0.0}

    @classmethod
    def hf_args(cls, rec, paths):
        reshard = rec.plan.engine_config.get("reshard_after_forward", True)
        return {"fsdp": "full_shard" if reshard else "shard_grad_op",
                "fsdp_config": {"version": 2, "reshard_after_forward": reshard}}  # transformers 5.x's key

    @classmethod
    def accelerate(cls, rec, paths):
        return {"distributed_type": "FSDP",
                "fsdp_config": {"fsdp_version": 2,
                                "fsdp_reshard_after_forward": rec.plan.engine_config.get("reshard_after_forward", True),
                                "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}
