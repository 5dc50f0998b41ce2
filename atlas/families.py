"""Configuration families: what a measured row and a configuration to predict are grouped by, level by level, read
from the knobs' own declarations (spaces.Knob), and a configuration in a few words."""
from __future__ import annotations

from trainscout.spaces.plan import Plan


# What a family is made of comes from the knobs' own declarations (spaces.Knob), never from a list of names here: a
# knob added in its own file (a plugin's included) is a dimension of every family at once. Besides the knobs: the
# GPU count, the engine that ran it (Plan.engine) and the architecture's family (dense or a mixture of experts, from
# the model's config). The levels drop dimensions by the role a knob declares, most specific first:
#   0  every knob but the micro-batch's (`micro_batch`: never part of a family)
#   1  the knobs with a declared effect on speed, memory, parallelism or numbers: `start`, `savers`, `mesh_dim`,
#      a `numerics` of their own (attention, the SDPA backend, an expert kernel, a compile scope, a pipeline's
#      schedule: left out)
#   2  less the memory savers that are not also a parallel degree or a numerics change (`savers`)
#   3  the start-point knobs and the numerics ones (no engine, no parallel degree)
#   4  the start-point knobs alone (what is compiled, the loss kernel, fp8) and the architecture's family
#   5  the architecture's family alone (a mixture of experts is calibrated on dense rows only where no mixture
#      of experts was measured on that GPU kind)
#   6  any row
DENSE, MOE = "dense", "MoE"
FIXED = ("gpus", "engine", "arch")  # the dimensions that are not knobs


def _roles() -> dict[str, set[str]]:
    """Knob names by declared role (spaces.Knob): start, savers, mesh, numerics, and every family knob."""
    from trainscout.spaces import all_knobs
    from trainscout.spaces.roles import Numerics
    knobs = [k for k in all_knobs() if not k.search.micro_batch]
    return {"all": {k.name for k in knobs},
            "start": {k.name for k in knobs if k.search.start},
            "savers": {k.name for k in knobs if k.search.savers},
            "mesh": {k.name for k in knobs if k.runtime.mesh_dim},
            "numerics": {k.name for k in knobs if type(k.numerics).why is not Numerics.why}}


def _level_names() -> tuple[tuple[str, ...], ...]:
    r = _roles()
    order = [k for k in sorted(r["all"])]
    pick = lambda names: tuple(n for n in order if n in names)  # noqa: E731
    effect = r["start"] | r["savers"] | r["mesh"] | r["numerics"]
    return (
        (*FIXED, *pick(r["all"])),
        (*FIXED, *pick(effect)),
        (*FIXED, *pick(effect - (r["savers"] - r["mesh"] - r["numerics"]))),
        ("gpus", "arch", *pick(r["start"] | r["numerics"])),
        ("arch", *pick(r["start"])),
        ("arch",),
        (),
    )


def memory_level_names() -> tuple[tuple[str, ...], ...]:
    """What a measured peak carries to another model: the engine, its savers and parallel degrees, what is compiled
    (the start-point knobs), then less and less."""
    r = _roles()
    order = sorted(r["all"])
    pick = lambda names: tuple(n for n in order if n in names)  # noqa: E731
    effect = r["start"] | r["savers"] | r["mesh"] | r["numerics"]
    return (
        (*FIXED, *pick(effect)),
        (*FIXED, *pick(r["start"] | r["savers"] | r["mesh"])),
        ("engine", "arch", *pick(r["savers"] | r["mesh"] | r["start"])),
        ("engine", "arch", *pick(r["savers"] | r["mesh"])),
        ("arch",),
        (),
    )


LEVELS = _level_names()
LEVEL_WORDS = ("the same GPU count, engine, architecture family and every knob",
               "the same GPU count, engine, architecture family and the knobs with a declared effect (start points, "
               "memory savers, parallel degrees, numerics)",
               "as level 1, the memory savers aside",
               "the same GPU count, architecture family, start-point and numerics knobs",
               "the same architecture family and start-point knobs",
               "the same architecture family",
               "any row")
MEMORY_LEVELS = memory_level_names()


def plan_of(rec: dict) -> Plan:
    """A stored record's plan (a row's "record"), read as today's Plan whatever form it was stored in."""
    return Plan.from_dict(rec.get("plan") or {})


def arch_family(model_config: dict | None) -> str:
    """dense, or MoE for a mixture of experts: routed experts under any spelling transformers' families use
    (spaces.model_config.EXPERTS; read from the dict, so lookup imports no torch for it)."""
    from trainscout.spaces.model_config import EXPERTS
    cfg = model_config or {}
    return MOE if any(cfg.get(k) for k in EXPERTS) else DENSE


def _dims(config: dict, plan: Plan, world_size: int, arch: str) -> dict:
    from trainscout.spaces import all_knobs
    out = {"gpus": world_size, "engine": plan.engine, "arch": arch}
    for k in all_knobs():
        if not k.search.micro_batch:
            v = config.get(k.name, k.default)
            out[k.name] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out


def settings(config: dict, plan: Plan | None = None) -> dict:
    """The knobs' values as they act (the micro-batch's aside): a knob whose requirements the configuration does not
    meet (spaces.applies: a compile scope without compile) has none; an "auto" the plan resolved (a plan's
    attribute of the knob's name) is what the plan ran. What a knob-effect pair compares (calibrate.knob_effects)."""
    from trainscout.spaces import all_knobs, applies
    out = {}
    for k in all_knobs():
        if not k.search.micro_batch:
            v = config.get(k.name, k.default) if applies(k, config) else None
            if k.auto and v == "auto" and plan is not None:
                v = getattr(plan, k.name, v)
            out[k.name] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
    return out


def differing(to: dict, other: dict) -> list[str]:
    """The knobs set (not None) in both settings whose values differ."""
    return [k for k, v in to.items() if v is not None and (w := other.get(k)) is not None and v != w]


def changes(to: dict, other: dict) -> list[tuple]:
    """The knob changes from settings other to settings to: (knob, its value in to, in other, the knobs it makes
    act or not: ((knob, value in to, value in other), ...)) for each knob set in both that differs (differing)."""
    from trainscout.spaces import all_knobs
    needs = {k.name: set(k.requires) for k in all_knobs()}
    out = []
    for k in differing(to, other):
        kids = tuple((c, to.get(c), other.get(c)) for c in sorted(to) if k in needs.get(c, ())
                     and to.get(c) != other.get(c) and (to.get(c) is None or other.get(c) is None))
        out.append((k, to[k], other[k], kids))
    return out


def family(config: dict, plan: Plan, world_size: int, level: int = 0, arch: str = DENSE) -> tuple:
    """A configuration's family at a level of LEVELS (micro-batch and accumulation are never part of it)."""
    dims = _dims(config, plan, world_size, arch)
    return tuple((name, dims.get(name)) for name in _level_names()[level])  # the knobs registered now


def families(config: dict, plan: Plan, world_size: int, arch: str) -> tuple:
    """family() at every level."""
    dims = _dims(config, plan, world_size, arch)
    return tuple(tuple((name, dims.get(name)) for name in names) for names in _level_names())


def describe(config: dict, plan: Plan) -> str:
    """A configuration in a few words: the engine, the knobs set away from their defaults (as `--set` writes
    them), and the micro-batch it ran."""
    from trainscout.spaces import all_knobs, applies, fmt
    parts, mbs = [], None
    for k in all_knobs():
        v = config.get(k.name, k.default)
        if k.search.micro_batch:
            mbs = k.search.measured(v, plan)
            mbs = f"mbs {fmt(mbs)}" + (" (probed)" if mbs != v else "")
        elif v != k.default and applies(k, config):
            parts.append(f"{k.name}={fmt(v)}")
    return ", ".join(p for p in (*parts, mbs) if p)
