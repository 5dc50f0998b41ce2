from ..errors import ConfigError
from ..knob import Knob, register


@register
class Fsdp(Knob):
    """PyTorch FSDP2 (fully_shard) per layer: shard_grad_op keeps parameters gathered after forward, full_shard frees them."""

    name = "fsdp"
    default = "off"
    choices = ("off", "shard_grad_op", "full_shard")
    requires = {"zero_stage": (0,)}  # one sharding engine per trial: FSDP or DeepSpeed
    # memory savers: the model states sharded over the ranks, the GPUs' memory instead of the host's (start points
    # and the atlas pick among the savers that fit by predicted step time, so these come before offload where the
    # ranks hold them)
    savers = ((45, {"fsdp": "shard_grad_op"}), (46, {"fsdp": "full_shard"}),
              (47, {"fsdp": "full_shard", "activation_checkpointing": "full"}))
    column = 3

    def check(self, value, cfg, ctx):
        if value != "off" and cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"fsdp={value} with precision=fp16-mixed is not supported "
                                         "(FSDP2 has no sharded loss scaler here): set precision=bf16-mixed or fsdp=off")

    def numerics(self, value, cfg, ctx):
        if value != "off" and cfg.get("precision") != "fp32":  # MixedPrecisionPolicy(param_dtype): no autocast
            return "FSDP2 computes on 16-bit copies of the weights without autocast (norms and softmax in 16 bits)"
        return None

    def apply(self, plan, value, cfg, ctx):
        if value != "off":
            plan.engine = "fsdp"
            plan.engine_config["reshard_after_forward"] = value == "full_shard"
