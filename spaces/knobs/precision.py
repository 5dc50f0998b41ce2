import sys
from dataclasses import replace

from ..errors import ConfigError
from ..knob import Knob, register
from ..model_config import asked_dtype
from ..roles import Export, Numerics, Runtime, Search
from .optimizer_impl import FUSED_MS

BF16_STEP_MS = 36.83  # torchao's _AdamW step over bf16 weights, measured ms (docs/constants.csv)

_said: set = set()


class PrecisionRuntime(Runtime):
    def optimizer(self, spec, plan):
        if plan.precision != "bf16":
            return spec
        import torchao.optim
        kw = spec.kwargs  # torchao's AdamW over the bf16 weights: fp32 math, the result rounded stochastically
        kwargs = {k: kw[k] for k in ("lr", "betas", "weight_decay", "eps") if k in kw}
        # its step's measured cost against fused fp32 AdamW's (BF16_STEP_MS): predictor/steptime.py's optimizer term
        return replace(spec, cls=torchao.optim._AdamW, kwargs=dict(kwargs, bf16_stochastic_round=True),
                       step_cost=BF16_STEP_MS / FUSED_MS)


class PrecisionNumerics(Numerics):
    def why(self, value, cfg, ctx):
        if value != Precision.default:  # the reference: bf16 autocast over fp32 weights, what most recipes train in
            return {"fp32": "fp32 products and activations", "fp16-mixed": "fp16 autocast with loss scaling",
                    "bf16": "bf16 weights, gradients and AdamW states (stochastic rounding), no fp32 master"}[value]
        return None


class PrecisionExport(Export):
    def hook_only(self, name, value, plan, stock):
        # a stock Trainer over the exported bf16 model steps torch's AdamW, without stochastic rounding
        return "precision=bf16" if value == "bf16" else None

    def fields(self, fmt, plan, device):
        if fmt == "hf":
            return {"bf16": plan.precision == "bf16-mixed", "fp16": plan.precision == "fp16-mixed"}
        if fmt == "accelerate":
            return {"mixed_precision": {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(plan.precision, "no")}
        return {}


@register
class Precision(Knob):
    """Numeric precision: fp32, mixed precision with bf16 / fp16 compute and fp32 master weights, or bf16: pure
    16-bit bf16 weights, gradients and AdamW states (torchao's AdamW with stochastic rounding, no autocast)."""

    name = "precision"
    default = "bf16-mixed"
    choices = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
    runtime = PrecisionRuntime(packages=("torchao",))  # precision=bf16's optimizer
    numerics = PrecisionNumerics()
    # a memory saver of last resort: pure bf16 weights, gradients and states (8 bytes a parameter instead of 16)
    # lower what the optimizer keeps, so a start point or lookup takes it only where no saver keeping fp32 fits (a 7B
    # on one GPU: docs/knobs-why.md); the quality gate then compares it. The CPU demo: bf16-mixed (bf16's torchao
    # optimizer compiles its step with inductor, a C++ compiler)
    search = Search(savers=((90, {"precision": "bf16"}),
                            (91, {"precision": "bf16", "activation_checkpointing": "full"})),
                    column=6, demo="bf16-mixed")
    export = PrecisionExport()
    # Why bf16 with stochastic rounding: pure bf16 weights under torch's AdamW lose updates smaller than a bf16 ulp
    # (measured: docs/knobs-why.md); rounding the fp32 result stochastically keeps them in expectation.

    def check(self, value, cfg, ctx):
        if value == "fp16-mixed" and ctx.device != "cuda":
            raise ConfigError(self.name, "precision=fp16-mixed needs a CUDA GPU (no fp16 loss scaling on the CPU): "
                                         "set precision=bf16-mixed or fp32")
        if value == "bf16":
            if "torchao" not in ctx.installed:
                raise ConfigError(self.name, "precision=bf16 steps torchao's AdamW with bf16 stochastic rounding (pip "
                                             "install torchao): install it or set precision=bf16-mixed")
            if ctx.device == "cpu" and cfg.get("compile"):  # inductor's C++ code for the bf16 model fails to build
                raise ConfigError(self.name, "precision=bf16 with compile=true on the CPU: inductor's C++ code for the "
                                             "pure bf16 model does not compile with this torch: set compile=false or "
                                             "precision=bf16-mixed")
            if cfg["zero_stage"]:
                raise ConfigError(self.name, "precision=bf16 (pure bf16 weights and states) is not DeepSpeed's bf16 "
                                             "mode, which keeps fp32 master weights: set precision=bf16-mixed or "
                                             "zero_stage=0")

    def apply(self, plan, value, cfg, ctx):
        plan.precision = value
        # this knob owns the dtypes: fp32 master weights, gradients and AdamW states under every mixed value and
        # fp32, bf16 ones under bf16, whatever the model's config.json says (the model is built in plan.master_dtype;
        # predictor.dtypes checks what ran; autocast_dtype has no bf16 entry: its engines run no autocast)
        plan.master_dtype = "bfloat16" if value == "bf16" else "float32"
        if value == "bf16":  # the gate's one step sees the bf16 weights' forward and gradients, not the rounded update
            plan.notes.append("precision=bf16: the quality gate's one step compares outputs and gradients over the "
                              "bf16 weights, not the stochastically rounded updates: `trainscout verify --quality` "
                              "trains it against bf16-mixed")
        asked = asked_dtype(ctx.model_config or {})
        if asked and asked != plan.master_dtype and (asked, value) not in _said:
            _said.add((asked, value))
            print(f"trainscout: note: the model's config.json asks for {asked} weights; precision={value} keeps "
                  f"{plan.master_dtype} master weights (the config's torch_dtype does not change what trains)",
                  file=sys.stderr, flush=True)
