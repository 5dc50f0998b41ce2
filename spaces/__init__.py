"""The knob space: what may be tried, when it applies, and how it changes the training plan.

`resolve(settings, ctx)` is the one place where constraints are checked: it parses every value, fills the
defaults, refuses impossible combinations with an error naming the fix (never repairs them), and returns the
canonical configuration with the plan the trial worker runs.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
import threading
from typing import Any

from .errors import ConfigError
from .knob import REGISTRY, Knob, applies, description, domain_text, fmt, reference_value, register
from . import plugins
from .parallel import ParallelDims, degrees
from .plan import Context, Plan

__all__ = ["ConfigError", "Context", "Knob", "ParallelDims", "Plan", "REGISTRY", "RETIRED", "all_knobs", "applies",
           "current", "description", "domain_text", "get", "memory_savers", "micro_batch", "reference_value",
           "register", "resolve", "fmt"]

# settings the first records hold that are no knob any more, and why a configuration today runs without them
RETIRED = {"compile_mode": "torch.compile's mode: every compiled trial ran its default, and `compile` says whether "
                           "one was compiled"}


def current(config: dict) -> tuple[dict, list[str]]:
    """(a stored configuration without the settings that are no knob any more, a note for each one left out)."""
    kept = {k: v for k, v in config.items() if k not in RETIRED}
    return kept, [f"{k}={fmt(v)} left out: {RETIRED[k]}" for k, v in config.items() if k in RETIRED]


_loaded = False
_lock = threading.RLock()


def _load() -> None:
    """Import every built-in knob file, then the knobs of installed plugins (entry-point group trainscout.knobs;
    spaces.plugins: a plugin that fails is named and left out). Thread-safe: a second thread waits until the registry is
    complete (trials started from threads share it)."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        builtin = importlib.import_module(f"{__name__}.knobs")
        for mod in pkgutil.iter_modules(builtin.__path__):
            importlib.import_module(f"{builtin.__name__}.{mod.name}")
        plugins.load()  # each on its own: a broken one is named and left out, the rest load
        _loaded = True


_ORDER: dict[tuple, list] = {}  # the registry's knobs (their identities, in registration order) -> their order


def all_knobs() -> list[Knob]:
    """Every registered knob, in the order they are applied and sampled (requirements first). The order is
    computed once per registry content (a plugin or a test's knob registered or removed: computed again)."""
    _load()
    key = tuple(map(id, REGISTRY.values()))
    got = _ORDER.get(key)
    if got is None:
        if len(_ORDER) > 64:
            _ORDER.clear()
        got = _ORDER[key] = _ordered()
    return list(got)


def _ordered() -> list[Knob]:
    done: list[Knob] = []
    pending = sorted(REGISTRY.values(), key=lambda k: k.name)
    while pending:
        ready = [k for k in pending if all(REGISTRY[r] in done for r in k.requires)]
        if not ready:
            raise RuntimeError(f"knob requirements form a cycle: {[k.name for k in pending]}")
        done += ready
        pending = [k for k in pending if k not in ready]
    return done


def micro_batch() -> Knob:
    """The knob that sets the micro-batch (its Search.micro_batch)."""
    return next(k for k in all_knobs() if k.search.micro_batch)


def memory_savers() -> list[dict]:
    """Every knob's memory savers (its Search.savers), cheapest first: the settings each adds."""
    return [settings for _, settings in sorted((s for k in all_knobs() for s in k.search.savers), key=lambda s: s[0])]


def get(name: str) -> Knob:
    """The registered knob of that name; a ConfigError when there is none (naming a close match, if any)."""
    _load()
    if name not in REGISTRY:
        near = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(name, f"unknown knob {name!r}{hint}: run `trainscout knobs` to list them (a plugin's knob "
                                f"needs its package installed: `trainscout knobs` names the plugins that loaded)")
    return REGISTRY[name]


def requirement_error(knob: Knob, value: Any, cfg: dict) -> ConfigError | None:
    """The error for a knob set while a knob it requires has another value, or None."""
    for other, allowed in knob.requires.items():
        got = cfg[other]
        if got not in allowed:
            want = "|".join(fmt(a) for a in allowed)
            return ConfigError(knob.name, f"{knob.name}={fmt(value)} needs {other}={want} (got {fmt(got)}): "
                                          f"set {other}={fmt(allowed[-1])} or {knob.name}={fmt(knob.default)}")
    return None


def mesh_error(cfg: dict, ctx: Context) -> ConfigError | None:
    """The error for parallel degrees (the knobs' mesh_dim) whose product does not divide the ranks, or None."""
    degs = degrees(cfg)
    knobs = [k for k in REGISTRY.values() if k.runtime.mesh_dim in degs and cfg.get(k.name, k.default) != k.default]
    other = 1
    for d in degs.values():
        other *= d
    if not knobs or ctx.world_size % other == 0:
        return None
    set_ = " x ".join(f"{k.name}={fmt(cfg[k.name])}" for k in knobs)
    return ConfigError(knobs[-1].name, f"{set_} = {other} ranks per data-parallel replica does not divide the "
                                       f"{ctx.world_size} ranks: choose degrees whose product divides {ctx.world_size}")


def resolve(settings: dict[str, Any], ctx: Context, order: list[Knob] | None = None) -> tuple[dict[str, Any], Plan]:
    """Validate knob settings against the context; return (canonical config, plan). Raises ConfigError.

    In phases, so that no rule depends on the order the knobs come in: parse, requirements; then every knob
    concretises its value from the parsed settings ("auto" decided: compile_scope, micro_batch_size); then every
    rule is checked against the concretised configuration (where several fail, the first in all_knobs() order is
    the one reported); then every knob writes the plan. Checked and concretised in one pass, sdpa_backend's rule read a
    concretised compile_scope only because "c" < "s". `order` (tests): the knobs in another order, same answer."""
    canonical = all_knobs()  # requirements first, then by name: the order rules are checked and errors reported in
    order = order or canonical
    cfg: dict[str, Any] = {k.name: k.default_for(ctx) for k in canonical}
    for name, raw in settings.items():
        cfg[name] = plugins.call(get(name), "parse", raw)
    for k in canonical:
        if cfg[k.name] != k.default and (err := requirement_error(k, cfg[k.name], cfg)):
            raise err
    parsed = dict(cfg)
    for k in order:  # a plugin knob that fails here is a ConfigError naming the plugin (plugins.call)
        cfg[k.name] = plugins.call(k, "concrete", parsed[k.name], parsed, ctx)
    for k in canonical:
        plugins.call(k, "check", cfg[k.name], cfg, ctx)
    if (err := mesh_error(cfg, ctx)):
        raise err
    plan = Plan()
    for k in order:
        plugins.call(k, "apply", plan, cfg[k.name], cfg, ctx)
    plan.mesh = degrees(cfg)  # the knobs' mesh_dim degrees: what ParallelDims.of builds the mesh from
    return cfg, plan
