from ..knob import Knob, register


@register
class LossKernel(Knob):
    """How the cross-entropy loss runs: eager (PyTorch ops, fp32 copy of the logits) or compiled on its own by
    torch.compile (upcast, log-softmax and NLL fused into one kernel each way)."""

    name = "loss_kernel"
    default = "eager"
    choices = ("eager", "compiled")
    # Why: with compile_scope=layers the loss runs outside every compiled graph. Eager, it copies the logits to fp32
    # (seq x vocab x 4 bytes per sequence: 26 GB at Pythia-160M micro-batch 64) and reads them several times;
    # torchtitan compiles its loss for the same reason. The model compiled whole already fuses it (no change).

    def apply(self, plan, value, cfg, ctx):
        plan.loss_kernel = value
