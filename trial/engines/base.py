"""The engine contract and its registry. An engine runs one rank's training under a plan: it builds (the knobs'
model transforms through trainscout.runtime, then its own sharding), takes a micro-step and an optimizer step, and
gathers the full state dict for a checkpoint. Its class also holds what the memory model and the exports need to
know of it, so nothing outside trial/engines/ branches on an engine's name. Importing it imports no torch."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from trainscout.spaces import Plan
    from trainscout.spaces.roles import OptimizerSpec

    from ..records import Record

REGISTRY: dict[str, type["Engine"]] = {}
LAUNCHERS = ("python", "torchrun", "accelerate", "trainscout")  # simplest first


def register_engine(cls: type["Engine"]) -> type["Engine"]:
    """Class decorator: add an engine under its `name` (the value knobs write into Plan.engine)."""
    REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type["Engine"]:
    """The engine class registered under name; ValueError naming the registered ones when there is none."""
    if name not in REGISTRY:
        raise ValueError(f"unknown engine {name!r}: registered are {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def autocast_dtype(precision: str):
    """The autocast dtype of a precision (None: fp32, no autocast)."""
    import torch
    return {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)


def master_bytes(plan) -> int:
    """Bytes per element of the master weights, their gradients and AdamW's states (the plan's master_dtype, which
    the model is built in and predictor.dtypes checks): the memory model's one source for them."""
    return {"float32": 4, "bfloat16": 2, "float16": 2}[plan.master_dtype]


def optimizer_spec(plan, recipe: dict | None = None, device_type: str | None = None) -> OptimizerSpec:
    """The optimizer a rank builds under the plan, before it has parameters (spaces.roles.OptimizerSpec): torch's
    AdamW with the recipe's lr, betas and weight decay (fused on CUDA, foreach elsewhere: what optimizer_impl=auto
    keeps), then every knob's Runtime.optimizer hook in spaces.knob.in_order (optimizer_impl, precision=bf16,
    optimizer_state). Without a recipe or a device (the predictor: memory, step time, dtypes) its kwargs hold only
    what the knobs set."""
    import torch

    from trainscout.spaces import all_knobs, plugins
    from trainscout.spaces.knob import in_order
    from trainscout.spaces.roles import OptimizerSpec, Runtime
    kwargs = {} if recipe is None else {"lr": recipe["lr"], "betas": tuple(recipe["betas"]),
                                        "weight_decay": recipe["weight_decay"]}
    if device_type is not None:
        fused = device_type == "cuda"
        kwargs.update(fused=fused, foreach=None if fused else True)
    spec = OptimizerSpec(cls=torch.optim.AdamW, kwargs=kwargs, device=device_type, states=plan.master_dtype,
                         bytes=2.0 * master_bytes(plan))  # AdamW's two states in the master weights' dtype
    for knob in in_order(k for k in all_knobs() if type(k.runtime).optimizer is not Runtime.optimizer):
        spec = plugins.optimizer(knob, spec, plan)  # a plugin's failure names the plugin
    return spec


def optimizer(params, plan, recipe: dict, device):
    """The rank's optimizer over params: optimizer_spec's class and keyword arguments (every knob's hook applied)."""
    spec = optimizer_spec(plan, recipe, device.type)
    return spec.cls(_homogeneous_groups(params), **spec.kwargs)


def optimizer_bytes(plan) -> float:
    """Bytes per parameter of the optimizer's states under the plan (the memory model's optimizer term)."""
    return optimizer_spec(plan).bytes


def adamw(params, recipe: dict, device):
    """torch AdamW over params with the recipe's lr, betas and weight decay, as no knob changes it (fused on CUDA,
    foreach otherwise): a reference for tests."""
    from trainscout.spaces import Plan
    return optimizer(params, Plan(), recipe, device)


def _homogeneous_groups(params):
    """params as one group per kind (plain tensors; DTensors of one mesh and placement): the fused and foreach
    kernels refuse a list that mixes them ("got mixed torch.Tensor and DTensor": tensor parallel's shards beside the
    replicated norms and embeddings). One kind: the list itself, as before meshes."""
    from torch.distributed.tensor import DTensor
    groups: dict = {}
    for p in params:
        groups.setdefault((p.device_mesh, p.placements) if isinstance(p, DTensor) else None, []).append(p)
    return list(params) if len(groups) <= 1 else [{"params": ps} for ps in groups.values()]


def causal_lm_loss(model, batch, **loss_kwargs):
    """The causal LM loss of a batch of token ids: the model's own loss with the inputs as labels (loss_kwargs: what
    a knob's wrap_step passes on, e.g. shift_labels and position_ids of a context-parallel shard)."""
    return model(input_ids=batch, labels=batch, **loss_kwargs).loss


def clip_grad_norm_(params, max_norm: float):
    """torch's clip_grad_norm_, also over gradients that are DTensors on different meshes (tensor parallel's shards
    beside replicated parameters, FSDP2 on a 2-D mesh): each group's norm is reduced over its own mesh. Returns the
    total norm."""
    import torch
    from torch.distributed.tensor import DTensor
    groups: dict = {}
    for p in params:
        if p.grad is not None:
            g = p.grad
            groups.setdefault((g.device_mesh, g.placements) if isinstance(g, DTensor) else None, []).append(g)
    if len(groups) <= 1:  # one kind of gradient: torch's own (what every engine ran before meshes)
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = None
    for grads in groups.values():
        sq = torch.stack([torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in grads]).square().sum()
        sq = sq.full_tensor() if isinstance(sq, DTensor) else sq
        total = sq if total is None else total + sq
    total = total.sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for grads in groups.values():
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


class Engine:
    """One rank's training under a plan. Subclasses register with @register_engine."""

    name: ClassVar[str]
    # the model may be built (and its weights initialised) on the rank's device: the engine moves it there whole
    # anyway. On the H200 a 1.2B model's build took 26-36 s on the host (bench/warm_workers_gpu.py)
    builds_on_device: ClassVar[bool] = False
    # how a mixed-precision rank computes, for the memory model's activations (predictor/model_tree.saved): "autocast"
    # over fp32 weights, or "16-bit" weights without autocast
    compute: ClassVar[str] = "autocast"
    # the engine counts a step's micro-batches itself (DeepSpeed's accumulation boundary): its warm-up and probe
    # steps run all the measured ones, where the others run two (trial/probe.warmup_accum)
    counts_micro_batches: ClassVar[bool] = False
    # the optimizer that steps on the host where the engine offloads its states (Engine.offloaded): a key of
    # predictor/steptime.HOST_OPTIMIZER_PARAMS_PER_S, whose rate the step-time model gives it
    host_optimizer: ClassVar[str] = "deepspeed_cpu_adam"

    def __init__(self, model, plan, recipe: dict, device, world: int, measured_accum: int, dims=None):
        """dims: the trial's spaces.parallel.ParallelDims (engines.build makes it; None: the plan's on world ranks)."""
        raise NotImplementedError

    def micro_step(self, batch, is_last: bool, scale: float):
        """Forward + backward of one micro-batch (the last of a step synchronises gradients); returns its mean loss
        per token times scale (1/accumulation: a step's micro-batches sum to the step's mean loss), or None."""
        raise NotImplementedError

    def optimizer_step(self) -> None:
        """Clip, step and zero the gradients."""
        raise NotImplementedError

    def full_state_dict(self, names: dict, rank: int) -> dict:
        """The model's full state dict on rank 0 ({} on the other ranks), keyed by parameter name, in the master
        weights' dtype (a checkpoint keeps what trained)."""
        raise NotImplementedError

    def optimizers(self) -> list:
        """The torch optimizers that update the master weights (predictor.dtypes reads what they step)."""
        return [self.opt]

    def close(self) -> None:
        """Release what outlives the engine's objects in this process (the next trial may run in it)."""

    # --- the memory model's terms (bytes per rank; see predictor/memory.py) -----------------------------------
    @classmethod
    def data_ranks(cls, plan: Plan, world: int) -> int:
        """Ranks that hold the same weights and average gradients (data x context parallel): what FSDP/ZeRO shard
        the model states over and DDP's buckets serve (ParallelDims.replicas)."""
        from trainscout.spaces import ParallelDims
        return ParallelDims.of(plan, world).replicas

    @classmethod
    def held(cls, c: dict, plan: Plan) -> tuple[float, int]:
        """(parameters, decoder layers) on the rank that holds the most."""
        return c["N"], c["L"]

    @classmethod
    def model_states(cls, c: dict, plan: Plan, N: float, D: int, mixed: bool) -> dict:
        """weights, gradients, optimizer and buffers: the model states one rank holds."""
        raise NotImplementedError

    @classmethod
    def offloaded(cls, plan: Plan) -> tuple[bool, bool]:
        """(optimizer states, parameter shards) this engine keeps in host memory under the plan."""
        return False, False

    @classmethod
    def host_states(cls, plan: Plan, D: int, pinned: bool, rows) -> float | None:
        """Bytes per rank of the model states this engine keeps in host memory where it offloads (Engine.offloaded);
        None: memory.host_peak's per-parameter rule. pinned: through torch's pinned allocator (on a GPU), which
        rounds each block up to a power of two; rows(): memory.param_rows, (rows, elements) per parameter."""
        return None

    @classmethod
    def in_flight(cls, plan: Plan, activations: float, logits: float) -> tuple[float, float]:
        """Activations and logits held at the peak, from those of one micro-batch."""
        return activations, logits

    @classmethod
    def hook_s(cls, plan: Plan) -> tuple[float, float]:
        """Seconds of host work per micro-batch (its forward and backward) that the engine's own hooks add under the
        plan, as (a fixed part, a part per module that holds parameters): predictor/steptime.host_s, a floor under the
        step where the GPU's share of a micro-batch is shorter. (0.0, 0.0): none worth counting."""
        return 0.0, 0.0

    @classmethod
    def schedule(cls, plan: Plan) -> tuple[int, float]:
        """(micro-batches one micro_step runs through the fullest rank, idle micro-batch slots it waits for the
        other ranks): what predictor/steptime.py times a micro_step by (a pipeline's micro-batches and its bubble)."""
        return 1, 0.0

    # --- exports ------------------------------------------------------------------------------------------
    # the export formats that can carry this engine (trainscout export --format); the others are refused with why
    formats: ClassVar[tuple[str, ...]] = ("hf", "accelerate", "command")
    # what launches a stock HF Trainer with this engine's export on one rank (several ranks: at least torchrun):
    # "python" (a plain process), "accelerate" (accelerate launch with accelerate.yaml: HF Trainer refuses FSDP in one
    # process, DeepSpeed needs its distributed setup), "trainscout" (only `trainscout train` runs it). Portability,
    # for the choice among tied configurations (analysis/ties.py): in LAUNCHERS' order, the first the simplest.
    launcher: ClassVar[str] = "python"
    # how much the engine adds to a plain PyTorch run (0 none; sharding, a library, a pipeline: more), for the same
    portability: ClassVar[int] = 0
    not_carried: ClassVar[str] = ("a DeepSpeed config carries a ZeRO measurement only (zero_stage >= 1), and this one "
                                  "ran without DeepSpeed: use --format hf, accelerate or command")

    @classmethod
    def files(cls, rec: Record) -> dict[str, dict]:
        """Extra config files an export writes for this engine (name -> JSON object)."""
        return {}

    @classmethod
    def hf_args(cls, rec: Record, paths: dict[str, str]) -> dict:
        """transformers.TrainingArguments fields for this engine (paths: the files() written, by name)."""
        return {}

    @classmethod
    def accelerate(cls, rec: Record, paths: dict[str, str]) -> dict:
        """accelerate config fields for this engine."""
        return {}
