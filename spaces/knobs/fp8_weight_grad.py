from ..knob import Knob, register
from ..roles import Costs, Export, Numerics, Runtime
from .fp8 import HIGH, WEIGHT_GRAD


class Fp8WeightGradNumerics(Numerics):
    def why(self, value, cfg, ctx):
        return "the weight gradients' products in high precision (FP8 rowwise's others)" if value == HIGH else None


@register
class Fp8WeightGrad(Knob):
    """FP8 rowwise with each linear's weight-gradient product in high precision (torchao's rowwise_with_gw_hp)."""

    name = WEIGHT_GRAD
    default = "fp8"
    choices = ("fp8", HIGH)
    # torchao's recipe: rowwise scaling for the forward and input-gradient products, the weight gradient's product
    # from the unscaled inputs and output gradients; it exists for rowwise scaling only
    requires = {"fp8": ("rowwise",)}
    runtime = Runtime(packages=("torchao",))
    # on top of fp8's rowwise rate (no speed-up claimed), the casts it leaves out: rowwise casts the 16-bit input and
    # output gradient a second time along the other axis for the weight gradient's product (5 B x K and 5 B x N of
    # fp8's 10 B x (K + N)); this recipe feeds that product the 16-bit tensors as they are
    costs = Costs(linear_rate={HIGH: 1.0}, cast_bytes={HIGH: -5.0})
    numerics = Fp8WeightGradNumerics()
    export = Export(without_hook="fp8", hook_rank=6)

    def apply(self, plan, value, cfg, ctx):
        if value == HIGH:  # read by fp8's transform and memory (fp8.recipe)
            plan.knobs[self.name] = value
