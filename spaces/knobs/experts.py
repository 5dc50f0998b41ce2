from ..errors import ConfigError
from ..knob import Knob, register


@register
class Experts(Knob):
    """The mixture-of-experts kernel (transformers' experts_implementation): grouped_mm, one grouped GEMM per
    projection over every expert's tokens, or eager, a loop over the experts; auto: transformers' choice."""

    name = "experts"
    default = "auto"  # transformers 5.x: grouped_mm where its kernel can run, else eager
    choices = ("grouped_mm", "eager")
    stage = "modules"  # before fp8 swaps modules and before checkpointing and compile wrap the layers
    # Why: on the H200 (torch 2.11, transformers 5.17; bench/data/gpu-2026-12-02-s11/moe_probe_ABC.log) a 4-layer,
    # 32-expert qwen3_moe took 47 ms a step with grouped_mm and 159 ms eager (fp32 weights, bf16 autocast), 22 and
    # 129 ms with bf16 weights. batched_mm gathers each token's expert weights: it asked for 64 GiB on that small model.

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().lower() == "auto":
            return "auto"
        if isinstance(raw, str) and raw.strip().lower() == "batched_mm":
            raise ConfigError(self.name, "experts=batched_mm copies every token's expert weights (measured on the "
                                         "H200: 64 GiB asked for by a 4-layer, 32-expert model at 4,096 tokens): it "
                                         "is for decoding, not training: set experts=grouped_mm or eager")
        return super().parse(raw)

    def domain_text(self):
        return "auto|" + super().domain_text()

    def check(self, value, cfg, ctx):
        if value == "auto" or not ctx.model_config:
            return
        from transformers import PreTrainedModel

        from trainscout.trial.models import sizes
        if not sizes(ctx.model_config).experts:
            raise ConfigError(self.name, f"experts={value}: the model has no mixture-of-experts layers: leave "
                                         "experts=auto")
        if not hasattr(PreTrainedModel, "set_experts_implementation"):
            import transformers
            raise ConfigError(self.name, f"experts={value}: transformers {transformers.__version__} cannot set the "
                                         "experts kernel (5.x can): upgrade it or leave experts=auto")

    def apply(self, plan, value, cfg, ctx):
        if value != "auto":
            plan.extra[self.name] = value

    def transform(self, model, plan):
        if plan.extra.get(self.name):
            model.set_experts_implementation(plan.extra[self.name])
        return model
