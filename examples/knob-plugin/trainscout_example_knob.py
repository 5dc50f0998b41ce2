"""Example knobs from another package, found through the entry-point group `trainscout.knobs`: one sets the
workers' environment, one transforms the model (a runtime role, applied by trainscout.runtime)."""
from trainscout.spaces import Knob, register
from trainscout.spaces.layers import decoder_layers
from trainscout.spaces.roles import Runtime


@register
class CudaAllocConf(Knob):
    """CUDA caching allocator: expandable segments reduce fragmentation (and so OOMs) at large micro-batches."""

    name = "cuda_alloc_conf"
    default = "default"
    choices = ("default", "expandable_segments")

    def apply(self, plan, value, cfg, ctx):
        if value == "expandable_segments":
            plan.env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


class CheckpointMlps(Runtime):
    """The runtime role of mlp_checkpointing: wraps each decoder layer's MLP in PyTorch's checkpoint."""

    def transform(self, model, plan):
        if plan.knobs.get("mlp_checkpointing"):
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
            for layer in decoder_layers(model):
                layer.mlp = checkpoint_wrapper(layer.mlp, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return model


@register
class MlpCheckpointing(Knob):
    """Selective activation checkpointing: recompute only each decoder layer's MLP in backward (attention kept)."""

    name = "mlp_checkpointing"
    default = False
    choices = (False, True)
    requires = {"activation_checkpointing": ("none",)}  # whole layers checkpointed already hold no MLP activations
    # where trainscout.runtime applies it: after module swaps, before per-layer compile
    runtime = CheckpointMlps(stage="checkpoint")

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.knobs[self.name] = True  # a plugin's setting: Plan.knobs, read back by its own runtime role
