"""Knobs from other installed packages (the entry-point group `trainscout.knobs`), each loaded on its own.

A plugin that fails to import, whose knob collides with a registered name, has no `apply`, changes nothing (no value
away from its default changes the plan its `apply` writes, and it overrides none of Knob's runtime hooks:
transform, wrap_step, memory, optimizer), requires a knob no one registers or a value outside that knob's domain,
or raises when its domain, default, description, requirements or `apply` at its default are read, is left out with one
warning naming its package, its entry point and the error; every other knob works (`trainscout knobs` included: an
unguarded `ep.load()` made every command end in the plugin's traceback). A plugin knob that raises later, for a value or
a model it is given, is named the same way where that happens: `parse`, `concrete`, `check`, `apply` as bad input for
that knob (`call`), `transform` and `optimizer` as the trial's crash, `memory` left out of the memory model with a
warning.
"""
from __future__ import annotations

import sys
from typing import Any

from .errors import ConfigError
from .knob import REGISTRY, RUNTIME_HOOKS, STAGES, Knob, fmt
from .plan import Context, Plan

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
                    f"{them.domain_text()}")
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


def contract_problem(knob: Knob) -> str | None:
    """What makes a plugin knob unusable, read without a model or a GPU (None: nothing): its name, domain, default,
    description, stage, requirements, and its `apply` at its default value."""
    name = getattr(knob, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        return f"has no valid name ({name!r})"
    if type(knob).apply is Knob.apply:
        return "has no apply (how its value changes the plan)"
    choices = tuple(knob.choices)
    if not choices:
        return "has no choices"
    for c in choices:
        if knob.parse(fmt(c)) != c:
            return f"does not read back its choice {fmt(c)!r}"
    knob.parse(fmt(knob.default))
    str(knob.description), knob.domain_text()
    if knob.stage is not None and knob.stage not in STAGES:
        return f"declares stage {knob.stage!r}: use one of {', '.join(STAGES)}"
    requires = dict(knob.requires)
    for other, allowed in requires.items():
        tuple(allowed)
    cfg = {k.name: k.default for k in REGISTRY.values()}
    knob.apply(Plan(), knob.default, cfg, Context())
    if not any(getattr(type(knob), hook) is not getattr(Knob, hook) for hook in RUNTIME_HOOKS) and \
            not any(_changes_plan(knob, v, cfg) for v in choices if v != knob.default):
        return (f"changes nothing: no value of {knob.domain_text()} away from its default {fmt(knob.default)} changes "
                f"what the engines read of the plan, and it has no {', '.join(RUNTIME_HOOKS)} hook to read its own "
                "setting")
    return None


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
    """knob.method(*args); for a plugin's knob a failure other than a ConfigError is a ConfigError naming the
    plugin (parse, concrete, check, apply: bad input for that knob, exit 2)."""
    fn = getattr(knob, method)
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
    return "dims" in inspect.signature(knob.transform).parameters


def transform(knob: Knob, model, plan, dims=None) -> Any:
    """A knob's transform, given `dims` where it takes them; a plugin's that raises fails the trial with an error
    naming the plugin (leaving it out would make the record claim a configuration that did not run)."""
    kw = {"dims": dims} if takes_dims(knob) else {}
    if knob.name not in ORIGIN:
        return knob.transform(model, plan, **kw)
    try:
        return knob.transform(model, plan, **kw)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the knob plugin {ORIGIN[knob.name]} failed in the transform of {knob.name} "
                           f"({_error(e)}): fix it, uninstall it, or set {knob.name}={fmt(knob.default)}") from None


def optimizer(knob: Knob, spec: dict, plan: Plan) -> dict:
    """A knob's optimizer hook; a plugin's that raises fails the trial (or the estimate) naming the plugin, as a
    transform's does: leaving it out would build another optimizer than the record claims."""
    if knob.name not in ORIGIN:
        return knob.optimizer(spec, plan)
    try:
        return knob.optimizer(spec, plan)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the knob plugin {ORIGIN[knob.name]} failed in the optimizer hook of {knob.name} "
                           f"({_error(e)}): fix it, uninstall it, or set {knob.name}={fmt(knob.default)}") from None


def memory(knob: Knob, terms: dict, plan: Plan, spec) -> None:
    """A plugin knob's memory hook; one that raises is left out of the memory model, with a warning."""
    if knob.name not in ORIGIN:
        knob.memory(terms, plan, spec)
        return
    saved = dict(terms)
    try:
        knob.memory(terms, plan, spec)
    except Exception as e:  # noqa: BLE001
        terms.clear()
        terms.update(saved)
        _left_out(f"{ORIGIN[knob.name]}'s memory hook of {knob.name}", e)
