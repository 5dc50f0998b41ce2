"""Tensor parallelism (Megatron-style) of the decoder layers on torch.distributed.tensor.parallel."""
from ..errors import ConfigError
from ..knob import Knob, register
from ..layers import decoder_layers
from ..model_config import sizes
from ..roles import Costs, Export, Runtime

# a decoder layer's linears by family: colwise (split by output features: each rank its heads, its MLP columns; the
# outputs stay local) then rowwise (split by input features: partial sums all-reduced into the residual). The names
# of transformers 5.x; GPT-NeoX's fused query_key_value holds each head's q, k, v together, so a column split keeps
# whole heads.
_LLAMA = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
          ("self_attn.o_proj", "mlp.down_proj"))
PLANS = {"llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA, "qwen3": _LLAMA,
         "gpt_neox": (("attention.query_key_value", "mlp.dense_h_to_4h"), ("attention.dense", "mlp.dense_4h_to_h"))}
# the share of a decoder layer's saved activations inside the split region (each rank holds 1/tp of it): without
# sequence parallel the layer's input, the norms and the residual stay whole on every rank. Korthikanti et al.
# (2022) count 24 of a GPT layer's 34 bytes per hidden unit and token there (the rest: two norms' inputs, the
# attention's and the MLP's inputs, the dropout masks), which this takes for every family (not measured here)
SPLIT_SHARE = 24 / 34


class TensorParallelRuntime(Runtime):
    def transform(self, model, plan, dims=None):
        """Parallelize every decoder layer's linears over the mesh's "tp" dimension."""
        tp = plan.mesh.get("tp", 1)
        if tp == 1:
            return model
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        colwise, rowwise = PLANS[model.config.model_type]
        mesh = dims.mesh(next(model.parameters()).device.type)["tp"]
        for layer in decoder_layers(model):
            parallelize_module(layer, mesh, {**{n: ColwiseParallel() for n in colwise},
                                             **{n: RowwiseParallel() for n in rowwise}})
        return model


class TensorParallelCosts(Costs):
    def memory(self, terms, plan, spec):
        tp = plan.mesh.get("tp", 1)
        if tp == 1:
            return
        # the layers' weights (their norms and rowwise biases, a fraction of a percent, counted as split too);
        # the embedding and the head stay whole
        terms.params -= terms.layers * terms.layer_params * (1 - 1 / tp)
        terms.layer_params /= tp
        cut = terms.layer_activations * SPLIT_SHARE * (1 - 1 / tp)
        terms.layer_activations -= cut
        terms.activations -= cut


@register
class TensorParallel(Knob):
    """Tensor parallel degree: split each decoder layer's attention heads and MLP columns over this many ranks (torch.distributed.tensor.parallel; data parallel over the rest: FSDP2 on a 2-D mesh, or FSDP2's replicate)."""  # noqa: E501 - its first line is the description `trainscout knobs` prints (spaces.knob.description)

    name = "tensor_parallel"
    default = 1
    choices = (1, 2, 4, 8)
    requires = {"zero_stage": (0,), "pipeline_stages": (1,)}  # DeepSpeed and the pipeline engine hold plain tensors
    # after the module swaps, before checkpointing, compile and FSDP (torchtitan's order)
    runtime = TensorParallelRuntime(stage="tensor_parallel", mesh_dim="tp")
    costs = TensorParallelCosts()
    export = Export(formats=("command",), launcher="trainscout",
                    not_carried=("transformers' TrainingArguments has no tensor-parallel field (TP there is "
                                 "from_pretrained(tp_plan=) in your own script with accelerate's parallelism_config): "
                                 "use --format command, whose launch.sh runs it with `trainscout train`"))

    def check(self, value, cfg, ctx):
        if value == 1:
            return
        if ctx.world_size % value:
            one = " (on one rank only tensor_parallel=1)" if ctx.world_size == 1 else ""
            raise ConfigError(self.name, f"tensor_parallel={value} does not divide the {ctx.world_size} rank(s): "
                                         f"choose a divisor of {ctx.world_size}{one}")
        mc = ctx.model_config
        if not mc:
            return  # the model's rules where the context has the model (a trial's always does)
        family = mc.get("model_type")
        if family not in PLANS:
            raise ConfigError(self.name, f"tensor_parallel={value} has no plan for {family or 'this'} model (it splits "
                                         f"the layers of {', '.join(sorted(PLANS))}): set tensor_parallel=1")
        z = sizes(mc)
        if z.experts:
            raise ConfigError(self.name, f"tensor_parallel={value} does not split a mixture of experts' layers: "
                                         "set tensor_parallel=1")
        for what, n in (("attention heads", z.heads), ("key/value heads", z.kv_heads), ("MLP width", z.intermediate)):
            if n % value:
                raise ConfigError(self.name, f"tensor_parallel={value} does not divide the model's {n} {what}: "
                                             f"choose a degree that divides {n}")
        if cfg["precision"] == "fp16-mixed":
            raise ConfigError(self.name, f"tensor_parallel={value} with precision=fp16-mixed is not supported (the "
                                         "loss scaler does not unscale sharded gradients): set precision=bf16-mixed")
        if cfg.get("fp8", "off") != "off":
            raise ConfigError(self.name, f"tensor_parallel={value} with fp8={cfg['fp8']} needs torchao's float8 "
                                         "tensor-parallel styles, not wired here: set fp8=off or tensor_parallel=1")

    def apply(self, plan, value, cfg, ctx):
        pass  # resolve() writes the degree into plan.mesh["tp"] (mesh_dim); the transform reads it there
