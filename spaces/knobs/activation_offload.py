from ..knob import Knob, register
from ..layers import decoder_layers


@register
class ActivationOffload(Knob):
    """Move what each decoder layer saves for backward to host memory (torch.autograd.graph.save_on_cpu) and back."""

    name = "activation_offload"
    default = "off"
    choices = ("off", "on")
    # a checkpointed layer keeps its input (and selective's saved outputs) inside torch's checkpoint, which no
    # saved-tensor hook outside it sees: offload there would move nothing. One or the other.
    requires = {"activation_checkpointing": ("none",)}
    stage = "checkpoint"  # hooks on the layers before per-layer compile (which graph-breaks at them) and sharding
    # Not a memory saver yet: start points pick among the savers that fit by predicted step time, and the step-time
    # model (trial/steptime.py) has no term for the layers' activations crossing PCIe twice a micro-batch, so it
    # predicted this the fastest of all (Pythia-6.9B on an H200: 96 s a step against full checkpointing's 130 s, where
    # ~10 GB each way per micro-batch at ~25 GB/s costs far more than recomputing the forward). Declare
    # ((35, {"activation_offload": "on"}),) once steptime charges 2 x memory.host_held bytes per micro-batch.
    savers = ()
    without_hook = "off"

    def apply(self, plan, value, cfg, ctx):
        if value == "on":
            plan.knobs[self.name] = {"pin_memory": ctx.device == "cuda"}

    def memory(self, terms, plan, spec):
        # the layers' saved tensors (activations, and the weights' 16-bit copies the linears save: save_on_cpu copies
        # every saved tensor) go to the host; the GPU keeps about one layer's in flight (the layer being computed in
        # forward, the one unpacked in backward). On the CPU the host is the device: nothing moves.
        setting = plan.knobs.get(self.name)
        if not setting or spec.device == "cpu" or terms["layers"] < 1:
            return
        one = terms["layer_activations"] / terms["layers"]
        moved = terms["layer_activations"] - one
        terms["activations"] -= moved
        terms["layer_activations"] = one
        weights = (4 if plan.precision == "fp32" else 2) * terms["layer_params"] * terms["layers"]
        terms["host"] = terms.get("host", 0.0) + moved + one + weights

    def transform(self, model, plan):
        """Each decoder layer's forward runs inside save_on_cpu: a forward pre-hook enters it, a forward hook leaves
        it (hooks, not a wrapper module, so checkpointing's and compile's unwrapping of the layers is unchanged)."""
        setting = plan.knobs.get(self.name)
        if setting:
            for layer in decoder_layers(model):
                offload_saved_tensors(layer, pin_memory=setting["pin_memory"])
        return model


def offload_saved_tensors(module, pin_memory: bool):
    """Run module's forward inside torch.autograd.graph.save_on_cpu(pin_memory); returns the hooks' handles."""
    import torch
    open_ = []

    def enter(mod, args, kwargs):
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
        ctx.__enter__()
        open_.append(ctx)

    def leave(mod, args, kwargs, out):
        open_.pop().__exit__(None, None, None)

    return (module.register_forward_pre_hook(enter, with_kwargs=True),
            module.register_forward_hook(leave, with_kwargs=True, always_call=True))
