"""The calibrations a prediction is made with: the roofline's measured/predicted ratio and the memory model's, from
the measured rows of the same configuration family nearest in parameter count (atlas/families.py's levels)."""
from __future__ import annotations

import math

from .families import LEVELS, changes, differing, memory_level_names
from .samples import Sample

NEAREST_MODELS = 2  # model shapes whose rows calibrate a prediction


def distance(n: float, arch: str, s: Sample) -> float:
    """How far a row's model is from a model of n parameters and this architecture: the log of their size ratio, and
    one more for another architecture."""
    return abs(math.log(n / s.n_params)) + (0.0 if arch == s.arch else 1.0)


def knob_effects(pool: list[Sample]) -> dict[tuple, list[tuple]]:
    """What one knob alone does to the measured/roofline ratio, wherever it was measured: for (knob, value, other)
    the median of log(ratio at value / ratio at other) over the pool's pairs of rows that differ in that knob only
    (the same GPU kind, model shape, GPU count and micro-batch; the knobs it makes act or not with it: compile and
    its scope), one per GPU count and model shape: [(world, parameters, architecture, log)].
    Fit on the pool given: a leave-one-out passes the other models' rows."""
    from collections import defaultdict

    from trainscout.trial.metrics import median
    groups: dict[tuple, list[Sample]] = defaultdict(list)
    for s in pool:
        if s.host_bound:  # its time is the host's: no knob's effect on the GPU's
            continue
        groups[(s.gpu, s.shape, s.world, s.micro)].append(s)
    logs: dict[tuple, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rows in groups.values():
        for i, x in enumerate(rows):
            for y in rows[i + 1:]:
                if len(differing(x.knobs, y.knobs)) != 1:  # the pairs kept, found before building changes
                    continue
                there, back = changes(x.knobs, y.knobs), changes(y.knobs, x.knobs)
                if len(there) == 1:
                    where, d = (x.world, x.n_params, x.arch), math.log(x.ratio / y.ratio)
                    logs[there[0]][where].append(d)
                    logs[back[0]][where].append(-d)
    return {key: sorted((*where, median(ds)) for where, ds in by.items()) for key, by in logs.items()}


def _effect(measured: list[tuple], world: int, n_params: float, arch: str) -> float:
    """A knob change's log effect on the same GPU count, where it was measured nearest in shape (0: never on it)."""
    from trainscout.trial.metrics import median
    same = [m for m in measured if m[0] == world]
    if not same:
        return 0.0
    dist = {m: abs(math.log(n_params / m[1])) + (0.0 if arch == m[2] else 1.0) for m in same}
    near = min(dist.values())
    return median([m[3] for m in same if dist[m] == near])


def corrected(s: Sample, knobs: dict | None, effects: dict | None, world: int = 1, n_params: float = 0.0,
              arch: str = "") -> float:
    """s's ratio carried to a configuration of settings knobs (families.settings) on world GPUs of a model
    (n_params, arch): times each differing knob's measured effect, where it was measured nearest (knob_effects;
    a knob whose change was never measured alone: none)."""
    if not knobs or not effects:
        return s.ratio
    log = sum(_effect(effects[key], world, n_params or s.n_params, arch or s.arch)
              for key in changes(knobs, s.knobs) if key in effects)
    return s.ratio * math.exp(log)


def calibrate(fam: tuple, n_params: float, arch: str, pool: list[Sample], knobs: dict | None = None,
              effects: dict | None = None) -> tuple[float, list[Sample], int] | None:
    """The roofline's measured/predicted ratio for a configuration (fam: family() at every level; knobs: its
    families.settings) of a model (n_params, arch), from the pool: the first level with rows, the rows of its
    NEAREST_MODELS nearest shapes, their median ratio, each carried to the configuration by the effects of the knobs
    it differs in (corrected). (ratio, the rows used, the level); None for an empty pool."""
    from trainscout.trial.metrics import median
    gpu_bound = [s for s in pool if not s.host_bound]
    pool = gpu_bound or pool  # a host-bound row's ratio is the host's, not the GPU's: only where nothing else is
    for level in range(len(LEVELS)):
        same = [s for s in pool if s.fam[level] == fam[level]]
        if not same:
            continue
        shapes = sorted({s.shape: distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        world = dict(fam[0]).get("gpus", 1)
        return median([corrected(s, knobs, effects, world, n_params, arch) for s in used]), used, level
    return None


def _memory_family(fam: tuple, names: tuple) -> tuple:
    full = dict(fam[0])
    return tuple(full[n] for n in names)


def memory_calibration(fam: tuple, n_params: float, arch: str, pool: list[Sample]) -> tuple[dict, int] | None:
    """The memory model's calibration for a configuration, from the measured peaks nearest to it: the first
    MEMORY_LEVELS family with measured peaks, the NEAREST_MODELS nearest shapes, their median measured/analytic
    ratio as predictor/memory.py's calibration (a = b = the ratio, c = 0): closer, over the shipped rows left out one by
    one, than one least-squares fit over all of them (fit_terms; docs/atlas.md).
    (calibration, level); None where the pool has no peak."""
    from trainscout.trial.metrics import median
    for level, names in enumerate(memory_level_names()):
        same = [s for s in pool if s.peak and _memory_family(s.fam, names) == _memory_family(fam, names)]
        if not same:
            continue
        shapes = sorted({s.shape: distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        k = median([s.peak / (s.states + s.acts) for s in used])
        return {"a": k, "b": k, "c": 0.0, "n": len(used), "level": level}, level
    return None


def memory_fit(pool: list[Sample]) -> dict | None:
    """One least-squares calibration of the memory model over the pool's measured peaks (predictor/memory.py
    fit_terms): what the search fits on a store; the leave-one-out table compares it with memory_calibration."""
    from trainscout.predictor import memory
    return memory.fit_terms([(s.states, s.acts, s.peak) for s in pool if s.peak])
