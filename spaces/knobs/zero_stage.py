from ..knob import Knob, register


@register
class ZeroStage(Knob):
    """DeepSpeed ZeRO stage: partition optimizer states (1), + gradients (2), + parameters (3); 0 = off."""

    name = "zero_stage"
    default = 0
    choices = (0, 1, 2, 3)

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.engine = "deepspeed"
            plan.zero["stage"] = value
