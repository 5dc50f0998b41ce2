from ..errors import ConfigError
from ..knob import Knob, register
from ..layers import decoder_layers


@register
class ActivationCheckpointing(Knob):
    """Recompute layer activations in backward instead of storing them: none, full (every layer) or every n-th layer."""

    name = "activation_checkpointing"
    default = "none"
    choices = ("none", "full", 2, 3, 4)
    stage = "checkpoint"
    # memory savers, cheapest first: every 4th layer .. every layer (each recomputes more of the forward)
    savers = ((10, {"activation_checkpointing": 4}), (20, {"activation_checkpointing": 3}),
              (30, {"activation_checkpointing": 2}), (40, {"activation_checkpointing": "full"}))
    without_hook, hook_rank = "none", 2
    column = 4

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
        plan.checkpoint_every = {"none": 0, "full": 1}.get(value, value)

    def export(self, fmt, plan, device):
        if fmt != "hf":
            return {}
        fields = {"activation_checkpointing": bool(plan.checkpoint_every)}
        if plan.checkpoint_every > 1:  # transformers 5.2x; runtime.hf.for_installed leaves it to the hook before that
            fields["activation_checkpointing_kwargs"] = {"every_n_layers": plan.checkpoint_every}
        return fields

    def hook_only(self, value, plan, stock):
        if plan.checkpoint_every > 1 and not stock.native_every_n():
            return f"{self.name}={plan.checkpoint_every}"
        return None

    def transform(self, model, plan):
        """Wrap every n-th decoder layer (1 = all) in PyTorch's non-reentrant checkpoint."""
        if plan.checkpoint_every:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

            layers = decoder_layers(model)
            for i in range(0, len(layers), plan.checkpoint_every):
                layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return model
