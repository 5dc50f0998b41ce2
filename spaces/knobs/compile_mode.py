from ..errors import ConfigError
from ..knob import Knob, register


@register
class CompileMode(Knob):
    """torch.compile mode: default, reduce-overhead (CUDA graphs) or max-autotune-no-cudagraphs (tuned GEMM kernels)."""

    name = "compile_mode"
    default = "default"
    choices = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
    requires = {"compile": (True,)}
    # Why: issue 7 asks for CUDA graphs and fused/tuned kernels where launch overhead or GEMM choice bounds MFU.
    # max-autotune (both at once) is left out: its compile time is the sum of the two.

    def check(self, value, cfg, ctx):
        if value != "reduce-overhead":
            return
        if ctx.device != "cuda":
            raise ConfigError(self.name, "compile_mode=reduce-overhead records CUDA graphs, a GPU only: set "
                                         "compile_mode=default or max-autotune-no-cudagraphs")
        if ctx.world_size > 1 or cfg["zero_stage"] or cfg["fsdp"] != "off":
            # DeepSpeed/FSDP hooks and collectives between the graph's kernels cannot be captured
            raise ConfigError(self.name, "compile_mode=reduce-overhead runs on one rank without ZeRO or FSDP: set "
                                         "compile_mode=default, or zero_stage=0 fsdp=off on one GPU")

    def apply(self, plan, value, cfg, ctx):
        plan.compile_mode = value
