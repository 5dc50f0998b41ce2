"""The roles a knob composes besides its core (spaces.Knob: its domain, its rules, apply), and the typed records that
cross them. A role is a small class with defaults; a knob declares the ones it plays as class attributes holding a
role object (a subclass where it overrides a hook), and each folder reads only the role it serves:

- `Runtime`: how a setting changes the run (trainscout.runtime, the engines): `stage` and `order`, `transform`,
  `wrap_step`, `optimizer`, the optional `packages` it needs, the device-mesh dimension `mesh_dim`.
- `Costs`: what the predictor reads (trainscout.predictor: memory, step time): the `memory` hook over MemoryTerms,
  `logits_bytes`, `linear_rate`, `cast_bytes`, `head_s`.
- `Numerics`: why a value trains other numbers than the `reference` one (the quality gate compares them).
- `Search`: what search/, atlas/ and cli/ read: start points, memory savers, the micro-batch, columns, the demo.
- `Export`: what an export carries of the setting (analysis/export.py), or why only the runtime hook applies it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Context, Plan


@dataclass
class MemoryTerms:
    """One rank's bytes of one micro-batch as the memory model hands them to the knobs' Costs.memory, which change
    them in place (trainscout.predictor.memory; the model states follow params, layer_params and cast)."""

    activations: float        # what autograd saves for backward
    logits: float             # the loss's logits and their gradients
    params: float             # parameters the rank holds (a parallel knob divides them)
    layer_params: float       # one decoder layer's parameters
    layers: int               # decoder layers the rank holds
    layer_activations: float  # what the activations hold of the decoder layers
    layer_policy_saved: float  # one decoder layer's matrix-product and attention outputs (selective checkpointing)
    host: float = 0.0         # what a hook keeps in host memory instead
    cast: float = 0.0         # parameters whose 16-bit copies autocast keeps on the GPU for backward
    layer_cast: float = 0.0   # those of them inside the decoder layers


@dataclass
class OptimizerSpec:
    """The optimizer a rank builds, before it has parameters, as every knob's Runtime.optimizer hook passes it on
    (trial.engines.base.optimizer_spec): the memory model reads `bytes`, the step-time model `step_cost`,
    trainscout.predictor.dtypes `states`."""

    cls: Any                  # the torch optimizer class
    kwargs: dict              # its keyword arguments (lr, betas, weight_decay, fused, foreach, ...)
    device: str | None        # the rank's device type (None where the predictor reads it)
    states: str               # what its state tensors are, as the record names them: float32, bfloat16, 8bit, ...
    bytes: float              # their bytes per parameter
    step_cost: float = 1.0    # its step against torch's fused fp32 AdamW's


@dataclass(frozen=True)
class Runtime:
    """How a knob's setting changes what a trial runs. `stage` (one of spaces.knob.STAGES, None: no transform) is
    where `transform` runs, `order` orders the knobs of one stage and the optimizer hooks (lower first)."""

    stage: str | None = None
    order: int = 0
    packages: tuple[str, ...] = ()  # optional packages it needs (Context.installed says which are present)
    mesh_dim: str | None = None     # the device-mesh dimension its value is the degree of (spaces.parallel.DIMS)

    def transform(self, model, plan: Plan):
        """The model changed as the plan says, at this stage (the same object or a new one). A role that declares
        `transform(self, model, plan, dims=None)` is given the trial's spaces.parallel.ParallelDims."""
        return model

    def wrap_step(self, step, plan: Plan, dims):
        """One micro-batch's forward and backward as this knob runs it: `step(model, batch, scale, **loss_kwargs)`
        returns the loss; return `step` itself to change nothing."""
        return step

    def optimizer(self, spec: OptimizerSpec, plan: Plan) -> OptimizerSpec:
        """The optimizer as this knob builds it (spec changed in place or replaced); every engine's optimizer passes
        through every knob's hook in spaces.knob.in_order."""
        return spec


@dataclass(frozen=True)
class Costs:
    """What a knob's setting costs, as the predictor reads it (a knob that declares nothing ranks as neither faster
    nor slower): by value, the bytes its loss kernel moves per token and vocabulary entry (`logits_bytes`, "compiled"
    where the model compiled whole fuses it), the decoder linears' speed over the bf16 peak (`linear_rate`) and the
    bytes per token and width their casts move (`cast_bytes`)."""

    logits_bytes: dict = field(default_factory=dict)
    linear_rate: dict = field(default_factory=dict)
    cast_bytes: dict = field(default_factory=dict)

    def memory(self, terms: MemoryTerms, plan: Plan, spec) -> None:
        """Adjust one micro-batch's terms in place; `spec` is the trial.records.TrialSpec or stored Record (its
        recipe's seq_len: the rank's tokens under context parallel)."""

    def head_s(self, value, spec, tokens: int, product_s: float, bytes_per_s: float) -> float | None:
        """Seconds of the LM head and its loss in one micro-batch of tokens where this knob runs them its own way
        (None: the step-time model's)."""
        return None


@dataclass(frozen=True)
class Numerics:
    """Why a value trains other numbers than the `reference` value (None: the knob's default); the quality gate
    compares a configuration with such a value against its reference before it is called the same model."""

    reference: Any = None

    def why(self, value, cfg: dict, ctx: Context) -> str | None:
        """Why training with this value computes other numbers than with the reference (None: the same)."""
        return None


@dataclass(frozen=True)
class Search:
    """What search/, atlas/ and cli/ read of a knob.

    start (step, value): on a GPU the start points after the defaults set, step by step and cumulatively, each
    searched knob's value of that step; a step is taken where a knob of it that does not `start_follows` changes the
    point. savers ((rank, settings), ...): memory savers a start point adds where the defaults do not fit, with the
    other knobs they need, tried in rank order (lower: cheaper in speed). micro_batch: this knob sets the micro-batch.
    column: its place among `trainscout results`' knob columns (0: only in csv/json); demo: the value the CPU demo
    search fixes (None: searched)."""

    start: tuple[int, Any] | None = None
    start_follows: bool = False
    savers: tuple[tuple[int, dict], ...] = ()
    micro_batch: bool = False
    column: int = 0
    demo: Any = None

    def measured(self, value, plan: Plan | None):
        """The value a measurement with this setting ran (its record's plan says what an open value became)."""
        return value


@dataclass(frozen=True)
class Export:
    """What an export carries of a knob's setting: `fields` of a format, or where none does, the setting only
    trainscout's runtime hook applies (`hook_only`, listed in `hook_rank` order; `without_hook`: what a stock Trainer
    runs instead). formats (None: the engine's) carry it set away from its default, `not_carried` says why the others
    cannot, `launcher` is the least launcher it needs (trial.engines.LAUNCHERS; None: the engine's)."""

    without_hook: Any = None
    hook_rank: int = 0
    formats: tuple[str, ...] | None = None
    not_carried: str = ""
    launcher: str | None = None

    def fields(self, fmt: str, plan: Plan, device: str) -> dict:
        """The fields of export format fmt ("hf": TrainingArguments, "accelerate": its config) that carry the
        setting ({}: none)."""
        return {}

    def hook_only(self, name: str, value, plan: Plan, stock) -> str | None:
        """The setting, as name=value, where no format carries it and only trainscout's runtime hook applies it
        (None: carried, or off); stock is trainscout.runtime.hf (what the installed transformers does itself). By
        default: any value but `without_hook`, for a knob that has one."""
        if self.without_hook is None or value == self.without_hook:
            return None
        return f"{name}={value}"
