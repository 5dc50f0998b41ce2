from ..errors import ConfigError
from ..knob import Knob, register


@register
class Precision(Knob):
    """Numeric precision: fp32, or mixed precision with bf16 / fp16 compute and fp32 master weights."""

    name = "precision"
    default = "bf16-mixed"
    choices = ("fp32", "bf16-mixed", "fp16-mixed")
    column = 6

    def check(self, value, cfg, ctx):
        if value == "fp16-mixed" and ctx.device != "cuda":
            raise ConfigError(self.name, "precision=fp16-mixed needs a CUDA GPU (no fp16 loss scaling on the CPU): "
                                         "set precision=bf16-mixed or fp32")

    def numerics(self, value, cfg, ctx):
        if value != self.default:  # the reference: bf16 autocast over fp32 weights, what most recipes train in
            return {"fp32": "fp32 products and activations", "fp16-mixed": "fp16 autocast with loss scaling"}[value]
        return None

    def apply(self, plan, value, cfg, ctx):
        plan.precision = value

    def export(self, fmt, plan, device):
        if fmt == "hf":
            return {"bf16": plan.precision == "bf16-mixed", "fp16": plan.precision == "fp16-mixed"}
        if fmt == "accelerate":
            return {"mixed_precision": {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(plan.precision, "no")}
        return {}
