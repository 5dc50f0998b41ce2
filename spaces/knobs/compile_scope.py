from ..errors import ConfigError
from ..knob import Knob, register


@register
class CompileScope(Knob):
    """What torch.compile wraps: the whole model, or each decoder layer on its own (torchtitan's way)."""

    name = "compile_scope"
    default = "model"
    choices = ("model", "layers")
    requires = {"compile": (True,)}
    # Why: transformers builds the causal mask inside the model's forward. Traced by torch.compile it is
    # materialised (transformers skips it only outside tracing, before torch 2.14), so SDPA gets a mask tensor
    # instead of is_causal. Compiling the layers leaves the mask-building eager; one layer graph serves them all.

    def check(self, value, cfg, ctx):
        if value == "layers" and cfg["zero_stage"]:
            raise ConfigError(self.name, "compile_scope=layers is built for the PyTorch engines (plain, DDP, FSDP2): "
                                         "set compile_scope=model or zero_stage=0")

    def apply(self, plan, value, cfg, ctx):
        plan.compile_scope = value
