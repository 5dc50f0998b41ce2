"""The Knob base class and the registry. A knob is one file that subclasses Knob and is decorated @register."""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .errors import ConfigError
from .plan import Context, Plan
from .roles import Costs, Export, Numerics, Runtime, Search

REGISTRY: dict[str, "Knob"] = {}
# where a knob's model transform runs, in the order trainscout.runtime applies them (torchtitan's): process settings,
# module swaps, tensor then context parallel, the loss, activation checkpointing, per-layer compile, then (after the
# engine shards the model with FSDP/DDP over the data ranks) whole-model compile
STAGES = ("process", "modules", "tensor_parallel", "context_parallel", "loss", "checkpoint", "compile_layers",
          "sharded")
# the hooks through which a knob changes what a trial builds besides the plan (its Runtime's and its Costs'; a knob
# that overrides none of them and whose values leave the plan as it is changes nothing: spaces.plugins refuses it)
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
    """Knobs in the order their runtime hooks run: by stage (STAGES; no stage last), then by their declared `order`
    within it, then as given (all_knobs(): requirements first, then by name), so no rule between two knobs holds by
    name."""
    def key(k):
        stage = k.runtime.stage
        return STAGES.index(stage) if stage in STAGES else len(STAGES), k.runtime.order
    return sorted(knobs, key=key)


def fmt(value: Any) -> str:
    """A value as the user writes it on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def description(knob: "Knob") -> str:
    """The first line of the knob's docstring (`trainscout knobs` prints it)."""
    return (type(knob).__doc__ or "").strip().splitlines()[0]


def domain_text(knob: "Knob") -> str:
    """The choices as one string: none|full|2 (auto|... where the knob also takes auto)."""
    return "|".join(["auto"] * knob.auto + [fmt(c) for c in knob.choices])


def outside_domain(knob: "Knob", raw: Any) -> ConfigError:
    """The error for a value outside the knob's domain, listing the choices."""
    return ConfigError(knob.name, f"{knob.name}={fmt(raw)!s} is not allowed: choose one of {domain_text(knob)}")


def applies(knob: "Knob", cfg: dict) -> bool:
    """True when every knob this one requires has an allowed value in cfg."""
    return all(cfg.get(k, REGISTRY[k].default) in allowed for k, allowed in knob.requires.items())


def reference_value(knob: "Knob") -> Any:
    """The value the quality gate's reference configuration runs (the knob's Numerics.reference, else its default)."""
    return knob.default if knob.numerics.reference is None else knob.numerics.reference


class Knob:
    """One efficiency setting. Its core: the domain (`name`, `default`, `choices`, `auto`, `parse`), the rules
    (`requires`, `default_for`, `concrete`, `check`) and `apply`, which writes the setting into the plan. The rest are
    roles it composes (spaces/roles.py), each a class attribute holding a role object, left at the default role where
    the knob plays none: `runtime` (its stage and transform, its step, its optimizer hook, the packages it needs, its
    mesh dimension), `costs` (what the predictor reads: its memory hook, its step-time declarations), `numerics` (why
    a value trains other numbers than the reference), `search` (start points, memory savers, the micro-batch, its
    results column, the demo) and `export` (what an export carries of it).

    `choices` is the search domain (fixed across trials, as Optuna requires). `requires` maps another knob's name to
    the values it must have whenever this knob is set away from its default; a knob whose requirements do not hold
    is not sampled. `check` adds rules that need the context (world size, device, model, recipe). `auto`: the knob
    also takes "auto", never searched, which `concrete` decides.
    """

    name: ClassVar[str]
    default: ClassVar[Any]
    choices: ClassVar[tuple]
    auto: ClassVar[bool] = False
    requires: ClassVar[dict[str, tuple]] = {}
    runtime: ClassVar[Runtime] = Runtime()
    costs: ClassVar[Costs] = Costs()
    numerics: ClassVar[Numerics] = Numerics()
    search: ClassVar[Search] = Search()
    export: ClassVar[Export] = Export()

    def parse(self, raw: Any) -> Any:
        """A value from a CLI string or a YAML scalar; ConfigError when it is not in the domain."""
        if self.auto and isinstance(raw, str) and raw.strip().lower() == "auto":
            return "auto"
        if isinstance(raw, str):
            return _parse_word(self, raw)
        if isinstance(raw, float) and not math.isfinite(raw):
            raise outside_domain(self, raw)
        if isinstance(raw, bool) and not any(isinstance(c, bool) for c in self.choices):
            # YAML 1.1 reads a bare off/on/no/yes as a boolean: take it back as the word the domain uses
            words = _TRUE | {"on"} if raw else _FALSE | {"off"}
            for c in self.choices:
                if isinstance(c, str) and c.lower() in words:
                    return c
        for c in self.choices:
            if type(c) is type(raw) and c == raw:
                return c
        raise outside_domain(self, raw)

    def default_for(self, ctx: Context) -> Any:
        """The value this knob takes when nothing sets it, in this context: its default, unless the model cannot run
        that (a model without the default attention kernel gets one it has); resolve() fills unset knobs with it."""
        return self.default

    def concrete(self, value: Any, cfg: dict, ctx: Context) -> Any:
        """The value the trial runs with (a knob with an "auto" value decides it here from the context)."""
        return value

    def check(self, value: Any, cfg: dict, ctx: Context) -> None:
        """Rules that need the context; raise ConfigError naming the fix."""

    def apply(self, plan: Plan, value: Any, cfg: dict, ctx: Context) -> None:
        """Write this knob's value into the plan: a setting only this knob's own roles read goes into
        plan.knobs[self.name]; the plan's fields are what the engines, the model build and the predictor read."""
        raise NotImplementedError


def _parse_word(knob: Knob, raw: str) -> Any:
    """Knob.parse of a string: the choice it spells (any case), or a boolean word for a boolean domain."""
    low = raw.strip().lower()
    for c in knob.choices:
        if fmt(c).lower() == low:
            return c
    if all(isinstance(c, bool) for c in knob.choices):
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise outside_domain(knob, raw)
