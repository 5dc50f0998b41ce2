from ..errors import ConfigError
from ..knob import Knob, register


@register
class Attention(Knob):
    """Attention kernel: eager (plain matmuls), sdpa (PyTorch scaled_dot_product_attention), flash (flash-attn 2)."""

    name = "attention"
    default = "sdpa"
    choices = ("eager", "sdpa", "flash")
    packages = ("flash_attn",)

    def check(self, value, cfg, ctx):
        if value == "flash" and (ctx.device != "cuda" or "flash_attn" not in ctx.installed):
            raise ConfigError(self.name, "attention=flash needs a CUDA GPU and the flash-attn package "
                                         "(pip install flash-attn): set attention=sdpa")
        if value == "flash" and cfg["precision"] == "fp32":
            raise ConfigError(self.name, "attention=flash needs 16-bit activations: set precision=bf16-mixed or attention=sdpa")

    def apply(self, plan, value, cfg, ctx):
        plan.attn_implementation = {"flash": "flash_attention_2"}.get(value, value)
