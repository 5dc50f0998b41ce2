from ..errors import ConfigError
from ..knob import Knob, register
from ..model_config import sizes
from ..roles import Runtime


class ExpertsRuntime(Runtime):
    def transform(self, model, plan):
        if plan.knobs.get(Experts.name):
            model.set_experts_implementation(plan.knobs[Experts.name])
        for module in model.modules():
            if _is_experts(module):
                _compute_under_autocast(module)
        return model


@register
class Experts(Knob):
    """The mixture-of-experts kernel (transformers' experts_implementation): grouped_mm, one grouped GEMM per
    projection over every expert's tokens, or eager, a loop over the experts; auto: transformers' choice."""

    name = "experts"
    default = "auto"  # transformers 5.x: grouped_mm where its kernel can run, else eager
    auto = True
    choices = ("grouped_mm", "eager")
    runtime = ExpertsRuntime(stage="modules")  # before fp8 swaps modules and before checkpointing and compile wrap
    # Why: grouped_mm is several times faster than eager on a GPU; batched_mm gathers each token's expert weights, too
    # much memory to train (measured: docs/knobs-why.md). Whatever the kernel, the transform runs the experts in
    # autocast's dtype (_compute_under_autocast).

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().lower() == "batched_mm":
            raise ConfigError(self.name, "experts=batched_mm copies every token's expert weights (measured on the "
                                         "H200: 64 GiB asked for by a 4-layer, 32-expert model at 4,096 tokens): it "
                                         "is for decoding, not training: set experts=grouped_mm or eager")
        return super().parse(raw)

    def check(self, value, cfg, ctx):
        if value == "auto" or not ctx.model_config:
            return
        if not sizes(ctx.model_config).experts:
            raise ConfigError(self.name, f"experts={value}: the model has no mixture-of-experts layers: leave "
                                         "experts=auto")
        # imported only here: transformers' modeling_utils imports torchao (seconds, and its warnings on stderr), and
        # a search's space tries every value of this knob for a dense model too
        from transformers import PreTrainedModel
        if not hasattr(PreTrainedModel, "set_experts_implementation"):
            import transformers
            raise ConfigError(self.name, f"experts={value}: transformers {transformers.__version__} cannot set the "
                                         "experts kernel (5.x can): upgrade it or leave experts=auto")

    def apply(self, plan, value, cfg, ctx):
        if value != "auto":
            plan.knobs[self.name] = value


def _is_experts(module) -> bool:
    """transformers' fused experts module: its weights are 3-D parameters (experts x in x out)."""
    return type(module).__name__.endswith("Experts") and any(
        p.dim() == 3 for p in module.parameters(recurse=False))


def _compute_under_autocast(module) -> None:
    """Run the experts in the autocast dtype, as autocast runs nn.Linear. transformers' grouped_mm is not
    autocast-enabled: it casts its input to the weights' dtype, so over fp32 weights (plain mixed precision: no
    FSDP2 or DeepSpeed 16-bit compute) the experts ran in fp32, and compiled, in transformers' per-expert fallback
    (it takes bf16 weights only), several times slower (docs/knobs-why.md). Here each forward sees 16-bit copies of the
    expert weights (torch.func.functional_call: the gradients reach the fp32 parameters, the state dict keeps its
    keys); without autocast, or over 16-bit weights, it is the module's own forward."""
    import torch
    forward = module.forward

    def cast_forward(*args, **kwargs):
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if module.__dict__.get("_trainscout_inner") or x is None or not torch.is_autocast_enabled(x.device.type):
            return forward(*args, **kwargs)
        low = torch.get_autocast_dtype(x.device.type)
        params = {n: p.to(low) for n, p in module.named_parameters(recurse=False) if p.dtype == torch.float32}
        if not params:
            return forward(*args, **kwargs)
        module.__dict__["_trainscout_inner"] = True  # functional_call calls module(...): this forward again
        try:
            return torch.func.functional_call(module, params, args, kwargs, strict=False)
        finally:
            module.__dict__["_trainscout_inner"] = False

    module.forward = cast_forward
