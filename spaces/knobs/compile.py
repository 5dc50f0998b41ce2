from ..knob import Knob, register


@register
class Compile(Knob):
    """torch.compile the model (inductor); compile time is excluded from the timed steps but reported."""

    name = "compile"
    default = False
    choices = (False, True)
    stage = "sharded"  # the whole model (compile_scope=model) is compiled after the engine wraps it

    def apply(self, plan, value, cfg, ctx):
        plan.compile = value

    def transform(self, model, plan):
        """Compile the wrapped model in place: nn.Module.compile, which DeepSpeed's engine overrides with its own."""
        if plan.compile and plan.compile_scope == "model":
            model.compile()
        return model
