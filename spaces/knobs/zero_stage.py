from ..knob import Knob, register
from ..roles import Numerics, Search


class ZeroNumerics(Numerics):
    def why(self, value, cfg, ctx):
        if value and cfg.get("precision") != "fp32":  # DeepSpeed's bf16/fp16 mode: a 16-bit model, fp32 masters
            return "DeepSpeed computes on its 16-bit model without autocast (norms and softmax in 16 bits)"
        return None


@register
class ZeroStage(Knob):
    """DeepSpeed ZeRO stage: partition optimizer states (1), + gradients (2), + parameters (3); 0 = off."""

    name = "zero_stage"
    default = 0
    choices = (0, 1, 2, 3)
    numerics = ZeroNumerics()
    search = Search(column=2, demo=0)  # the demo: no DeepSpeed C++ ops to build

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.engine = "deepspeed"
            plan.engine_config["stage"] = value
