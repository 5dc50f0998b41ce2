from ..knob import Knob, register
from ..roles import Export, Numerics, Runtime, Search


class Tf32Runtime(Runtime):
    def transform(self, model, plan):
        import torch
        if torch.cuda.is_available():  # process-wide flags, read by every fp32 matmul and convolution
            torch.backends.cuda.matmul.allow_tf32 = plan.tf32
            torch.backends.cudnn.allow_tf32 = plan.tf32
        return model


class Tf32Numerics(Numerics):
    def why(self, value, cfg, ctx):
        # under 16-bit autocast the products run in 16 bits whatever this says; with precision=fp32 on a GPU in TF32
        on = value and cfg.get("precision") == "fp32" and ctx.device == "cuda"
        return "TF32 (10-bit mantissa) products in fp32" if on else None


class Tf32Export(Export):
    def fields(self, fmt, plan, device):
        return {"tf32": plan.tf32} if fmt == "hf" and device == "cuda" else {}  # TrainingArguments refuses it off a GPU


@register
class Tf32(Knob):
    """Let fp32 matrix products use TF32 tensor cores (CUDA only; no effect on the CPU)."""

    name = "tf32"
    default = True
    choices = (False, True)
    runtime = Tf32Runtime(stage="process")
    numerics = Tf32Numerics()
    search = Search(demo=True)
    export = Tf32Export()

    def apply(self, plan, value, cfg, ctx):
        plan.tf32 = value
