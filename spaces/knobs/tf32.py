from ..knob import Knob, register


@register
class Tf32(Knob):
    """Let fp32 matrix products use TF32 tensor cores (CUDA only; no effect on the CPU)."""

    name = "tf32"
    default = True
    choices = (False, True)
    stage = "process"

    def apply(self, plan, value, cfg, ctx):
        plan.tf32 = value

    def transform(self, model, plan):
        import torch
        if torch.cuda.is_available():  # process-wide flags, read by every fp32 matmul and convolution
            torch.backends.cuda.matmul.allow_tf32 = plan.tf32
            torch.backends.cudnn.allow_tf32 = plan.tf32
        return model
