"""The typed data that crosses processes and layers: a prepared trial (TrialSpec: runner -> Ray -> each rank),
one rank's raw result (RankResult: worker -> all_gather -> runner.derive) and the measurement record (Record:
execute -> store -> analysis, the CLI's --json).

Each is a validated dataclass (pydantic's): its fields are typed and checked when it is made or read back, and its
plan is a spaces.Plan end to end. to_dict() writes the JSON the store has always held, in the same key order: a
field that is None is left out unless the class names it in ALWAYS (a record's error and metrics are always
there, unless from_dict() read a dict without them). from_dict() keeps keys it does not know in `extra`, and
to_dict() writes them back, so a stored record round-trips unchanged (a plan stored in an earlier form is read
into today's: spaces.Plan). A record's metrics stay the dict it stores; Record.measured reads them as Metrics, the
typed view whose core field names (METRIC_NAMES) name the metric columns of the store, the tables and the exports.
The other nested parts (config, recipe, hardware) stay plain dicts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import field, fields, replace
from typing import Any, ClassVar

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from trainscout.spaces import Plan

from .status import Status

_CONFIG = ConfigDict(arbitrary_types_allowed=True)  # a spec's progress queue is a Ray actor handle


def status_of(value) -> Status | str:
    """A stored status as a Status; a string outside the enum stays as it is (an old or foreign record)."""
    try:
        return Status(value)
    except ValueError:
        return value


class _Json:
    """to_dict/from_dict between a record's fields and its JSON, unknown keys kept in `extra`."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset()
    extra: dict          # keys from_dict() did not know, written back by to_dict()
    _absent: frozenset   # ALWAYS keys the dict from_dict() read did not have

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            if f.name in ("extra", "_absent"):
                continue
            v = getattr(self, f.name)
            if v is not None or (f.name in self.ALWAYS and f.name not in self._absent):
                out[f.name] = str(v) if isinstance(v, Status) else v.to_dict() if isinstance(v, Plan) else v
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)} - {"extra", "_absent"}
        return cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names},
                   _absent=cls.ALWAYS - d.keys())

    def replace(self, **changes):
        return replace(self, **changes)


@dataclass(config=_CONFIG)
class TrialSpec(_Json):
    """Everything a trial needs, validated (trial.runner.prepare); what every rank receives."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"fault"})

    model: str
    model_config: dict
    device: str
    world_size: int
    config: dict
    plan: Plan
    recipe: dict
    grad_accum: int
    measured_accum: int
    timed_steps: int
    warmup_steps: int
    seed: int = 0
    fault: str | None = None
    threads_per_worker: int = 1
    hardware: dict = field(default_factory=dict)
    probe: list[dict] | None = None  # micro_batch_size=max: the candidates, largest first (trial.probe)
    quality: dict | None = None     # knobs that change the numerics: their changes, the reference (trial.quality)
    log_dir: str | None = None      # set by execute: where the ranks' stderr goes
    progress: Any = None            # set by execute: a Ray queue for per-step throughput
    data: str | None = None         # `trainscout train`: a flat token file, its dtype, the checkpoint folder
    data_dtype: str | None = None
    save_dir: str | None = None
    save_dtype: str | None = None   # `trainscout train --save-dtype`: the checkpoint cast on save (None: as trained)
    extra: dict = field(default_factory=dict)
    _absent: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def tokens_per_step(self) -> int:
        return self.recipe["global_batch"] * self.recipe["seq_len"]

    @property
    def micro_batch(self) -> int:
        """Sequences per forward/backward on a rank, as planned (a probe starts from it)."""
        return self.plan.micro_batch_size


@dataclass(config=_CONFIG)
class RankResult(_Json):
    """One rank's raw phase times and peaks (trial.worker), gathered to rank 0 and derived by the runner."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"loss", "below"})

    rank: int
    steps: list[dict]               # timed steps: micro (seconds a micro-batch), optim, total, host_first_micro, loss
    micro_batch_size: int
    grad_accum: int
    measured_accum: int
    build_s: float                  # model + engine (model_s) and, micro_batch_size=max, the probe's steps
    warmup_s: float
    timed_s: float
    peak_rss_mib: float
    loss: float | None = None
    model_s: float | None = None    # of build_s: building the model and its engine (every probed candidate's)
    compile_s: float | None = None  # of build_s + warmup_s: torch.compile compiling (trial.probe.compile_seconds)
    autotune_s: float | None = None  # of build_s + warmup_s, not compile_s: inductor autotuning new kernels' configs
    probe: list = field(default_factory=list)  # micro_batch_size=max: [[mbs, "ok" | "oom"], ...]
    below: dict | None = None       # micro_batch_size=max: the candidate below, measured too
    alloc_retries: int | None = None  # CUDA: the caching allocator's retries during the timed steps
    quality: dict | None = None     # rank 0: the quality gate's one step (trial.quality.one_step)
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    device_name: str | None = None
    gc_s: float | None = None       # of this rank's trial: Python's garbage collector, automatic and explicit
    reset_s: float | None = None    # reset_process() after it (trial.pool.Rank.run)
    span_s: float | None = None     # the rank's whole call: trial and reset (the caller's wall less it: hand-off)
    dtypes: dict | None = None      # what its optimizer stepped: weights, gradients, optimizer states (dtypes.watch)
    shared: dict | None = None      # other trials on its node during the timed steps (trial.contention.timed_end)
    extra: dict = field(default_factory=dict)
    _absent: frozenset = field(default=frozenset(), repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A measurement's metrics (trial.runner.derive) typed: the core fields below, every other key in extras.

    from_dict() reads any stored metrics (a missing field is None); to_dict() writes back the same keys in the same
    order with the same values. Values are kept as stored, not converted (an int stays an int)."""

    tokens_per_s: float | None = None        # tokens per second: the recipe's global batch x seq_len over step_s
    step_s: float | None = None              # projected full optimizer step of the recipe's global batch, median
    measured_step_s: float | None = None     # the timed steps as run (measured_accum micro-batches), median
    micro_batch_s: float | None = None       # a micro-batch before the step's last (the last without any), median
    micro_batch_mean_s: float | None = None  # their mean: stalls a median leaves out count in a full step
    last_micro_batch_s: float | None = None  # the step's last micro-batch (gradient reduction included), median
    optimizer_s: float | None = None         # the optimizer step, median
    step_spread: float | None = None         # (slowest - fastest) projected step over step_s
    rank_spread: float | None = None         # (slowest - fastest) rank's median step over step_s
    steps_s: list | None = None              # each timed step projected to the full step, on its slowest rank
    phases: list | None = None               # per rank and timed step: [micro-batch, last micro-batch, optimizer]
    slowest_rank: int | None = None          # the rank whose median step was slowest
    n_params: int | None = None              # the model's parameters
    gpu: str | None = None                   # the device's name (rank 0's)
    peak_tflops: float | None = None         # the GPU kind's datasheet peak (None on the CPU or an unknown GPU)
    flops_convention: str | None = None      # how the FLOPs below were counted (predictor.flops.CONVENTION)
    flops_per_token: float | None = None     # the model's FLOPs per token, forward and backward
    hardware_flops_per_token: float | None = None  # with activation checkpointing's recomputation
    active_params: float | None = None       # parameters a token passes through (a mixture's routed experts)
    mfu: float | None = None                 # model FLOPs utilisation, a fraction of the GPUs' peak
    hfu: float | None = None                 # hardware FLOPs utilisation, recomputation counted
    projected_days: float | None = None      # the recipe's total steps at step_s
    gpu_hours: float | None = None           # projected_days x 24 x GPUs (0 on the CPU)
    peak_rss_mib: list | None = None         # per rank: peak host memory
    build_s: float | None = None             # building the model and its engine (and the probe's steps)
    model_s: float | None = None             # of build_s: the model and its engine
    compile_s: float | None = None           # torch.compile compiling
    autotune_s: float | None = None          # inductor autotuning new kernels' configs
    warmup_s: float | None = None            # the warm-up steps
    timed_s: float | None = None             # the timed steps
    gc_s: float | None = None                # rank 0: Python's garbage collector in the trial
    reset_s: float | None = None             # rank 0: the worker's reset after the trial
    compared_timed_s: float | None = None    # micro_batch_size=max: the timed steps of the candidate compared
    alloc_retries: int | None = None         # CUDA: the caching allocator's retries in the timed steps
    seed_method_step_s: float | None = None  # the seed paper's host timer around one micro-batch x accumulation
    loss: float | None = None                # the training loss its ranks reported (a pipeline's last stage)
    losses: list | None = None               # each timed step's loss
    micro_batch_size: int | None = None      # the micro-batch it ran (micro_batch_size=max: the one settled on)
    dtypes: dict | None = None               # what rank 0's optimizer stepped: weights, gradients, states
    shared_with: dict | None = None          # other trials on its node during the timed steps (trial.contention)
    quality: dict | None = None              # knobs that change the numerics: the quality gate's verdict
    gate_s: float | None = None              # the quality gate's step, outside the timed steps
    peak_allocated_mib: list | None = None   # CUDA, per rank: peak allocated memory
    peak_reserved_mib: list | None = None    # CUDA, per rank: peak reserved memory
    peak_memory_gib: float | None = None     # the peak over ranks: allocated on CUDA, host RSS on the CPU
    handoff_s: float | None = None           # the trial's wall less its ranks' calls: Ray's hand-off
    extras: dict = field(default_factory=dict)  # keys not above, as stored
    _order: tuple = field(default=(), repr=False, compare=False)  # from_dict: the stored keys, in their order

    @classmethod
    def from_dict(cls, d: dict | None) -> Metrics:
        """A stored metrics dict typed (None or {}: every field None)."""
        d = d or {}
        return cls(**{k: v for k, v in d.items() if k in _CORE},
                   extras={k: v for k, v in d.items() if k not in _CORE}, _order=tuple(d))

    def to_dict(self) -> dict:
        """The dict from_dict() read, as it was; made here: the fields that are not None, then extras."""
        keys = self._order or (*(n for n in METRIC_NAMES if getattr(self, n) is not None), *self.extras)
        return {k: getattr(self, k) if k in _CORE else self.extras[k] for k in keys}


METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Metrics) if f.name not in ("extras", "_order"))
_CORE = frozenset(METRIC_NAMES)
TOKENS_PER_S = "tokens_per_s"  # the throughput: Tune's objective, a store column, what the tables sort by


def metric_columns(*names: str) -> tuple[str, ...]:
    """names, each a field of Metrics: the metric columns of a store, table or export (a wrong name fails on import)."""
    unknown = [n for n in names if n not in _CORE]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a field of trial.records.Metrics (add it there or fix the name)")
    return names


@dataclass(config=_CONFIG)
class Record(_Json):
    """A measurement: what was run, on what, and its outcome (failures are outcomes). Stored as to_dict() JSON."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"error", "metrics"})

    model: str
    config: dict
    status: Status | str
    trial_id: str | None = None
    model_config: dict | None = None
    device: str | None = None
    world_size: int | None = None
    plan: Plan | None = None
    recipe: dict | None = None
    grad_accum: int | None = None
    measured_accum: int | None = None
    timed_steps: int | None = None
    started_at: str | None = None
    wall_s: float | None = None
    reused: int | None = None       # trials its worker processes ran before it (0: fresh processes; trial.pool)
    versions: dict | None = None
    hardware: dict | None = None
    probe: list | None = None
    probe_compared: list | None = None
    error: str | None = None
    stderr_tail: str | None = None
    metrics: dict | None = None
    attempt: int | None = None      # a search: which measurement of the configuration this is
    placement: dict | None = None   # where its ranks ran: nodes, ranks_per_node, split (more than one node)
    fault: str | None = None        # tests: the injected fault
    key: str | None = None          # read from a store: its measurement key and origin
    source: str | None = None
    extra: dict = field(default_factory=dict)
    _absent: frozenset = field(default=frozenset(), repr=False, compare=False)

    ORDER: ClassVar[tuple[str, ...]] = (
        "trial_id", "model", "model_config", "device", "world_size", "config", "plan", "recipe", "grad_accum",
        "measured_accum", "timed_steps", "started_at", "wall_s", "reused", "versions", "hardware", "probe",
        "probe_compared", "status", "error", "stderr_tail", "metrics", "attempt", "placement", "fault", "key", "source")

    def __post_init__(self):
        self.status = status_of(self.status)

    def to_dict(self) -> dict:
        d = super().to_dict()
        return {k: d[k] for k in (*self.ORDER, *self.extra) if k in d}

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def m(self) -> dict:
        """The metrics, or {} for a failure."""
        return self.metrics or {}

    @property
    def measured(self) -> Metrics:
        """The metrics typed (every field None for a failure)."""
        return Metrics.from_dict(self.metrics)

    @property
    def micro_batch(self):
        """The micro-batch it ran (its plan's; micro_batch_size=max: the one the probe settled on); None without a
        plan."""
        return self.plan.micro_batch_size if self.plan else None
