"""An example knob from another package, found through the entry-point group `trainscout.knobs`."""
from trainscout.spaces import Knob, register


@register
class CudaAllocConf(Knob):
    """CUDA caching allocator: expandable segments reduce fragmentation (and so OOMs) at large micro-batches."""

    name = "cuda_alloc_conf"
    default = "default"
    choices = ("default", "expandable_segments")

    def apply(self, plan, value, cfg, ctx):
        if value == "expandable_segments":
            plan.env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
