"""The Optuna/Tune wiring of a search: TPE (the sampler), ASHA (the scheduler), the ranker's proposals, the searcher
that hands Tune only configurations the study has not measured (search/study.py: Tune's Searcher over the Optuna
study by ask/tell), and how a resume settles the trials a driver left RUNNING. What an Optuna trial carries of its
outcome: search/outcomes.py."""
from __future__ import annotations

import datetime
import warnings
from typing import TYPE_CHECKING

from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import NOT_MEASURED, Status

from .outcomes import INFEASIBLE, TUNE_ID, failed_quality, optuna_state, outcome_attrs, set_constraint
from .space import knob_params
from .start import spec_at
from .trainable import METRIC

if TYPE_CHECKING:
    from trainscout.store import Store

    from .args import SearchArgs
    from .space import Space


def make_sampler(seed: int, trials: int | None):
    """TPE made for conditional spaces (multivariate, grouped), seeded; a few random trials first; infeasible
    outcomes are constraint violations (set_constraint): pruned ones PRUNED, which TPE reads, and invalid, oom,
    crash and timeout FAIL (no tokens/s to tell), which TPE alone would ignore: Learning reads those as infeasible."""
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    class WithFailed:
        """The study as TPE reads it, its FAIL trials of an infeasible outcome (outcomes.INFEASIBLE, constraint
        set) among those it asks for: TPE's split puts them with the infeasible ones, the worst."""

        def __init__(self, study):
            self._study = study

        def __getattr__(self, name):
            return getattr(self._study, name)

        def _get_trials(self, deepcopy=True, states=None, use_cache=False):
            trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
            if states is None or optuna.trial.TrialState.COMPLETE not in states:
                return trials
            failed = [t for t in self._study._get_trials(deepcopy=deepcopy, states=(optuna.trial.TrialState.FAIL,),
                                                         use_cache=use_cache)
                      if t.user_attrs.get("status") in INFEASIBLE and sum(v for v in t.constraints.values() if v > 0)]
            return sorted(trials + failed, key=lambda t: t.number)

    class Learning(optuna.samplers.TPESampler):
        def sample_relative(self, study, trial, search_space):
            return super().sample_relative(WithFailed(study), trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return super().sample_independent(WithFailed(study), trial, param_name, param_distribution)
    return Learning(multivariate=True, group=True, seed=seed, constant_liar=True,
                    n_startup_trials=min(10, max(3, (trials or 30) // 3)))


def make_scheduler(steps: int):
    """ASHA on the per-step throughput (a trial reports the best of its timed steps so far after each, then the
    record at steps + 1). The first rung is after two steps: replayed on a recorded grid, a rung after one step
    ended the grid's best configuration on its slow first step in 5 of 20 seeds (docs/BENCHMARKS.md)."""
    from ray.tune.schedulers import ASHAScheduler

    class Gated(ASHAScheduler):
        """ASHA whose rungs forget a trial that failed its quality gate (outcomes.failed_quality): the gate runs
        after the timed steps, and a trial that trains another model sets no bar. On an H100 (2026-12-06) a 7B's
        fp8 trial (16,639 tokens/s, gate failed) stopped its gate-passing twin at 11,336: no gated best came out.
        Forgotten too: a trial the host or the cluster lost (NOT_MEASURED) and one whose actor failed."""

        def on_trial_complete(self, tune_controller, trial, result):
            # a lost trial's steps ran on a node that was going: they say nothing of the configuration
            if not failed_quality(result or {}) and (result or {}).get("status") not in NOT_MEASURED:
                return super().on_trial_complete(tune_controller, trial, result)
            self._forget(trial)

        def on_trial_error(self, tune_controller, trial):
            # a trial whose own actor failed (its node lost, the host's memory monitor, a crash of the process):
            # its steps set no bar
            self._forget(trial)

        def _forget(self, trial):
            bracket = self._trial_info.pop(trial.trial_id, None)  # Ray's ASHA keeps each trial's bracket here
            for _milestone, recorded in getattr(bracket, "_rungs", ()):  # and each rung's values by trial id
                recorded.pop(trial.trial_id, None)

    return Gated(time_attr="training_iteration", metric=METRIC, mode="max", max_t=steps + 1,
                 grace_period=min(2, steps), reduction_factor=2)


def make_ranker(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, seed: int = 0):
    """On a GPU, the ranker of the proposals after the start points (search/ranked.py): a configuration's step
    time predicted by predictor.steptime (its throughput capped by the host's floor, steptime.host_s), None where this
    model refuses it or the trial would not be launched (the
    search's rule, predictor.memory.refusal: the GPU's memory + memory.MARGIN and the host's, the capacities the driver
    hands the trials). None on a CPU: the sampler alone."""
    from trainscout.predictor import memory, steptime

    from .ranked import Ranker, params_key
    gpu = memory.gpu_capacity(hw)
    if gpu is None:
        return None
    host = memory.host_capacity(hw)
    specs: dict[str, object] = {}

    def at(params: dict):
        """spec_at of params, prepared once for predict_s and ceiling alike."""
        key = params_key(params)
        if key not in specs:
            specs[key] = spec_at(args, space, hw, params)
        return specs[key]

    def predict_s(params: dict) -> float | None:
        spec = at(params)
        if spec is None or memory.refusal(spec, gpu, host, calibration) is not None:
            return None
        return steptime.step_s(spec)

    def ceiling(params: dict) -> float | None:
        spec = at(params)
        floor = steptime.host_s(spec) if spec is not None else 0.0
        return spec.tokens_per_step / floor if floor else None
    return Ranker(space, predict_s, seed, ceiling)


def make_searcher(space: Space, name: str, ostorage, sampler, start: list[dict] | None = None, seed: int = 0,
                  ranker=None, target: int | None = None, judge=None):
    """Ray Tune's searcher on the Optuna study `name` of ostorage (study.DistinctSearcher, by Optuna's ask/tell),
    handing Tune only configurations the study has not measured nor is measuring; start: the configurations drawn
    first. A resumed sampler starts its seed's draws again (a 4-trial search, killed and resumed, ended with 2
    distinct configurations), and TPE proposes its best again and again (skipping such a draw as FAIL did not move
    it: the samplers ignore FAIL trials). So a draw equal to such a configuration is marked PRUNED, with the user
    attributes "skipped" and status "skipped", and replaced by a random configuration the study has not measured
    (enqueued, user attribute "explore"); where none is found (a space measured in full) the repeat runs, and the
    store answers it. A trial ASHA stopped is PRUNED (its steps its intermediate values), one that never ran
    (unscheduled) FAIL, one without a value PRUNED, or FAIL where it raised.
    Each Optuna trial carries its Tune trial's id (TUNE_ID): a resume matches one left RUNNING to the store's row.
    With a ranker (make_ranker), once the start points are drawn its proposal comes before the sampler's (enqueued,
    user attribute "ranked" saying why) while it has one.

    target: the trials this run adds toward --trials (None: until the time budget). Tune asks for trials without a
    count (num_samples=-1) and the searcher ends the run once `target` trials that count have ended: a draw refused
    or pruned before it runs (FREE) costs no device time and is replaced; after FREE_RUN of them in a row a random
    configuration that judge (config -> None where its trial would run, else why not) lets run is drawn next, and
    the drawing ends only where none is found (stopped_why says so)."""
    from .study import HaltingSearcher  # Ray Tune and Optuna load here, not with this module
    return HaltingSearcher(space, name, ostorage, sampler, start, seed=seed, ranker=ranker, target=target, judge=judge)


def recover_interrupted(ostorage, name: str, store: Store, cut: list | None = None) -> int:
    """Optuna trials left RUNNING (a driver killed, interrupted, or ended by its time budget while a trial ran or
    was about to): one whose Tune trial the store holds (it finished; only the report to Optuna was lost) is told
    its stored outcome (COMPLETE with its value; PRUNED where ASHA or the stop ended it), so the sampler knows it
    was measured; one with reported steps and no row was stopped mid-run: PRUNED at its last step; any other never
    ran, or its measurement was lost: FAIL, with the user attribute status "not run". Run on every resume and after
    every run, so no trial stays RUNNING. Returns the study's trial count; `cut` gets {"number", "params",
    "seconds", "steps"} of each trial it ends without a stored row (what the live table never showed)."""
    import optuna
    try:
        study = optuna.load_study(study_name=name, storage=ostorage)
    except KeyError:
        return 0
    study_id = ostorage.get_study_id_from_name(name)
    rows = {t["trial"]: t for t in store.trials(name)}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        tid = ostorage.get_trial_id_from_study_id_trial_number(study_id, t.number)  # the storage's id of the trial
        row = rows.get(t.user_attrs.get(TUNE_ID))
        if row is not None:
            attrs = outcome_attrs({**row, METRIC: row[TOKENS_PER_S]})
            for k, v in attrs.items():
                ostorage.set_trial_user_attr(tid, k, v)
            set_constraint(optuna.trial.Trial(study, tid), attrs)
            if attrs["status"] == Status.STOPPED:
                if not t.intermediate_values:
                    ostorage.set_trial_intermediate_value(tid, 1, row[TOKENS_PER_S] or 0.0)
                ostorage.set_trial_state_values(tid, optuna.trial.TrialState.PRUNED, [row[TOKENS_PER_S] or 0.0])
            elif attrs["status"] == Status.OK:
                ostorage.set_trial_state_values(tid, optuna.trial.TrialState.COMPLETE, [row[TOKENS_PER_S] or 0.0])
            else:  # no tokens/s: FAIL or PRUNED without a value (outcomes.optuna_state)
                ostorage.set_trial_state_values(tid, optuna_state(attrs["status"]))
            continue
        if cut is not None:
            start = t.datetime_start
            cut.append({"number": t.number, "params": knob_params(t.params), "steps": len(t.intermediate_values),
                        "seconds": (datetime.datetime.now() - start).total_seconds() if start else None})
        if t.intermediate_values:
            ostorage.set_trial_user_attr(tid, "status", str(Status.STOPPED))
            ostorage.set_trial_state_values(tid, optuna.trial.TrialState.PRUNED,
                                            [t.intermediate_values[max(t.intermediate_values)]])
        else:
            ostorage.set_trial_user_attr(tid, "status", "not run")
            ostorage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)
    return len(study.trials)
