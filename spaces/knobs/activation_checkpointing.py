from ..errors import ConfigError
from ..knob import Knob, register
from ..layers import decoder_layers
from ..roles import Costs, Export, Runtime, Search

SELECTIVE = "selective"


def saved_ops() -> frozenset:
    """The aten ops whose outputs selective checkpointing saves (torchtitan's op-level policy, its _save_list, without
    its every-second-mm rule): the matrix products and the attention kernels, and tensor parallel's reduce-scatter;
    everything else (norms, activations, casts, elementwise) is recomputed in backward. The memory model counts the
    same ops' outputs (predictor/saved_bytes.count_saved)."""
    import torch
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable",
             "_scaled_dot_product_flash_attention_for_cpu")
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor.default)
    return frozenset(ops)


def selective_context():
    """The (forward, recompute) contexts of one selectively checkpointed call: torch's
    create_selective_checkpoint_contexts with saved_ops() saved and the rest recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = saved_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


class CheckpointingRuntime(Runtime):
    def transform(self, model, plan):
        """Wrap every n-th decoder layer (1 = all) in PyTorch's non-reentrant checkpoint; selective: every layer,
        with the op policy of selective_context."""
        if plan.checkpoint_every:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

            selective = plan.knobs.get(ActivationCheckpointing.name) == SELECTIVE
            extra = {"context_fn": selective_context} if selective else {}
            layers = decoder_layers(model)
            for i in range(0, len(layers), plan.checkpoint_every):
                layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra)
        return model


class CheckpointingCosts(Costs):
    def memory(self, terms, plan, spec):
        # a selectively checkpointed layer keeps, besides its input (counted as full checkpointing's), the outputs of
        # the policy's ops: predictor/model_tree measures them on the meta device ("layer_policy_saved", one layer's)
        if plan.knobs.get(ActivationCheckpointing.name) == SELECTIVE:
            kept = terms.layers * terms.layer_policy_saved
            terms.activations += kept
            terms.layer_activations += kept


class CheckpointingExport(Export):
    def fields(self, fmt, plan, device):
        if fmt != "hf" or plan.knobs.get(ActivationCheckpointing.name) == SELECTIVE:
            return {}  # no TrainingArguments field takes an op policy: the runtime hook applies it (hook_only)
        fields = {"activation_checkpointing": bool(plan.checkpoint_every)}
        if plan.checkpoint_every > 1:  # transformers 5.2x; runtime.hf.for_installed leaves it to the hook before that
            fields["activation_checkpointing_kwargs"] = {"every_n_layers": plan.checkpoint_every}
        return fields

    def hook_only(self, name, value, plan, stock):
        if plan.knobs.get(name) == SELECTIVE:
            return f"{name}={SELECTIVE}"
        if plan.checkpoint_every > 1 and not stock.native_every_n():
            return f"{name}={plan.checkpoint_every}"
        return None


@register
class ActivationCheckpointing(Knob):
    """Recompute layer activations in backward instead of storing them: none, selective, full or every n-th layer."""

    name = "activation_checkpointing"
    default = "none"
    # selective: every layer keeps its matrix products' and attention's outputs and recomputes the rest (torchtitan's
    # op-level policy); full: every layer keeps only its input
    choices = ("none", SELECTIVE, "full", 2, 3, 4)
    runtime = CheckpointingRuntime(stage="checkpoint")
    costs = CheckpointingCosts()
    # memory savers, cheapest first: selective (recomputes no matrix product), every 4th layer .. every layer (each
    # recomputes more of the forward)
    search = Search(savers=((8, {"activation_checkpointing": SELECTIVE}), (10, {"activation_checkpointing": 4}),
                            (20, {"activation_checkpointing": 3}), (30, {"activation_checkpointing": 2}),
                            (40, {"activation_checkpointing": "full"})),
                    column=4)
    export = CheckpointingExport(without_hook="none", hook_rank=2)

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().isdigit():
            raw = int(raw)
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw == 1:
                return "full"
            if raw >= 2:
                return raw  # any n is valid; only the search domain is fixed
        return super().parse(raw)

    def check(self, value, cfg, ctx):
        if isinstance(value, int) and value > ctx.num_layers:
            raise ConfigError(self.name, f"activation_checkpointing={value} exceeds the model's {ctx.num_layers} "
                                         f"layers: choose n <= {ctx.num_layers} or full")

    def apply(self, plan, value, cfg, ctx):
        # selective wraps every layer, as full does (checkpoint_every 1: the memory model counts each layer's input,
        # its Costs.memory adds what the policy saves); its policy is this knob's own setting
        plan.checkpoint_every = {"none": 0, "full": 1, SELECTIVE: 1}.get(value, value)
        if value == SELECTIVE:
            plan.knobs[self.name] = SELECTIVE
