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

    def transform(self, model, plan):
        """Wrap every n-th decoder layer (1 = all) in PyTorch's non-reentrant checkpoint."""
        if plan.checkpoint_every:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

            layers = decoder_layers(model)
            for i in range(0, len(layers), plan.checkpoint_every):
                layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return model
