"""The typed data that crosses processes and layers: a prepared trial (TrialSpec: runner -> Ray -> each rank),
one rank's raw result (RankResult: worker -> all_gather -> runner.derive) and the measurement record (Record:
execute -> store -> analysis, the CLI's --json).

Each is a validated dataclass (pydantic's): its fields are typed and checked when it is made or read back, and its
plan is a spaces.Plan end to end. to_dict() writes the JSON the store has always held, in the same key order: a
field that is None is left out unless the class names it in ALWAYS (a record's error and metrics are always
there, unless from_dict() read a dict without them). from_dict() keeps keys it does not know in `extra`, and
to_dict() writes them back, so a stored record round-trips unchanged (a plan stored in an earlier form is read
into today's: spaces.Plan). The other nested parts (config, recipe, metrics, hardware) stay plain dicts.
"""
from __future__ import annotations

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
    def micro_batch(self):
        """The micro-batch it ran (its plan's; micro_batch_size=max: the one the probe settled on); None without a
        plan."""
        return self.plan.micro_batch_size if self.plan else None
