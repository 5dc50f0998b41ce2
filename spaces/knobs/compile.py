from ..knob import Knob, register


@register
class Compile(Knob):
    """torch.compile the model (inductor); compile time is excluded from the timed steps but reported."""

    name = "compile"
    default = False
    choices = (False, True)
    stage = "sharded"  # the whole model (compile_scope=model) is compiled after the engine wraps it
    start = (1, True)  # the yardstick's own best rows are compiled
    column, demo = 5, False  # the demo: no inductor (a C++ compiler) needed

    def apply(self, plan, value, cfg, ctx):
        plan.compile = value

    def export(self, fmt, plan, device):
        if fmt == "hf":
            return {"torch_compile": plan.compile}
        if fmt == "accelerate" and plan.compile and plan.compile_scope == "model":  # per layer: the hook's
            return {"dynamo_config": {"dynamo_backend": "INDUCTOR"}}
        return {}

    def transform(self, model, plan):
        """Compile the wrapped model in place: nn.Module.compile, which DeepSpeed's engine overrides with its own."""
        if plan.compile and plan.compile_scope == "model":
            model.compile()
        return model
