from ..knob import Knob, register


@register
class LossKernel(Knob):
    """How the cross-entropy loss runs: eager (PyTorch ops, fp32 copy of the logits) or compiled on its own by
    torch.compile (upcast, log-softmax and NLL fused into one kernel each way)."""

    name = "loss_kernel"
    default = "eager"
    choices = ("eager", "compiled")
    stage = "loss"
    # Why: with compile_scope=layers the loss runs outside every compiled graph. Eager, it copies the logits to fp32
    # (seq x vocab x 4 bytes per sequence: 26 GB at Pythia-160M micro-batch 64) and reads them several times;
    # torchtitan compiles its loss for the same reason. The model compiled whole already fuses it (no change).

    def apply(self, plan, value, cfg, ctx):
        plan.loss_kernel = value

    def transform(self, model, plan):
        if plan.loss_kernel == "compiled":  # the HF model's loss; the pipeline engine calls the same function
            import torch
            model.loss_function = torch.compile(model.loss_function)
        return model

    def memory(self, terms, plan, spec):
        if plan.get("loss_kernel") == "compiled":  # no fp32 copy of the logits: 8·b·s·V bytes fewer (measured)
            b, s, V = plan["micro_batch_size"], spec["recipe"]["seq_len"], int(spec["model_config"]["vocab_size"])
            terms["logits"] -= 8 * b * s * V
