"""Proposals chosen before any GPU time is spent on them: the unmeasured neighbours of the best configuration a
search has measured (one searched knob changed), best predicted first, while one is predicted within MARGIN of it.

A neighbour's predicted throughput is the best one's times the effect of its change: the effect measured by the
search where it holds a pair of trials that differ in that change alone (the geometric mean of such pairs), else
the ratio of the two configurations' step times predicted by predictor/steptime.py. A neighbour that this model
refuses or the memory model predicts not to fit (predict returns None) is not proposed; a predicted throughput is
never above the ceiling of the host's floor (ceiling: tokens per step over steptime.host_s, ZeRO-3's hooks, which
the step-time ratio does not see); ties are broken in a
seeded random order. When no neighbour is left within MARGIN the sampler proposes, and a better configuration it
finds has its own neighbours ranked next.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable

# the outcomes a study holds as FAIL or PRUNED that ran or were refused (search/outcomes.py: INFEASIBLE and pruned);
# (the store's status strings)
INFEASIBLE_STATUSES = ("invalid", "oom", "crash", "timeout", "pruned")
MARGIN = 0.05  # a change predicted slower than this is left to the sampler: the step-time model is rough
# the sampler's last WIDEN draws refused before running (invalid or pruned: its random start in a space most of whose
# combinations are refused): the best's next neighbour is proposed whatever its prediction. OLMoE-1B-7B's cold search
# on an H100 drew 75 invalid configurations of 92 and stopped drawing 70 s before its budget (2026-12-06)
WIDEN = 5


def params_key(params: dict) -> str:
    """A configuration's parameters as one string: equal parameters, equal keys."""
    return json.dumps(params, sort_keys=True, default=str)


def _by_knob(trial):
    """A copy of an Optuna trial whose parameters are named by knob (search.space.knob_params)."""
    import copy

    from .space import knob_params
    out = copy.copy(trial)
    out.params = knob_params(trial.params)
    return out


class Ranker:
    """Ranks the neighbours of a search's best measured configuration; see the module docstring."""

    def __init__(self, space, predict_s: Callable[[dict], float | None], seed: int = 0,
                 ceiling: Callable[[dict], float | None] | None = None):
        self.space, self.predict_s, self.rng = space, predict_s, random.Random(seed)
        self.ceiling = ceiling  # params -> the most tokens/s the host's floor allows (None: no floor)
        self._predicted: dict[str, float | None] = {}
        self._params: dict[str, dict | None] = {}

    def params(self, point: dict) -> dict | None:
        """The parameters the sampler would hold for point (its knobs that apply, by knob name), None where point is
        incomplete or refused by the rules."""
        from trainscout.spaces import ConfigError

        from .space import knob_params
        k = params_key(point)
        if k not in self._params:
            try:
                self._params[k] = knob_params(self.space.params_of(point))
            except ConfigError:  # a knob that applies here has no value in point, or the rules refuse one
                self._params[k] = None
        return self._params[k]

    def step_s(self, params: dict) -> float | None:
        """The predicted step time of params (cached), None where it cannot run here."""
        k = params_key(params)
        if k not in self._predicted:
            self._predicted[k] = self.predict_s(params)
        return self._predicted[k]

    def neighbours(self, params: dict) -> list[tuple[str, dict]]:
        """(changed knob, parameters) of each configuration one searched knob away from params."""
        from trainscout.spaces import get
        full = {k: params.get(k, get(k).default if get(k).default in dom else dom[0])
                for k, dom in self.space.domains.items()}
        out = []
        for k, dom in self.space.domains.items():
            if k not in params or len(dom) < 2:  # a knob that does not apply here changes nothing
                continue
            for v in dom:
                if v != params[k] and (p := self.params(dict(full, **{k: v}))) is not None:
                    out.append((k, p))
        return out

    def propose(self, trials, wide: bool = False) -> tuple[dict, str] | None:
        """(parameters, why) of the next configuration to measure, or None: leave it to the sampler. trials: the
        study's trials (Optuna FrozenTrials); COMPLETE ones are measured ok, an infeasible one (invalid, oom, crash,
        timeout: FAIL; pruned: PRUNED) taken too, others pending. wide: any neighbour, however slow its prediction
        (the sampler's draws keep being refused: WIDEN)."""
        import optuna

        from .space import knob_params
        trials = [t if t.params == knob_params(t.params) else _by_knob(t) for t in trials]
        done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
        feasible = [t for t in done if t.value > 0]
        if not feasible:
            return None
        best = max(feasible, key=lambda t: t.value)
        taken = {params_key(t.params) for t in trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                                     optuna.trial.TrialState.RUNNING,
                                                                     optuna.trial.TrialState.WAITING)
                 or t.user_attrs.get("status") in INFEASIBLE_STATUSES}  # FAIL or PRUNED, measured or refused
        base_s = self.step_s(best.params)
        candidates = []
        for knob, p in self.neighbours(best.params):
            if params_key(p) in taken:
                continue
            effect = self._measured_effect(done, knob, best.params[knob], p[knob])
            if effect is None:
                s = self.step_s(p)
                if s is None or not base_s:
                    continue
                effect, source = base_s / s, "predicted step time"
                top = self.ceiling(p) if self.ceiling else None
                if top is not None and top < best.value * effect:
                    effect, source = top / best.value, "the host's floor under its step"
            else:
                source = "measured change"
            candidates.append((best.value * effect, knob, p, source))
        self.rng.shuffle(candidates)  # ties in a seeded random order: sort is stable
        candidates.sort(key=lambda c: -c[0])
        if not candidates:
            return None
        value, knob, p, source = candidates[0]
        close = value >= (1 - MARGIN) * best.value
        if not (close or wide):
            return None
        why = "" if close else f"; the sampler's last {WIDEN} draws were refused"
        return p, (f"{knob}={p[knob]} beside trial {best.number}'s best {best.value:,.0f} tokens/s: "
                   f"predicted {value:,.0f} ({source}{why})")

    @staticmethod
    def _measured_effect(done, knob: str, old, new) -> float | None:
        """Geometric mean of value(new) / value(old) over pairs of measured trials that differ in knob alone."""
        by_rest: dict[str, dict] = {}
        for t in done:
            if t.params.get(knob) in (old, new):
                rest = params_key({k: v for k, v in t.params.items() if k != knob})
                by_rest.setdefault(rest, {})[t.params[knob] == new] = t.value
        ratios = [pair[True] / pair[False] for pair in by_rest.values() if len(pair) == 2 and pair[False] > 0]
        if not ratios:
            return None
        if min(ratios) <= 0:
            return 0.0
        return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
