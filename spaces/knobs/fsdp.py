from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Numerics, Search


class FsdpNumerics(Numerics):
    def why(self, value, cfg, ctx):
        if value != "off" and cfg.get("precision") != "fp32":  # MixedPrecisionPolicy(param_dtype): no autocast
            return "FSDP2 computes on 16-bit copies of the weights without autocast (norms and softmax in 16 bits)"
        return None


@register
class Fsdp(Knob):
    """PyTorch FSDP2 (fully_shard) per layer: shard_grad_op keeps parameters gathered after forward, full_shard frees them.

    full_shard_offload: full_shard with FSDP2's CPUOffloadPolicy: the fp32 parameter shards, their gradients and AdamW's
    states live in host memory and the optimizer steps there (works on one GPU); each layer's parameters cross PCIe
    for its forward and backward."""  # noqa: E501 - its first line is the description `trainscout knobs` prints (spaces.knob.description)

    name = "fsdp"
    default = "off"
    choices = ("off", "shard_grad_op", "full_shard", "full_shard_offload")
    requires = {"zero_stage": (0,)}  # one sharding engine per trial: FSDP or DeepSpeed
    # memory savers: the model states sharded over the ranks, the GPUs' memory instead of the host's (start points
    # and the atlas pick among the savers that fit by predicted step time, so these come before offload where the
    # ranks hold them)
    search = Search(savers=((45, {"fsdp": "shard_grad_op"}), (46, {"fsdp": "full_shard"}),
                            (47, {"fsdp": "full_shard", "activation_checkpointing": "full"}),
                            # the model states on the host, as ZeRO-3 with both offloads (rank 60) but without DeepSpeed
                            (55, {"fsdp": "full_shard_offload"}),
                            (56, {"fsdp": "full_shard_offload", "activation_checkpointing": "full"})),
                    column=3)
    numerics = FsdpNumerics()

    def check(self, value, cfg, ctx):
        if value != "off" and cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"fsdp={value} with precision=fp16-mixed is not supported "
                                         "(FSDP2 has no sharded loss scaler here): set precision=bf16-mixed or "
                                         "fsdp=off")

    def apply(self, plan, value, cfg, ctx):
        if value != "off":
            plan.engine = "fsdp"
            plan.engine_config["reshard_after_forward"] = value != "shard_grad_op"
            if value == "full_shard_offload":
                plan.engine_config["cpu_offload"] = {"pin_memory": ctx.device == "cuda"}
