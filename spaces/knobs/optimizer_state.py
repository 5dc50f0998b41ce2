import functools
from dataclasses import replace

from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Numerics, Runtime, Search

# torchao.optim's AdamW for each value (8bit, 4bit: block-wise quantised codes with an fp32 scale per block and a
# lookup table; fp8: float8_e4m3fn codes with an fp32 scale per block; bf16: torchao's _AdamW with its states made
# bf16). Each steps one parameter at a time in a torch.compile'd kernel that computes in fp32. torchao quantises only
# a state of >= 4096 values that is a multiple of its block; smaller ones (norms, biases) stay in the weights' dtype.
CLASSES = {"8bit": "AdamW8bit", "4bit": "AdamW4bit", "fp8": "AdamWFp8", "bf16": "_AdamW"}
# bits per value of a state's codes: the rest of its bytes is the fp32 scale of each block
CODE_BITS = {"8bit": 8, "4bit": 4, "fp8": 8, "bf16": 16}
SMALL = 4096  # torchao's line (bitsandbytes'): smaller states are not quantised
# The optimizer step's measured median time in ms per value, against torch's fused fp32 AdamW's
# (optimizer_impl.FUSED_MS; the source: docs/knobs-why.md): torchao's per-parameter compiled step dequantises and
# requantises, slower than its fewer bytes. predictor/steptime.py counts the step at STEP_MS[value] / FUSED_MS times.
STEP_MS = {"bf16": 72.18, "8bit": 51.59, "4bit": 119.29, "fp8": 91.73}


class OptimizerStateRuntime(Runtime):
    def optimizer(self, spec, plan):
        value = plan.knobs.get(OptimizerState.name)
        if not value:
            return spec
        kw = spec.kwargs
        kwargs = {k: kw[k] for k in ("lr", "betas", "weight_decay", "eps") if k in kw}  # no foreach / fused
        kwargs["bf16_stochastic_round"] = kw.get("bf16_stochastic_round", False)  # precision=bf16's
        cls = state_class(value)
        from .optimizer_impl import FUSED_MS
        return replace(spec, cls=cls, kwargs=kwargs, states=value if value != "bf16" else "bfloat16",
                       bytes=2 * state_bytes(cls, value), step_cost=STEP_MS[value] / FUSED_MS)


class OptimizerStateNumerics(Numerics):
    def why(self, value, cfg, ctx):
        if value == "fp32":
            return None
        return f"AdamW states in {value} (torchao.optim, block-wise scaled)" if value != "bf16" else \
            "AdamW states in bf16 beside fp32 weights (torchao.optim)"


class OptimizerStateExport(Export):
    def fields(self, fmt, plan, device):
        value = plan.knobs.get(OptimizerState.name)
        if fmt == "hf" and value in ("8bit", "4bit"):  # TrainingArguments' torchao optimizers
            return {"optim": f"adamw_torch_{value}"}
        return {}

    def hook_only(self, name, value, plan, stock):
        # TrainingArguments names no torchao bf16 or fp8 AdamW: a stock Trainer runs fp32 states instead
        return f"{name}={value}" if value in ("bf16", "fp8") else None


@register
class OptimizerState(Knob):
    """AdamW's two states: fp32 (torch's AdamW; in the weights' dtype, so bf16 under precision=bf16), or bf16, 8bit,
    4bit, fp8 through torchao.optim (block-wise scaled states: fewer optimizer bytes per parameter, other numbers)."""

    name = "optimizer_state"
    default = "fp32"
    choices = ("fp32", "bf16", "8bit", "4bit", "fp8")
    # after optimizer_impl and precision (order 0): it replaces their AdamW, keeping bf16 stochastic rounding
    runtime = OptimizerStateRuntime(order=1, packages=("torchao",))
    numerics = OptimizerStateNumerics()
    search = Search(demo="fp32")  # the CPU demo: torchao's optimizers compile their step with inductor (a C++ compiler)
    export = OptimizerStateExport()
    # Why: AdamW's fp32 states are 8 of the 16 bytes per parameter plain training holds; torchao reports 8-bit AdamW
    # matching fp32's loss on Llama-2 fine-tuning and 4-bit within noise (torchao/optim README). Measured, not
    # assumed: the quality gate compares it with fp32 states; bench/optimizer_gpu.py its memory against the estimate.

    def check(self, value, cfg, ctx):
        if value == "fp32":
            return
        if "torchao" not in ctx.installed:
            raise ConfigError(self.name, f"optimizer_state={value} needs torchao (pip install torchao): install it or "
                                         "set optimizer_state=fp32")
        if cfg["offload_optimizer"]:
            raise ConfigError(self.name, f"optimizer_state={value}: offload_optimizer steps DeepSpeed's own CPU Adam "
                                         "over fp32 states, not a torch optimizer: set offload_optimizer=false or "
                                         "optimizer_state=fp32")
        if cfg["zero_stage"]:
            # DeepSpeed's ZeRO optimizer flattens the parameters into fp32 partitions and hands those to the client
            # optimizer; torchao quantises a state only where it is a whole number of blocks. Seen on 2 gloo ranks
            # (ZeRO 1, 2 and 3, tiny, torch 2.13, torchao 0.18, DeepSpeed 0.19.8): AdamW8bit kept every state in
            # fp32, and predictor.dtypes failed the trial (tests/test_optimizer_knobs.py pins it)
            raise ConfigError(self.name, f"optimizer_state={value} is built for the PyTorch engines (plain, DDP, "
                                         "FSDP2, pipeline): under DeepSpeed ZeRO torchao keeps fp32 states for its "
                                         "flat partitions: set zero_stage=0 or optimizer_state=fp32")
        if cfg["fsdp"] == "full_shard_offload":
            raise ConfigError(self.name, f"optimizer_state={value}: fsdp=full_shard_offload steps the host's shards "
                                         "with torch's fused AdamW; torchao's optimizer on offloaded DTensor shards is "
                                         "not checked here: set fsdp=full_shard or optimizer_state=fp32")
        if value != "bf16" and cfg["precision"] == "bf16" and cfg["fsdp"] != "off":
            # seen on 2 gloo ranks (torch 2.13, torchao 0.18): torchao's quantised states over bf16 DTensor shards
            # fail in its compiled step ("OptimState8bit dispatch: ... unimplemented ... aten.view.dtype")
            raise ConfigError(self.name, f"optimizer_state={value} under precision=bf16 and FSDP2: torchao 0.18's "
                                         "quantised states cannot step bf16 DTensor shards (aten.view.dtype is not "
                                         "implemented for them): set precision=bf16-mixed, fsdp=off or "
                                         "optimizer_state=fp32")
        if value == "bf16" and cfg["precision"] == "bf16":
            raise ConfigError(self.name, "optimizer_state=bf16: precision=bf16 keeps AdamW's states in the weights' "
                                         "bf16 already: leave optimizer_state=fp32 (the weights' dtype)")
        if value != "bf16" and cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"optimizer_state={value}: fp16 loss scaling unscales into torch's AdamW "
                                         "(GradScaler); torchao's optimizers are not checked with it: set "
                                         "precision=bf16-mixed or optimizer_state=fp32")

    def apply(self, plan, value, cfg, ctx):
        if value != "fp32":
            plan.knobs[self.name] = value
            # trial/quality.py's one step compares the forward and the gradients, which the states do not change
            plan.notes.append(f"optimizer_state={value}: the quality gate's one step compares outputs and gradients, "
                              "which optimizer states do not change: `trainscout verify --quality` trains it against "
                              "fp32 states")


@functools.cache
def state_class(value: str):
    """torchao.optim's AdamW class for a value (imported here: torchao's import takes seconds), its step compiled
    without AOTAutograd's persistent cache. Why: torchao's state subclasses have no _stable_hash_for_caching (torch
    warns), and with the suite's shared TORCHINDUCTOR_CACHE_DIR a 4-bit trial loaded a graph another configuration's
    states had cached and crashed ("wrong number of dimensions1 for op: input"; 2 gloo ranks, tiny, torch 2.13,
    torchao 0.18); with a fresh cache directory the same search ran. Inductor's own cache still serves the kernels."""
    import torch
    import torchao.optim
    base = getattr(torchao.optim, CLASSES[value])

    class Uncached(base):
        def step(self, closure=None):
            with torch._functorch.config.patch(enable_autograd_cache=False):
                return super().step(closure)

    Uncached.__name__ = Uncached.__qualname__ = base.__name__ if value != "bf16" else "AdamWBf16States"
    Uncached.__doc__ = base.__doc__ or f"torchao.optim.{base.__name__}"
    if value != "bf16":
        return Uncached

    class AdamWBf16States(Uncached):
        """torchao's _AdamW with both states kept in bf16 (its step computes in fp32 and rounds them back)."""

        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                     bf16_stochastic_round=False):
            super().__init__(params, lr, betas, eps, weight_decay, amsgrad,
                             bf16_stochastic_round=bf16_stochastic_round)
            self.block_size = 1  # _AdamW's infinite block keeps every state in the weights' dtype

        @staticmethod
        def _subclass_zeros(p, signed, block_size):
            return torch.zeros_like(p, dtype=torch.bfloat16)

    return AdamWBf16States


def state_bytes(cls, value: str) -> float:
    """Bytes per parameter of one state: its codes and its block's fp32 scale, at the class's own block size (read
    from its signature: 256 for 8bit and fp8, 128 for 4bit). States below SMALL values stay in the weights' dtype;
    the memory model counts every parameter as quantised (norms and biases are a negligible share of a model's)."""
    import inspect
    if value == "bf16":
        return 2.0
    block = inspect.signature(cls.__init__).parameters["block_size"].default
    return CODE_BITS[value] / 8 + 4 / block
