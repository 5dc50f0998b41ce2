from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Runtime
from ..model_config import sizes


class SdpaRuntime(Runtime):
    def transform(self, model, plan):
        """Leave only that scaled_dot_product_attention kernel enabled in this process (auto: all, PyTorch picks).
        Process-wide flags (the CPU dispatcher reads them too), so torch.compile traces the same choice; set every
        trial, as a reused process keeps the last trial's."""
        select_sdpa(plan.knobs.get(SdpaBackend.name, SdpaBackend.default))
        return model


@register
class SdpaBackend(Knob):
    """Which kernel attention=sdpa runs: auto (PyTorch picks: cuDNN on Hopper), flash, cudnn, efficient or math."""

    name = "sdpa_backend"
    default = "auto"
    choices = ("auto", "flash", "cudnn", "efficient", "math")
    requires = {"attention": ("sdpa",)}
    runtime = SdpaRuntime(stage="process")
    export = Export(without_hook="auto", hook_rank=4)
    # Why: attention's backward was the largest single kernel of the compiled step profiled (docs/knobs-why.md); the
    # other backends are the alternatives.

    def check(self, value, cfg, ctx):
        if value in ("cudnn", "efficient") and ctx.device != "cuda":
            raise ConfigError(self.name, f"sdpa_backend={value} runs on a CUDA GPU only: set sdpa_backend=flash, math "
                                         "or auto")
        if value in ("flash", "cudnn") and ctx.device == "cuda" and cfg["precision"] == "fp32":
            raise ConfigError(self.name, f"sdpa_backend={value} needs 16-bit activations on a GPU: set "
                                         "precision=bf16-mixed or sdpa_backend=efficient")
        if value == "efficient" and ctx.device == "cuda" and ctx.model_config and not (
                cfg["compile"] and cfg["compile_scope"] == "model"):
            _refuse_grouped_query(self.name, ctx.model_config)
        if value == "flash" and ctx.device == "cuda" and cfg["compile"] and cfg["compile_scope"] == "model":
            # measured on the H200: traced whole, the model hands SDPA a causal mask tensor, which flash cannot take
            raise ConfigError(self.name, "sdpa_backend=flash takes no mask tensor, and a model compiled whole passes "
                                         "one: set compile_scope=layers or sdpa_backend=auto")

    def apply(self, plan, value, cfg, ctx):
        if value != self.default:
            plan.knobs[self.name] = value


def _refuse_grouped_query(name: str, model_config: dict) -> None:
    """sdpa_backend=efficient on a grouped-query model, as transformers calls it. Measured on the H200 (torch 2.11,
    bench/sdpa_gqa_gpu.py): transformers calls SDPA with enable_gqa and no mask, which the memory-efficient kernel
    cannot run ("No available kernel"); flash, cuDNN and math can. A model compiled whole passes a mask, and
    transformers repeats the key/value heads itself there (the caller leaves that case out)."""
    z = sizes(model_config)
    if z.heads and z.kv_heads < z.heads:
        raise ConfigError(name, f"sdpa_backend=efficient cannot run grouped-query attention ({z.heads} query heads "
                                f"over {z.kv_heads} key/value heads, as transformers calls it): set "
                                "sdpa_backend=flash, cudnn or auto")


def select_sdpa(backend: str) -> None:
    """Enable only the given scaled_dot_product_attention backend in this process (auto: all of them, PyTorch
    picks), through torch.backends.cuda's process-wide flags."""
    import torch
    b = torch.backends.cuda
    for name, enable in (("flash", b.enable_flash_sdp), ("efficient", b.enable_mem_efficient_sdp),
                         ("cudnn", b.enable_cudnn_sdp), ("math", b.enable_math_sdp)):
        enable(backend in ("auto", name))
