"""The Knob base class and the registry. A knob is one file that subclasses Knob and is decorated @register."""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .errors import ConfigError
from .plan import Context, Plan

REGISTRY: dict[str, "Knob"] = {}
# where a knob's model transform runs, in the order trainscout.runtime applies them (torchtitan's): process settings,
# module swaps, tensor then context parallel, the loss, activation checkpointing, per-layer compile, then (after the
# engine shards the model with FSDP/DDP over the data ranks) whole-model compile
STAGES = ("process", "modules", "tensor_parallel", "context_parallel", "loss", "checkpoint", "compile_layers",
          "sharded")
# the hooks through which a knob changes what a trial builds besides the plan (a knob that overrides none of them and
# whose values leave the plan as it is changes nothing: spaces.plugins refuses such a plugin)
RUNTIME_HOOKS = ("transform", "wrap_step", "memory", "optimizer")

_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}


def register(cls: type["Knob"]) -> type["Knob"]:
    """Class decorator: add a knob to the registry (its name must be new)."""
    if cls.name in REGISTRY and type(REGISTRY[cls.name]) is not cls:
        raise ValueError(f"knob {cls.name!r} is registered twice ({type(REGISTRY[cls.name]).__module__}, "
                         f"{cls.__module__})")
    REGISTRY[cls.name] = cls()
    return cls


def in_order(knobs) -> list["Knob"]:
    """Knobs in the order their hooks run: by stage (STAGES; no stage last), then by their declared `order` within
    it, then as given (all_knobs(): requirements first, then by name), so no rule between two knobs holds by name."""
    return sorted(knobs, key=lambda k: (STAGES.index(k.stage) if k.stage in STAGES else len(STAGES), k.order))


def fmt(value: Any) -> str:
    """A value as the user writes it on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Knob:
    """One efficiency setting: its domain, when it applies, and how it changes the training plan.

    `choices` is the search domain (fixed across trials, as Optuna requires). `requires` maps another knob's
    name to the values it must have whenever this knob is set away from its default; a knob whose requirements
    do not hold is not sampled. `check` adds rules that need the context (world size, device, model, recipe).

    Numerics: `numerics` says why a value trains other numbers than the knob's `reference` value (FP8 products, a
    precision, an approximate kernel); a configuration with such a value is compared with its reference by the
    quality gate (trial/quality.py) before it is called the same model.

    The runtime half: a knob that changes how the model trains names its `stage` (one of
    trainscout.runtime.STAGES, the order transforms are applied in; `order` orders the knobs of one stage, lower
    first) and implements `transform`, which reads what `apply` wrote into the plan; `memory` adjusts the memory
    model's terms; `optimizer` changes the optimizer every engine builds (its class, keyword arguments, what its
    states are and their bytes per parameter), in the same order. `packages` lists the optional packages it needs
    (Context.installed says which are present).

    The roles search/, analysis/ and cli/ read (they name no knob; tests/test_knob_roles.py holds them to it):
    - `start` (step, value): on a GPU the start points after the defaults set, step by step and cumulatively, each
      searched knob's value of that step (1: compile, the loss compiled; 2: FP8 on top); a step is taken where a
      knob of it that does not `start_follows` changes the point, and past the first only where the model accepts it.
    - `savers` ((rank, settings), ...): memory savers a start point adds where the defaults do not fit, with the
      other knobs they need; every knob's are tried in rank order (lower: cheaper in speed), where the space has them.
    - `micro_batch`: this knob sets the micro-batch (one knob): the search sizes it to the memory, `measured` gives
      the value a measurement ran (a probed `max`: the one the probe settled on).
    - `export(fmt, plan, device)`: the fields of an export format ("hf": TrainingArguments, "accelerate": its
      config) that carry this knob's setting; `hook_only` the setting no format carries, which only trainscout's
      runtime hook applies (its list ordered by `hook_rank`), and `without_hook` the value a stock Trainer runs
      instead.
    - `column`: its place among the knob columns `trainscout results` prints (0: only in csv/json); `demo`: the
      value the CPU demo search fixes (None: searched).

    Parallelism: a knob whose value is the degree of a device-mesh dimension names it in `mesh_dim` (one of
    spaces.parallel.DIMS: "pp", "cp", "tp"); resolve() writes the degrees into Plan.mesh, the batch splits over what
    the degrees leave of the world, and transforms that take a `dims` keyword get the trial's ParallelDims (its
    DeviceMesh). `wrap_step` may change one micro-batch's forward and backward (context parallel shards the tokens).
    Exports: `formats` (None: the engine's) are the formats that carry the knob set away from its default,
    `not_carried` why the others cannot, `launcher` the least launcher it needs (trial.engines.LAUNCHERS).
    """

    name: ClassVar[str]
    default: ClassVar[Any]
    choices: ClassVar[tuple]
    requires: ClassVar[dict[str, tuple]] = {}
    stage: ClassVar[str | None] = None
    order: ClassVar[int] = 0  # within a stage (and among optimizer hooks): lower runs first (spaces.knob.in_order)
    packages: ClassVar[tuple[str, ...]] = ()
    reference: ClassVar[Any] = None  # the value the quality gate's reference runs (None: the default)
    # roles (the docstring's last paragraph)
    start: ClassVar[tuple[int, Any] | None] = None
    start_follows: ClassVar[bool] = False
    savers: ClassVar[tuple[tuple[int, dict], ...]] = ()
    micro_batch: ClassVar[bool] = False
    without_hook: ClassVar[Any] = None
    hook_rank: ClassVar[int] = 0
    column: ClassVar[int] = 0
    demo: ClassVar[Any] = None
    # the knob also takes "auto", never searched: `concrete` decides what it runs (compile_scope, experts,
    # optimizer_impl)
    auto: ClassVar[bool] = False
    mesh_dim: ClassVar[str | None] = None  # the device-mesh dimension this knob's value is the degree of
    formats: ClassVar[tuple[str, ...] | None] = None  # export formats that carry it when set (None: the engine's)
    not_carried: ClassVar[str] = ""  # why the other formats cannot, with the fix
    launcher: ClassVar[str | None] = None  # the least launcher an export needs when set (None: the engine's)

    @property
    def description(self) -> str:
        """The first line of the knob's docstring (`trainscout knobs` prints it)."""
        return (self.__doc__ or "").strip().splitlines()[0]

    # --- values -------------------------------------------------------------------------------------------
    def parse(self, raw: Any) -> Any:
        """A value from a CLI string or a YAML scalar; ConfigError when it is not in the domain."""
        if self.auto and isinstance(raw, str) and raw.strip().lower() == "auto":
            return "auto"
        if isinstance(raw, str):
            low = raw.strip().lower()
            for c in self.choices:
                if fmt(c).lower() == low:
                    return c
            if all(isinstance(c, bool) for c in self.choices):
                if low in _TRUE:
                    return True
                if low in _FALSE:
                    return False
            raise self.bad(raw)
        if isinstance(raw, float) and not math.isfinite(raw):
            raise self.bad(raw)
        if isinstance(raw, bool) and not any(isinstance(c, bool) for c in self.choices):
            # YAML 1.1 reads a bare off/on/no/yes as a boolean: take it back as the word the domain uses
            words = _TRUE | {"on"} if raw else _FALSE | {"off"}
            for c in self.choices:
                if isinstance(c, str) and c.lower() in words:
                    return c
        for c in self.choices:
            if type(c) is type(raw) and c == raw:
                return c
        raise self.bad(raw)

    def bad(self, raw: Any) -> ConfigError:
        """The error for a value outside the domain, listing the choices."""
        return ConfigError(self.name, f"{self.name}={fmt(raw)!s} is not allowed: choose one of {self.domain_text()}")

    def domain_text(self) -> str:
        """The choices as one string: none|full|2 (auto|... where the knob also takes auto)."""
        return "|".join(["auto"] * self.auto + [fmt(c) for c in self.choices])

    # --- rules --------------------------------------------------------------------------------------------
    def is_set(self, value: Any) -> bool:
        """True when value is not the knob's default."""
        return value != self.default

    def applies(self, cfg: dict) -> bool:
        """True when every knob this one requires has an allowed value in cfg."""
        return all(cfg.get(k, REGISTRY[k].default) in allowed for k, allowed in self.requires.items())

    def default_for(self, ctx: Context) -> Any:
        """The value this knob takes when nothing sets it, in this context: its default, unless the model cannot run
        that (a model without the default attention kernel gets one it has); resolve() fills unset knobs with it."""
        return self.default

    def concrete(self, value: Any, cfg: dict, ctx: Context) -> Any:
        """The value the trial runs with (a knob with an "auto" value decides it here from the context)."""
        return value

    def check(self, value: Any, cfg: dict, ctx: Context) -> None:
        """Rules that need the context; raise ConfigError naming the fix."""

    def numerics(self, value: Any, cfg: dict, ctx: Context) -> str | None:
        """Why training with this value computes other numbers than with the reference value (None: the same)."""
        return None

    def reference_value(self) -> Any:
        """The value the quality gate's reference configuration runs."""
        return self.default if self.reference is None else self.reference

    # --- plan -------------------------------------------------------------------------------------------
    def apply(self, plan: Plan, value: Any, cfg: dict, ctx: Context) -> None:
        """Write this knob's value into the plan: a setting only this knob's own hooks read goes into
        plan.knobs[self.name]; the plan's fields are what the engines, the model build and the memory model read."""
        raise NotImplementedError

    # --- runtime ------------------------------------------------------------------------------------------
    def transform(self, model, plan: Plan):
        """Change the model as the plan says (at this knob's stage); return the model (the same or a new one). A knob
        that declares `transform(self, model, plan, dims=None)` is given the trial's spaces.parallel.ParallelDims."""
        return model

    def wrap_step(self, step, plan: Plan, dims):
        """One micro-batch's forward and backward as this knob runs it: `step(model, batch, scale, **loss_kwargs)`
        returns the loss (loss_kwargs go to the model's forward and loss); return `step` itself to change nothing."""
        return step

    def memory(self, terms: dict, plan: Plan, spec) -> None:
        """Adjust the memory model's bytes for one micro-batch (terms "activations" and "logits") in place; the rank's
        parameters are there too ("params" held, "layer_params" of one decoder layer, "layers" held; the model
        states follow them) and what the activations hold of the decoder layers ("layer_activations"). `spec` is the
        trial.records.TrialSpec or stored Record (its recipe's seq_len: the rank's tokens under context parallel)."""

    def optimizer(self, spec: dict, plan: Plan) -> dict:
        """The optimizer as this knob builds it: `spec` is {"cls": the torch optimizer class, "kwargs": its keyword
        arguments (lr, betas, weight_decay, ...), "device": the rank's device type ("cpu", "cuda"; None where the
        memory model or predictor.dtypes read it), "states": what its state tensors are, as the record's dtypes name them
        ("float32", "bfloat16", "8bit", ...), "bytes": their bytes per parameter (the memory model's optimizer
        term)}. Every engine's optimizer passes through every knob's hook (trial.engines.base.optimizer_spec), in
        `in_order`; return the spec (changed or not)."""
        return spec

    # --- roles --------------------------------------------------------------------------------------------
    def measured(self, value: Any, plan: Plan | None) -> Any:
        """The value a measurement with this setting ran (its record's plan says what an open value became)."""
        return value

    def export(self, fmt: str, plan: Plan, device: str) -> dict:
        """The fields of export format `fmt` ("hf": TrainingArguments, "accelerate": accelerate's config) that carry
        this knob's setting ({}: that format has none)."""
        return {}

    def hook_only(self, value: Any, plan: Plan, stock) -> str | None:
        """The setting, as knob=value, where no export format carries it and only trainscout's runtime hook applies
        it (None: carried, or off); `stock` is trainscout.runtime.hf, which says what the installed transformers does
        itself. By default: any value but `without_hook`, for a knob that has one."""
        if self.without_hook is None or value == self.without_hook:
            return None
        return f"{self.name}={value}"
