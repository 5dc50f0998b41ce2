from ..errors import ConfigError
from ..knob import Knob, register
from ..model_config import sizes
from ..roles import Costs, Export, Numerics, Runtime, Search

# the plan entries of the knobs that choose among the field's FP8 recipes (spaces/knobs/fp8_weight_grad.py,
# fp8_ends.py), read here where the conversion is made; GW_HP: torchao's Float8LinearRecipeName.ROWWISE_WITH_GW_HP
WEIGHT_GRAD, ENDS, HIGH, GW_HP = "fp8_weight_grad", "fp8_ends", "high", "rowwise_with_gw_hp"

# the share of the decoder layers' saved activations FP8 linears leave out (they save their inputs in 8 bits, and
# inductor's partitioner keeps the casts); measured: docs/knobs-why.md
SAVED_CUT = 0.36


class Fp8Runtime(Runtime):
    def transform(self, model, plan):
        if not plan.knobs.get(Fp8.name):
            return model
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        config = Float8LinearConfig.from_recipe_name(recipe(plan))
        convert_to_float8_training(model, config=config, module_filter_fn=module_filter(model, plan))
        return model


class Fp8Costs(Costs):
    def memory(self, terms, plan, spec):
        # the weights' casts: torchao casts the fp32 (or FSDP2's bf16) weights to FP8 inside each linear, one layer
        # at a time, in place of autocast's 16-bit copies, which the engine's model states already count: no term
        if plan.knobs.get(Fp8.name) and recipe(plan) != GW_HP:  # gw_hp's weight gradient reads the 16-bit input
            share = 1.0
            if plan.knobs.get(ENDS) == HIGH:  # the layers left out of FP8 keep their 16-bit inputs
                layers = sizes(spec.model_config).layers if getattr(spec, "model_config", None) else 0
                share = max(layers - 2, 0) / layers if layers else 1.0
            cut = SAVED_CUT * share * terms.layer_activations
            terms.layer_activations -= cut
            terms.activations -= cut


class Fp8Numerics(Numerics):
    def why(self, value, cfg, ctx):
        return None if value == "off" else f"FP8 ({value} scaling) matrix products in the decoder's linears"


@register
class Fp8(Knob):
    """FP8 matrix products in the decoder's linear layers (torchao.float8; Ada/Hopper or newer): tensorwise or
    rowwise scaling; weights, optimizer states and everything else stay as the precision knob says."""

    name = "fp8"
    default = "off"
    choices = ("off", "tensorwise", "rowwise")
    requires = {"zero_stage": (0,)}  # DeepSpeed holds and casts the parameters itself: FP8 is for the PyTorch engines
    # swap nn.Linear before checkpointing wraps and compile traces the layers (torchtitan's order); after experts
    # (order 0) in that stage: float8 swaps the linears of the modules experts leaves
    runtime = Fp8Runtime(stage="modules", order=1, packages=("torchao",))
    # a start point on top of the compiled one (its check refuses GPUs without FP8; measured: docs/knobs-why.md)
    search = Search(start=(2, "tensorwise"))
    export = Export(without_hook="off", hook_rank=5)
    numerics = Fp8Numerics()
    costs = Fp8Costs(
        # the decoder linears' products on FP8 tensor cores, at twice the dense bf16 peak on every GPU its check
        # admits (the datasheets: docs/knobs-why.md); predictor/steptime.py's roofline counts a dense model's decoder
        # linears at this rate, the head and attention at bf16's. Rowwise: no speed-up claimed (measured slower:
        # docs/knobs-why.md)
        linear_rate={"tensorwise": 2.0, "rowwise": 1.0},
        # ...and the casts that feed them move bytes at the GPU's memory bandwidth, per token and per element of each
        # converted linear's input (K) and output (N) widths: tensorwise reads a 16-bit input twice (its amax, its
        # cast) and writes it in 8 bits forward (5 B x K), the output's gradient likewise backward (5 B x N), and the
        # weight gradient's product reads both transposed in 8 bits (1 B read + 1 B written, x K and x N):
        # 7 B x (K + N); rowwise scales along each axis in turn, so the backward casts both 16-bit tensors again along
        # the other one (+5 B x N, +5 B x K, less the transposes): 10 B x (K + N). The weights' casts (once a
        # micro-batch) are left out.
        cast_bytes={"tensorwise": 7.0, "rowwise": 10.0})
    # the gain needs large matmuls and compile (which fuses the scaling ops), so it is measured, not assumed

    def check(self, value, cfg, ctx):
        if value == "off":
            return
        major, _, minor = ctx.capability.partition(".")
        if ctx.device != "cuda" or (int(major or 0), int(minor or 0)) < (8, 9):
            raise ConfigError(self.name, f"fp8={value} needs a GPU with FP8 tensor cores (compute capability 8.9 or "
                                         f"newer: Ada, Hopper, Blackwell; this is {ctx.capability or ctx.device}): "
                                         "set fp8=off")
        if "torchao" not in ctx.installed:
            raise ConfigError(self.name, f"fp8={value} needs torchao (pip install torchao): install it or set fp8=off")
        if cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"fp8={value} runs beside bf16 or fp32 activations, not fp16's loss scaling: "
                                         "set precision=bf16-mixed or fp8=off")

    def apply(self, plan, value, cfg, ctx):
        if value != "off":
            plan.knobs[self.name] = value
            if ctx.model_config and sizes(ctx.model_config).experts:
                # torchao's float8 grouped GEMM does not run transformers' expert call (docs/knobs-why.md)
                plan.notes.append(f"fp8={value}: the routed experts' weights stay in bf16 (torchao's float8 converts "
                                  "nn.Linear; its float8 grouped GEMM does not run transformers' experts yet): only "
                                  "its nn.Linear layers (attention, shared experts) are FP8")


def recipe(plan) -> str | None:
    """The torchao recipe (Float8LinearRecipeName's value) the plan converts with: fp8's scaling, or rowwise with the
    weight gradients in high precision where fp8_weight_grad says so; None: no FP8."""
    value = plan.knobs.get(Fp8.name)
    return GW_HP if value == "rowwise" and plan.knobs.get(WEIGHT_GRAD) == HIGH else value


def module_filter(model, plan):
    """Which nn.Linear modules the plan converts, as torchao's module_filter_fn(module, fqn): every one but the
    head (torchtitan leaves the output projection in high precision), those whose dimensions FP8 GEMMs cannot take
    (multiples of 16), and, where fp8_ends says so, those of the first and last decoder layers (Megatron's
    --first-last-layers-bf16)."""
    from ..layers import decoder_layers
    head = model.get_output_embeddings()
    kept = set()
    if plan.knobs.get(ENDS) == HIGH:
        layers = decoder_layers(model)
        kept = {id(m) for layer in (layers[0], layers[len(layers) - 1]) for m in layer.modules()}

    def converted(mod, fqn):
        return mod is not head and id(mod) not in kept and mod.in_features % 16 == 0 and mod.out_features % 16 == 0
    return converted
