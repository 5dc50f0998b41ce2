from ..knob import Knob, register
from ..roles import Export, Runtime, Search


class CompileRuntime(Runtime):
    def transform(self, model, plan):
        """Compile the wrapped model in place: nn.Module.compile, which DeepSpeed's engine overrides with its own."""
        if plan.compile and plan.compile_scope == "model":
            model.compile()
        return model


class CompileExport(Export):
    def fields(self, fmt, plan, device):
        if fmt == "hf":
            return {"torch_compile": plan.compile}
        if fmt == "accelerate" and plan.compile and plan.compile_scope == "model":  # per layer: the hook's
            return {"dynamo_config": {"dynamo_backend": "INDUCTOR"}}
        return {}


@register
class Compile(Knob):
    """torch.compile the model (inductor); compile time is excluded from the timed steps but reported."""

    name = "compile"
    default = False
    choices = (False, True)
    # the whole model (compile_scope=model) is compiled after the engine wraps it
    runtime = CompileRuntime(stage="sharded")
    # the yardstick's own best rows are compiled; the demo: no inductor (a C++ compiler) needed
    search = Search(start=(1, True), column=5, demo=False)
    export = CompileExport()

    def apply(self, plan, value, cfg, ctx):
        plan.compile = value
