from ..knob import Knob, register
from ..layers import decoder_layers
from ..roles import Costs, Export, Runtime, Search


class OffloadCosts(Costs):
    def memory(self, terms, plan, spec):
        # save_on_cpu copies every tensor a decoder layer saves for backward to the host as it is saved (the original
        # freed at once; in backward each comes back for the one op that reads it and is freed after it), so the GPU
        # keeps none of the layers' activations, nor autocast's 16-bit copies of the layers' weights (the linears
        # save them, autocast's cache drops them as the forward ends); what is saved outside the layers (token ids,
        # the final norm, the head's input and its weight's copy) and the logits stay (checked against a GPU's
        # peak: docs/knobs-why.md). The host holds the layers' saved tensors and 16-bit weight copies.
        # On the CPU the host is the device: nothing moves.
        setting = plan.knobs.get(ActivationOffload.name)
        if not setting or spec.device == "cpu" or terms.layers < 1:
            return
        moved = terms.layer_activations
        terms.activations -= moved
        terms.layer_activations = 0.0
        weights = (4 if plan.precision == "fp32" else 2) * terms.layer_params * terms.layers
        terms.cast -= terms.layer_cast  # autocast's copies of the layers' linears: the host's, not the GPU's
        terms.host += moved + weights


class OffloadRuntime(Runtime):
    def transform(self, model, plan):
        """Each decoder layer's forward runs inside save_on_cpu: a forward pre-hook enters it, a forward hook leaves
        it (hooks, not a wrapper module, so checkpointing's and compile's unwrapping of the layers is unchanged)."""
        setting = plan.knobs.get(ActivationOffload.name)
        if setting:
            for layer in decoder_layers(model):
                offload_saved_tensors(layer, pin_memory=setting["pin_memory"])
        return model


@register
class ActivationOffload(Knob):
    """Move what each decoder layer saves for backward to host memory (torch.autograd.graph.save_on_cpu) and back."""

    name = "activation_offload"
    default = "off"
    choices = ("off", "on")
    # a checkpointed layer keeps its input (and selective's saved outputs) inside torch's checkpoint, which no
    # saved-tensor hook outside it sees: offload there would move nothing. One or the other.
    requires = {"activation_checkpointing": ("none",)}
    # hooks on the layers before per-layer compile (which graph-breaks at them) and sharding
    runtime = OffloadRuntime(stage="checkpoint")
    # a memory saver: start points and the atlas pick among the savers that fit by predicted step time, which charges
    # its PCIe traffic (predictor/steptime.offload_s: memory.host_held's bytes down in forward and up in backward, every
    # micro-batch, not overlapped: docs/knobs-why.md), so it comes after checkpointing's recompute wherever that fits
    search = Search(savers=((35, {"activation_offload": "on"}),))
    costs = OffloadCosts()
    export = Export(without_hook="off")

    def apply(self, plan, value, cfg, ctx):
        if value == "on":
            plan.knobs[self.name] = {"pin_memory": ctx.device == "cuda"}


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
