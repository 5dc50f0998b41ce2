from ..knob import Knob, register


@register
class Tf32(Knob):
    """Let fp32 matrix products use TF32 tensor cores (CUDA only; no effect on the CPU)."""

    name = "tf32"
    default = True
    choices = (False, True)

    def apply(self, plan, value, cfg, ctx):
        plan.tf32 = value
