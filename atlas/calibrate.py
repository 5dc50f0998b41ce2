"""The calibrations a prediction is made with: the roofline's measured/predicted ratio and the memory model's, from
the measured rows of the same configuration family nearest in parameter count (atlas/families.py's levels)."""
from __future__ import annotations

import math

from .families import LEVELS, _memory_level_names
from .samples import Sample

NEAREST_MODELS = 2  # model shapes whose rows calibrate a prediction


def _distance(n: float, arch: str, s: Sample) -> float:
    return abs(math.log(n / s.n_params)) + (0.0 if arch == s.arch else 1.0)


def calibrate(fam: tuple, n_params: float, arch: str, pool: list[Sample]) -> tuple[float, list[Sample], int] | None:
    """The roofline's measured/predicted ratio for a configuration (fam: family() at every level) of a model
    (n_params, arch), from the pool: the first level with rows, the rows of its NEAREST_MODELS nearest shapes,
    their median ratio. (ratio, the rows used, the level); None for an empty pool."""
    from trainscout.trial.metrics import median
    for level in range(len(LEVELS)):
        same = [s for s in pool if s.fam[level] == fam[level]]
        if not same:
            continue
        shapes = sorted({s.shape: _distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        return median([s.ratio for s in used]), used, level
    return None


def _memory_family(fam: tuple, names: tuple) -> tuple:
    full = dict(fam[0])
    return tuple(full[n] for n in names)


def memory_calibration(fam: tuple, n_params: float, arch: str, pool: list[Sample]) -> tuple[dict, int] | None:
    """The memory model's calibration for a configuration, from the measured peaks nearest to it: the first
    MEMORY_LEVELS family with measured peaks, the NEAREST_MODELS nearest shapes, their median measured/analytic
    ratio as trial/memory.py's calibration (a = b = the ratio, c = 0). Leave-one-out over the shipped H200 rows:
    median |error| 2.0 % against 10.2 % for one least-squares fit over all of them (fit_terms), whose worst rows
    are the ones the analytic terms model least (the whole model compiled, checkpointing with a compiled loss).
    (calibration, level); None where the pool has no peak."""
    from trainscout.trial.metrics import median
    for level, names in enumerate(_memory_level_names()):
        same = [s for s in pool if s.peak and _memory_family(s.fam, names) == _memory_family(fam, names)]
        if not same:
            continue
        shapes = sorted({s.shape: _distance(n_params, arch, s) for s in same}.items(), key=lambda kv: (kv[1], kv[0]))
        near = {shape for shape, _ in shapes[:NEAREST_MODELS]}
        used = [s for s in same if s.shape in near]
        k = median([s.peak / (s.states + s.acts) for s in used])
        return {"a": k, "b": k, "c": 0.0, "n": len(used), "level": level}, level
    return None


def memory_fit(pool: list[Sample]) -> dict | None:
    """One least-squares calibration of the memory model over the pool's measured peaks (trial/memory.py
    fit_terms): what the search fits on a store; the leave-one-out table compares it with memory_calibration."""
    from trainscout.trial import memory
    return memory.fit_terms([(s.states, s.acts, s.peak) for s in pool if s.peak])
