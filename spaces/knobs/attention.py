import sys

from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Runtime
from ..model_config import model_attentions, model_class_name

_noted: set[str] = set()


def _attentions(ctx) -> frozenset | None:
    """The attention values the context's model implements (None: not known here,
    spaces.model_config.model_attentions)."""
    if not ctx.model_config or "model_type" not in ctx.model_config:
        return None
    return model_attentions(ctx.model_config)


@register
class Attention(Knob):
    """Attention kernel: eager (plain matmuls), sdpa (PyTorch scaled_dot_product_attention), flash (flash-attn 2)."""

    name = "attention"
    default = "sdpa"
    choices = ("eager", "sdpa", "flash")
    runtime = Runtime(packages=("flash_attn",))

    def default_for(self, ctx):
        # a model whose transformers class has no SDPA attention (BLOOM, Gemma-2, Mamba) trains with eager by default,
        # and is told so once; attention=sdpa set on it is refused (check)
        has = _attentions(ctx)
        if has is None or self.default in has:
            return self.default
        name = model_class_name(ctx.model_config)
        if name not in _noted:
            _noted.add(name)
            print(f"trainscout: note: {name} has no {self.default} attention in this transformers: attention=eager "
                  f"(the model has {'|'.join(sorted(has))})", file=sys.stderr, flush=True)
        return "eager"

    def check(self, value, cfg, ctx):
        has = _attentions(ctx)
        if has is not None and value not in has:
            raise ConfigError(self.name, f"attention={value}: {model_class_name(ctx.model_config)} has no {value} "
                                         f"attention in this transformers: set attention={'|'.join(sorted(has))}")
        if value == "flash" and (ctx.device != "cuda" or "flash_attn" not in ctx.installed):
            raise ConfigError(self.name, "attention=flash needs a CUDA GPU and the flash-attn package "
                                         "(pip install flash-attn): set attention=sdpa")
        if value == "flash" and cfg["precision"] == "fp32":
            raise ConfigError(self.name, "attention=flash needs 16-bit activations: set precision=bf16-mixed or "
                                         "attention=sdpa")

    def apply(self, plan, value, cfg, ctx):
        plan.attn_implementation = {"flash": "flash_attention_2"}.get(value, value)
