"""The typed data that crosses processes and layers: a prepared trial (TrialSpec: runner -> Ray -> each rank),
one rank's raw result (RankResult: worker -> all_gather -> runner.derive) and the measurement record (Record:
execute -> store -> analysis, the CLI's --json).

Each has to_dict()/from_dict(). to_dict() writes the JSON the store has always held, in the same key order: a
field that is None is left out unless the class names it in ALWAYS (a record's error and metrics are always
there, unless from_dict() read a dict without them). from_dict() keeps keys it does not know in `extra`, and
to_dict() writes them back, so a stored record round-trips unchanged. Nested parts (config, plan, recipe, metrics, hardware) stay plain dicts: the knobs and the
engines read them by key.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from .status import Status


def status_of(value) -> Status | str:
    """A stored status as a Status; a string outside the enum stays as it is (an old or foreign record)."""
    try:
        return Status(value)
    except ValueError:
        return value


class _Fields:
    """to_dict/from_dict over the dataclass fields, unknown keys kept in `extra`.

    `get`/`[]`/`keys` read the same view as to_dict, for code outside the package that still reads a record or a
    spec by key (bench/trial_gpu.py; a plugin knob's memory hook). The package itself reads fields."""

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
                out[f.name] = str(v) if isinstance(v, Status) else v
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)} - {"extra", "_absent"}
        return cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names},
                   _absent=cls.ALWAYS - d.keys())

    def replace(self, **changes):
        return replace(self, **changes)

    def get(self, key: str, default=None):
        return self.to_dict().get(key, default)

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def keys(self):
        return self.to_dict().keys()


@dataclass(eq=True)
class TrialSpec(_Fields):
    """Everything a trial needs, validated (trial.runner.prepare); what every rank receives."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"fault"})

    model: str
    model_config: dict
    device: str
    world_size: int
    config: dict
    plan: dict                      # spaces.Plan.to_dict(): the engines and knobs read it by key
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
    extra: dict = field(default_factory=dict)
    _absent: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def tokens_per_step(self) -> int:
        return self.recipe["global_batch"] * self.recipe["seq_len"]

    @property
    def micro_batch(self) -> int:
        """Sequences per forward/backward on a rank, as planned (a probe starts from it)."""
        return self.plan["micro_batch_size"]


@dataclass(eq=True)
class RankResult(_Fields):
    """One rank's raw phase times and peaks (trial.worker), gathered to rank 0 and derived by the runner."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"loss", "below"})

    rank: int
    steps: list[dict]               # per timed step: micro (seconds per micro-batch), optim, total, host_first_micro, loss
    micro_batch_size: int
    grad_accum: int
    measured_accum: int
    build_s: float                  # model + engine (model_s) and, micro_batch_size=max, the probe's steps
    warmup_s: float
    timed_s: float
    peak_rss_mib: float
    loss: float | None = None
    model_s: float | None = None    # of build_s: building the model and its engine (every probed candidate's)
    probe: list = field(default_factory=list)  # micro_batch_size=max: [[mbs, "ok" | "oom"], ...]
    below: dict | None = None       # micro_batch_size=max: the candidate below, measured too
    alloc_retries: int | None = None  # CUDA: the caching allocator's retries during the timed steps
    quality: dict | None = None     # rank 0: the quality gate's one step (trial.quality.one_step)
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    device_name: str | None = None
    extra: dict = field(default_factory=dict)
    _absent: frozenset = field(default=frozenset(), repr=False, compare=False)


@dataclass(eq=True)
class Record(_Fields):
    """A measurement: what was run, on what, and its outcome (failures are outcomes). Stored as to_dict() JSON."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"error", "metrics"})

    model: str
    config: dict
    status: Status | str
    trial_id: str | None = None
    model_config: dict | None = None
    device: str | None = None
    world_size: int | None = None
    plan: dict | None = None
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
        "measured_accum", "timed_steps", "started_at", "wall_s", "reused", "versions", "hardware", "probe", "probe_compared",
        "status", "error", "stderr_tail", "metrics", "attempt", "placement", "fault", "key", "source")

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
        """The micro-batch it ran (its plan's; micro_batch_size=max: the one the probe settled on); None without a plan."""
        return (self.plan or {}).get("micro_batch_size")
