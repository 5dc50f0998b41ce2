"""Knobs from other installed packages (the entry-point group `trainscout.knobs`), each loaded on its own.

A plugin that fails to import, whose knob collides with a registered name, has no `apply`, changes nothing (no value
away from its default changes the plan its `apply` writes, and its roles override none of the runtime hooks:
Runtime.transform, wrap_step, optimizer, Costs.memory), declares a role's member on the knob itself or a role
attribute that holds no role object (spaces/roles.py), requires a knob no one registers or a value outside that
knob's domain, or raises when its domain, default, description, requirements or `apply` at its default are read, is
left out with one warning naming its package, its entry point and the error; every other knob works (`trainscout
knobs` included: an unguarded `ep.load()` made every command end in the plugin's traceback). A plugin knob that
raises later, for a value or a model it is given, is named the same way where that happens: `parse`, `concrete`,
`check`, `apply` as bad input for that knob (`call`), `transform` and `optimizer` as the trial's crash, `memory` left
out of the memory model with a warning.
"""
from __future__ import annotations

import sys
from dataclasses import fields, replace
from typing import Any

from .errors import ConfigError
from .knob import REGISTRY, RUNTIME_HOOKS, STAGES, Knob, description, domain_text, fmt
from .plan import Context, Plan
from .roles import Costs, Export, MemoryTerms, Numerics, OptimizerSpec, Runtime, Search

GROUP = "trainscout.knobs"
ORIGIN: dict[str, str] = {}  # knob name -> "package (entry point NAME = VALUE)" for every plugin knob loaded
PROBLEMS: list[str] = []     # one line per plugin left out, as warned
_warned: set[str] = set()


def load() -> None:
    """Load every plugin of GROUP; the knobs of one that fails are removed from REGISTRY again (a name already
    registered, a built-in's included, makes `register` raise)."""
    from importlib.metadata import entry_points
    for ep in entry_points(group=GROUP):
        before = set(REGISTRY)
        where = _where(ep)
        try:
            ep.load()  # the plugin module registers its knobs on import
            new = [REGISTRY[n] for n in sorted(set(REGISTRY) - before)]
            for knob in new:
                problem = contract_problem(knob)
                if problem:
                    raise ValueError(f"knob {knob.name!r} {problem}")
        except Exception as e:  # noqa: BLE001 - any failure of a plugin leaves that plugin out, named
            for name in set(REGISTRY) - before:
                del REGISTRY[name]
            _left_out(where, e)
            continue
        for name in set(REGISTRY) - before:
            ORIGIN[name] = where
    left = True
    while left:  # until none is left out: a plugin knob another plugin's requires may go too
        left = False
        for name in [n for n in ORIGIN if n in REGISTRY]:
            problem = requires_problem(REGISTRY[name])
            if problem:
                where = ORIGIN.pop(name)
                del REGISTRY[name]
                _left_out(where, ValueError(f"knob {name!r} {problem}"))
                left = True


def requires_problem(knob: Knob) -> str | None:
    """What is wrong with a knob's requires, against the registered knobs (None: nothing): a knob no one registers, or
    a value outside that knob's domain (its choices, its default, auto where it takes it), which no configuration
    has: the knob would never apply, without a word."""
    for other, allowed in dict(knob.requires).items():
        if other not in REGISTRY:
            return f"requires {other}, which no knob registers"
        them = REGISTRY[other]
        domain = (*them.choices, them.default, *(("auto",) if them.auto else ()))
        outside = [v for v in allowed if not any(type(c) is type(v) and c == v for c in domain)]
        if outside:
            return (f"requires {other}={'|'.join(fmt(v) for v in outside)}, outside {other}'s domain "
                    f"{domain_text(them)}")
    return None


def _where(ep) -> str:
    dist = getattr(getattr(ep, "dist", None), "name", None) or "an unknown package"
    return f"{dist} (entry point {ep.name} = {ep.value})"


def _left_out(where: str, e: BaseException) -> None:
    line = f"the knob plugin {where} is left out: {_error(e)}: fix it or uninstall {where.split(' (')[0]}"
    PROBLEMS.append(line)
    if line not in _warned:
        _warned.add(line)
        print(f"trainscout: warning: {line}", file=sys.stderr, flush=True)


def _error(e: BaseException) -> str:
    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


# what a knob declared on itself before its roles held it (a plugin written so would be read as changing nothing)
MOVED = {"runtime": ("stage", "order", "packages", "mesh_dim", "transform", "wrap_step", "optimizer"),
         "costs": ("memory", "head_s", "logits_bytes", "linear_rate", "cast_bytes"),
         "numerics": ("reference",), "search": ("start", "start_follows", "savers", "micro_batch", "measured", "column",
                                                "demo"),
         "export": ("hook_only", "without_hook", "hook_rank", "formats", "not_carried", "launcher")}
ROLES = {"runtime": Runtime, "costs": Costs, "numerics": Numerics, "search": Search, "export": Export}


def contract_problem(knob: Knob) -> str | None:
    """What makes a plugin knob unusable, read without a model or a GPU (None: nothing): its name, its roles, domain,
    default, description, stage, requirements, and its `apply` at its default value."""
    name = knob.name if "name" in dir(type(knob)) else None
    if not isinstance(name, str) or not name.isidentifier():
        return f"has no valid name ({name!r})"
    if type(knob).apply is Knob.apply:
        return "has no apply (how its value changes the plan)"
    problem = role_problem(knob)
    if problem:
        return problem
    choices = tuple(knob.choices)
    if not choices:
        return "has no choices"
    for c in choices:
        if knob.parse(fmt(c)) != c:
            return f"does not read back its choice {fmt(c)!r}"
    knob.parse(fmt(knob.default))
    str(description(knob)), domain_text(knob)
    if knob.runtime.stage is not None and knob.runtime.stage not in STAGES:
        return f"declares stage {knob.runtime.stage!r}: use one of {', '.join(STAGES)}"
    requires = dict(knob.requires)
    for other, allowed in requires.items():
        tuple(allowed)
    cfg = {k.name: k.default for k in REGISTRY.values()}
    knob.apply(Plan(), knob.default, cfg, Context())
    if not overridden_hooks(knob) and not any(_changes_plan(knob, v, cfg) for v in choices if v != knob.default):
        return (f"changes nothing: no value of {domain_text(knob)} away from its default {fmt(knob.default)} changes "
                f"what the engines read of the plan, and its roles have no {', '.join(RUNTIME_HOOKS)} hook to read "
                "its own setting")
    return None


def role_problem(knob: Knob) -> str | None:
    """A role attribute that holds no role object, or a role's member declared on the knob itself (None: neither)."""
    held = {"runtime": knob.runtime, "costs": knob.costs, "numerics": knob.numerics, "search": knob.search,
            "export": knob.export}
    for role, cls in ROLES.items():
        if not isinstance(held[role], cls):
            return f"declares {role} as {type(held[role]).__name__}, not a spaces.roles.{cls.__name__} object"
    members = set(dir(type(knob)))
    for role, names in MOVED.items():
        on_knob = [n for n in names if n in members]
        if on_knob:
            return (f"declares {', '.join(on_knob)} on the knob: {'they belong' if len(on_knob) > 1 else 'it belongs'} "
                    f"to its {role} role, a spaces.roles.{ROLES[role].__name__} object (docs/KNOBS.md)")
    return None


def overridden_hooks(knob: Knob) -> list[str]:
    """The runtime hooks (RUNTIME_HOOKS) a knob's roles override: its Runtime's transform, wrap_step and optimizer,
    its Costs' memory."""
    run, costs = type(knob.runtime), type(knob.costs)
    mine = {"transform": run.transform is not Runtime.transform, "wrap_step": run.wrap_step is not Runtime.wrap_step,
            "memory": costs.memory is not Costs.memory, "optimizer": run.optimizer is not Runtime.optimizer}
    return [hook for hook in RUNTIME_HOOKS if mine[hook]]


def _changes_plan(knob: Knob, value, cfg: dict) -> bool:
    """Whether apply at value writes another plan than at the default, in what the engines, the model build and the
    memory model read (plan.knobs is read only by knobs' own hooks, plan.notes by nobody): True where this context
    cannot tell (apply refuses the value here)."""
    plans = []
    for v in (knob.default, value):
        plan = Plan()
        try:
            knob.apply(plan, v, dict(cfg, **{knob.name: v}), Context())
        except ConfigError:
            return True
        plans.append({k: v for k, v in plan.to_dict().items() if k not in ("knobs", "notes")})
    return plans[0] != plans[1]


def call(knob: Knob, method: str, *args) -> Any:
    """knob.method(*args), method one of its core's parse, concrete, check, apply; for a plugin's knob a failure
    other than a ConfigError is a ConfigError naming the plugin (bad input for that knob, exit 2)."""
    fn = {"parse": knob.parse, "concrete": knob.concrete, "check": knob.check, "apply": knob.apply}[method]
    if knob.name not in ORIGIN:
        return fn(*args)
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(knob.name, f"{knob.name}: the knob plugin {ORIGIN[knob.name]} failed in {method} "
                                     f"({_error(e)}): fix it, uninstall it, or leave {knob.name} at "
                                     f"{fmt(knob.default)}") from None


def takes_dims(knob: Knob) -> bool:
    """Whether the knob's transform takes the trial's ParallelDims (a `dims` keyword); older knobs take (model,
    plan)."""
    import inspect
    return "dims" in inspect.signature(knob.runtime.transform).parameters


def transform(knob: Knob, model, plan, dims=None) -> Any:
    """A knob's transform, given `dims` where it takes them; a plugin's that raises fails the trial with an error
    naming the plugin (leaving it out would make the record claim a configuration that did not run)."""
    kw = {"dims": dims} if takes_dims(knob) else {}
    if knob.name not in ORIGIN:
        return knob.runtime.transform(model, plan, **kw)
    try:
        return knob.runtime.transform(model, plan, **kw)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the knob plugin {ORIGIN[knob.name]} failed in the transform of {knob.name} "
                           f"({_error(e)}): fix it, uninstall it, or set {knob.name}={fmt(knob.default)}") from None


def optimizer(knob: Knob, spec: OptimizerSpec, plan: Plan) -> OptimizerSpec:
    """A knob's optimizer hook; a plugin's that raises fails the trial (or the estimate) naming the plugin, as a
    transform's does: leaving it out would build another optimizer than the record claims."""
    if knob.name not in ORIGIN:
        return knob.runtime.optimizer(spec, plan)
    try:
        return knob.runtime.optimizer(spec, plan)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the knob plugin {ORIGIN[knob.name]} failed in the optimizer hook of {knob.name} "
                           f"({_error(e)}): fix it, uninstall it, or set {knob.name}={fmt(knob.default)}") from None


def memory(knob: Knob, terms: MemoryTerms, plan: Plan, spec) -> None:
    """A knob's memory hook (its Costs.memory); a plugin's that raises is left out of the memory model (its changes
    to the terms undone), with a warning."""
    if knob.name not in ORIGIN:
        knob.costs.memory(terms, plan, spec)
        return
    saved = replace(terms)
    try:
        knob.costs.memory(terms, plan, spec)
    except Exception as e:  # noqa: BLE001
        for f in fields(terms):
            setattr(terms, f.name, getattr(saved, f.name))
        _left_out(f"{ORIGIN[knob.name]}'s memory hook of {knob.name}", e)
