from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Runtime
from ..layers import decoder_layers


class CompileScopeRuntime(Runtime):
    def transform(self, model, plan):
        if plan.compile and plan.compile_scope == "layers":
            import torch

            layers = decoder_layers(model)
            for i in range(len(layers)):
                layers[i] = torch.compile(layers[i])
        return model


class CompileScopeExport(Export):
    def hook_only(self, name, value, plan, stock):
        return f"{name}=layers" if plan.compile and plan.compile_scope == "layers" else None


@register
class CompileScope(Knob):
    """What torch.compile wraps: each decoder layer on its own (torchtitan's way) or the whole model; auto: layers
    on the PyTorch engines, the model under DeepSpeed."""

    name = "compile_scope"
    default = "auto"  # layers on the PyTorch engines, model under DeepSpeed
    auto = True
    choices = ("layers", "model")
    requires = {"compile": (True,)}
    runtime = CompileScopeRuntime(stage="compile_layers")  # after checkpointing wraps the layers, before sharding
    # TrainingArguments' torch_compile compiles the whole model
    export = CompileScopeExport(without_hook="model", hook_rank=1)
    # Why: transformers builds the causal mask inside the model's forward. Traced by torch.compile it is
    # materialised (transformers skips it only outside tracing, before torch 2.14), so SDPA gets a mask tensor
    # instead of is_causal. Compiling the layers leaves the mask-building eager; one layer graph serves them all
    # (faster than the whole model compiled, measured: docs/knobs-why.md).

    def concrete(self, value, cfg, ctx):
        if value == "auto" and cfg["compile"]:
            return "model" if cfg["zero_stage"] else "layers"
        return value

    def check(self, value, cfg, ctx):
        if value == "layers" and cfg["zero_stage"]:
            raise ConfigError(self.name, "compile_scope=layers is built for the PyTorch engines (plain, DDP, FSDP2): "
                                         "set compile_scope=model or zero_stage=0")

    def apply(self, plan, value, cfg, ctx):
        plan.compile_scope = value
