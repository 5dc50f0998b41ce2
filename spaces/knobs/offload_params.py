from ..knob import Knob, register
from ..roles import Search


@register
class OffloadParams(Knob):
    """Keep ZeRO-3 parameter shards in CPU memory and fetch them per layer."""

    name = "offload_params"
    default = False
    choices = (False, True)
    requires = {"zero_stage": (3,)}  # DeepSpeed: offload_param is "Valid only with stage 3"
    # the last memory saver: the parameters fetched from the CPU per layer, every step
    search = Search(savers=((60, {"zero_stage": 3, "offload_optimizer": True, "offload_params": True,
                                  "activation_checkpointing": "full"}),))

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.engine_config["offload_param"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}
