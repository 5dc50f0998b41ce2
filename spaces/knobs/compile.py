from ..knob import Knob, register


@register
class Compile(Knob):
    """torch.compile the model (inductor); compile time is excluded from the timed steps but reported."""

    name = "compile"
    default = False
    choices = (False, True)

    def apply(self, plan, value, cfg, ctx):
        plan.compile = value
