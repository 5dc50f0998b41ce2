from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Runtime, Search


# The optimizer step's measured median time in ms per value (the source: docs/knobs-why.md): predictor/steptime.py
# counts a step at STEP_MS[value] / FUSED_MS times torch's fused AdamW's (the optimizer spec's step_cost)
STEP_MS = {"fused": 15.35, "foreach": 34.28}
FUSED_MS = STEP_MS["fused"]


class OptimizerImplRuntime(Runtime):
    def optimizer(self, spec, plan):
        impl = plan.knobs.get(OptimizerImpl.name)
        if impl:  # a plan without it (a default, or stored without this knob) keeps the device's choice
            spec.kwargs.update(fused=impl == "fused", foreach=None if impl == "fused" else True)
            spec.step_cost = STEP_MS[impl] / FUSED_MS
        return spec


class OptimizerImplExport(Export):
    def fields(self, fmt, plan, device):
        if fmt == "hf" and plan.knobs.get(OptimizerImpl.name):
            # TrainingArguments: adamw_torch_fused, or adamw_torch (torch's default kernel: foreach on CUDA)
            return {"optim": "adamw_torch_fused" if plan.knobs[OptimizerImpl.name] == "fused" else "adamw_torch"}
        return {}


@register
class OptimizerImpl(Knob):
    """torch AdamW's kernel: foreach (a few multi-tensor kernels per step) or fused (one fused kernel per dtype and
    device; torch 2.13 has it on CUDA and on the CPU); auto: fused on CUDA, foreach elsewhere."""

    name = "optimizer_impl"
    default = "auto"  # the engines' own choice: fused on CUDA, foreach elsewhere
    auto = True
    choices = ("foreach", "fused")
    # torchao's optimizers (optimizer_state, precision=bf16) have one implementation each: a compiled kernel per
    # parameter. Sampled only where the optimizer is torch's AdamW; set elsewhere, refused with the fix
    requires = {"optimizer_state": ("fp32",), "precision": ("fp32", "bf16-mixed", "fp16-mixed")}
    runtime = OptimizerImplRuntime()
    search = Search(column=0)  # csv/json only: one value of most searches
    export = OptimizerImplExport()
    # Why: the optimizer step is its own phase of a measurement (metrics optimizer_s); on a GPU the fused kernel
    # reads each state once per step. Measured, not assumed (bench/optimizer_gpu.py).

    def concrete(self, value, cfg, ctx):
        # auto is decided here, so auto and the value it stands for are one configuration (one measurement key)
        torch_adamw = cfg["optimizer_state"] == "fp32" and cfg["precision"] != "bf16"
        if value == "auto" and torch_adamw:
            # FSDP2's CPU offload steps the host's shards with torch's fused AdamW (trial/engines/fsdp.py)
            return "fused" if ctx.device == "cuda" or cfg["fsdp"] == "full_shard_offload" else "foreach"
        return value

    def check(self, value, cfg, ctx):
        if value == "foreach" and cfg["fsdp"] == "full_shard_offload":
            raise ConfigError(self.name, "optimizer_impl=foreach: fsdp=full_shard_offload steps the shards on the host "
                                         "with torch's fused AdamW (its CPU kernel, 13x foreach's on 2 cores): set "
                                         "optimizer_impl=auto or fused")

    def apply(self, plan, value, cfg, ctx):
        # only where it is not the engines' own choice (engines.base.optimizer_spec: fused on CUDA, foreach
        # elsewhere): the plan of a default trial is the plan of a trial that does not set it
        if value != "auto" and value != ("fused" if ctx.device == "cuda" else "foreach"):
            plan.knobs[self.name] = value
