from ..errors import ConfigError
from ..knob import Knob, register


@register
class Fsdp(Knob):
    """PyTorch FSDP2 (fully_shard) per layer: shard_grad_op keeps parameters gathered after forward, full_shard frees them."""

    name = "fsdp"
    default = "off"
    choices = ("off", "shard_grad_op", "full_shard")
    requires = {"zero_stage": (0,)}  # one sharding engine per trial: FSDP or DeepSpeed

    def check(self, value, cfg, ctx):
        if value != "off" and cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"fsdp={value} with precision=fp16-mixed is not supported "
                                         "(FSDP2 has no sharded loss scaler here): set precision=bf16-mixed or fsdp=off")

    def apply(self, plan, value, cfg, ctx):
        if value != "off":
            plan.engine = "fsdp"
            plan.fsdp["reshard_after_forward"] = value == "full_shard"
