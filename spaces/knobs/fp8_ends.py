from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Numerics, Runtime
from .fp8 import ENDS, HIGH


class Fp8EndsNumerics(Numerics):
    def why(self, value, cfg, ctx):
        if value == HIGH:
            return "the first and last decoder layers' linears in high precision (the others FP8)"
        return None


@register
class Fp8Ends(Knob):
    """The first and last decoder layers' linears in FP8 like the rest, or in high precision (Megatron's bf16 ends).

    Megatron's --first-last-layers-bf16: the layers nearest the embedding and the head keep their products in the
    precision knob's precision; fp8's transform leaves their nn.Linear out of the conversion (fp8.module_filter)."""

    name = ENDS
    default = "fp8"
    choices = ("fp8", HIGH)
    requires = {"fp8": ("tensorwise", "rowwise")}
    runtime = Runtime(packages=("torchao",))
    numerics = Fp8EndsNumerics()
    export = Export(without_hook="fp8", hook_rank=7)

    def check(self, value, cfg, ctx):
        if value == HIGH and ctx.num_layers < 3:
            raise ConfigError(self.name, f"{self.name}={HIGH} leaves the first and last of the model's "
                                         f"{ctx.num_layers} decoder layers out of FP8, and no layer in it: set "
                                         f"{self.name}=fp8 or fp8=off")

    def apply(self, plan, value, cfg, ctx):
        if value == HIGH:  # read by fp8's transform (fp8.module_filter) and memory
            plan.knobs[self.name] = value
