from ..knob import Knob, register
from ..roles import Search


@register
class OffloadOptimizer(Knob):
    """Keep optimizer states in CPU memory and step them with DeepSpeedCPUAdam (ZeRO-Offload)."""

    name = "offload_optimizer"
    default = False
    choices = (False, True)
    requires = {"zero_stage": (1, 2, 3)}  # DeepSpeed: "Valid for ZeRO stage 1, 2, 3"
    # a memory saver past checkpointing every layer: the optimizer states and their step on the CPU
    search = Search(savers=((50, {"zero_stage": 2, "offload_optimizer": True, "activation_checkpointing": "full"}),))

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.engine_config["offload_optimizer"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}
