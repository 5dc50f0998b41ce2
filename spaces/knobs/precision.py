import sys

from ..errors import ConfigError
from ..knob import Knob, register
from ..model_config import asked_dtype

_said: set = set()


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
        # this knob owns the dtypes: fp32 master weights, gradients and AdamW states under every value, whatever
        # the model's config.json says (the model is built in plan.master_dtype; trial.dtypes checks what ran)
        plan.master_dtype = "float32"
        asked = asked_dtype(ctx.model_config or {})
        if asked and (asked, value) not in _said:
            _said.add((asked, value))
            print(f"trainscout: note: the model's config.json asks for {asked} weights; precision={value} keeps "
                  f"{plan.master_dtype} master weights (the config's torch_dtype does not change what trains)",
                  file=sys.stderr, flush=True)

    def export(self, fmt, plan, device):
        if fmt == "hf":
            return {"bf16": plan.precision == "bf16-mixed", "fp16": plan.precision == "fp16-mixed"}
        if fmt == "accelerate":
            return {"mixed_precision": {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(plan.precision, "no")}
        return {}
