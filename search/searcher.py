"""The Optuna/Tune wiring of a search: TPE (the sampler), ASHA (the scheduler), the ranker's proposals, and Ray
Tune's OptunaSearch made to hand Tune only configurations the study has not measured; what an Optuna trial carries
of its outcome, and how a resume settles the trials a driver left RUNNING."""
from __future__ import annotations

import json
import math
import warnings
from typing import TYPE_CHECKING

from trainscout.store import guard, one_line
from trainscout.trial.memory import MARGIN as MEMORY_MARGIN  # predicted over the GPU's memory by more: not launched
from trainscout.trial.status import Status

from .halt import store_failed, store_failure
from .start import spec_at
from .trainable import FREE, METRIC

if TYPE_CHECKING:
    from trainscout.store import Store

    from .args import SearchArgs
    from .space import Space

FREE_RUN = 30  # draws refused or pruned before running (trainable.FREE) in a row that end the drawing
TUNE_ID = "tune_trial_id"  # an Optuna trial's user attribute: the Tune trial it was drawn for
# Tune trial id -> its Optuna trial's number, for the live table: one numbering everywhere (the live table, the
# report, optuna-dashboard), Optuna's (the report said #4 for Optuna's number 3)
NUMBERS: dict[str, int] = {}
RANDOM_TRIES = 200  # random draws tried for a configuration a search has not measured, in place of a repeat
FEASIBLE = (Status.OK, Status.STOPPED, Status.RUNNING)  # RUNNING: the last step ASHA saw of a stopped trial


def outcome_attrs(result: dict) -> dict:
    """What an Optuna trial carries of its outcome (user attributes, for optuna-dashboard and any tool reading the
    study): status and reason, the measurement's key, the metrics, and `constraint` (> 0: infeasible). The value
    stays the tokens/s, 0 for an infeasible outcome, so TPE learns that region is bad; set_constraint gives TPE
    `constraint`, so it also knows why."""
    status = str(Status.STOPPED if result.get("status") == Status.RUNNING else result.get("status", Status.CRASH))
    attrs = {"status": status, "constraint": [0.0 if status in FEASIBLE else 1.0]}
    if result.get("error"):
        attrs["error"] = one_line(str(result["error"]), 500)
    for k in ("key", "cached", "mfu", "peak_memory_gib", "projected_days", "predicted_gib", "wall_s"):
        if result.get(k) is not None:
            attrs[k] = result[k]
    attrs[METRIC] = result.get(METRIC) or 0.0
    return attrs


def set_constraint(trial, attrs: dict) -> None:
    """Tell the sampler whether an outcome was feasible (Optuna's Trial.set_constraint, read by TPE, before the
    trial is told its value): outcome_attrs' `constraint`."""
    trial.set_constraint("infeasible", attrs["constraint"][0])


def make_sampler(seed: int, trials: int | None):
    """TPE made for conditional spaces (multivariate, grouped), seeded; a few random trials first; infeasible
    outcomes (oom, invalid, pruned, crash, timeout) are constraint violations (set_constraint) as well as value 0."""
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed, constant_liar=True,
                                      n_startup_trials=min(10, max(3, (trials or 30) // 3)))


def make_scheduler(steps: int):
    """ASHA on the per-step throughput (a trial reports the best of its timed steps so far after each, then the
    record at steps + 1). The first rung is after two steps: replayed on a recorded grid, a rung after one step
    ended the grid's best configuration on its slow first step in 5 of 20 seeds (docs/BENCHMARKS.md)."""
    from ray.tune.schedulers import ASHAScheduler
    return ASHAScheduler(time_attr="training_iteration", metric=METRIC, mode="max", max_t=steps + 1,
                         grace_period=min(2, steps), reduction_factor=2)


def make_ranker(args: SearchArgs, space: Space, hw: dict, calibration: dict | None, seed: int = 0):
    """On a GPU, the ranker of the proposals after the start points (search/ranked.py): a configuration's step
    time predicted by trial/steptime.py, None where this model refuses it or the memory model predicts it over the
    GPU's memory by more than MEMORY_MARGIN (the trial would be pruned). None on a CPU: the sampler alone."""
    if hw["device"] != "cuda" or not hw.get("gpu_memory_gib"):
        return None
    from trainscout.trial import memory, steptime

    from .ranked import Ranker
    capacity = hw["gpu_memory_gib"] * memory.GiB * (1 + MEMORY_MARGIN)

    def predict_s(params: dict) -> float | None:
        spec = spec_at(args, space, hw, params)
        if spec is None or (not spec.plan["micro_batch_probe"] and memory.predict(spec, calibration) > capacity):
            return None
        return steptime.step_s(spec)
    return Ranker(space, predict_s, seed)


def make_searcher(space: Space, name: str, ostorage, sampler, start: list[dict] | None = None, seed: int = 0,
                  ranker=None, target: int | None = None):
    """Ray Tune's OptunaSearch on the study `name`, handing Tune only configurations the study has not measured nor
    is measuring. A resumed sampler starts its seed's draws again (a 4-trial search, killed and resumed, ended with
    2 distinct configurations), and TPE proposes its best again and again (skipping such a draw does not move it:
    the samplers ignore FAIL trials). So a draw equal to such a configuration is marked FAIL, with the user
    attribute "skipped", and replaced by a random configuration the study has not measured (enqueued, user
    attribute "explore"); where none is found (a space measured in full) the repeat runs, and the store answers it.
    Each Optuna trial carries its Tune trial's id (TUNE_ID): a resume matches one left RUNNING to the store's row.
    With a ranker (make_ranker), once the start points are drawn its proposal comes before the sampler's (enqueued,
    user attribute "ranked" saying why) while it has one.

    target: the trials this run adds toward --trials (None: until the time budget). Tune asks for trials without a
    count (num_samples=-1) and the searcher ends the run once `target` trials that count have ended: a draw refused
    or pruned before it runs (FREE) costs no device time and is replaced; FREE_RUN of them in a row end the drawing
    (stopped_why says so)."""
    import optuna
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    size = math.prod(len(v) for v in space.domains.values())  # at least the number of distinct configurations
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))  # in memory: random draws

    def key(params: dict) -> str:
        return json.dumps(params, sort_keys=True, default=str)

    def unmeasured(measured: set[str]) -> dict | None:
        for _ in range(RANDOM_TRIES):
            t = scratch.ask()
            space.sample(t)
            if key(t.params) not in measured:
                return t.params
        return None

    class DistinctOptunaSearch(OptunaSearch):
        counted, free_run, in_flight, stopped_why = 0, 0, set(), None
        reported: dict  # Tune trial id -> the last step told to Optuna as an intermediate value

        def on_trial_result(self, trial_id, result):
            if store_failure() is not None:
                return
            try:
                super().on_trial_result(trial_id, result)
                self.reported = getattr(self, "reported", None) or {}
                self.reported[trial_id] = result.get("training_iteration")
            except Exception as e:  # noqa: BLE001
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)

        def suggest(self, trial_id):
            if store_failure() is not None:
                return None  # the store failed: nothing more is drawn (the stopper ends the run)
            if target is not None and (self.counted >= target or self.free_run >= FREE_RUN):
                return Searcher.FINISHED
            if target is not None and self.counted + len(self.in_flight) >= target:
                return None  # the running trials may end the search; ask again when one ends
            if self.free_run >= FREE_RUN:
                return Searcher.FINISHED
            try:
                config = self._suggest(trial_id)
                if isinstance(config, dict):
                    self.in_flight.add(trial_id)
                return config
            except Exception as e:  # noqa: BLE001 - a storage failure stops the search, in one line (run_search)
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)
                return None

        def _suggest(self, trial_id):
            if ranker is not None:
                trials = self._ot_study.get_trials(deepcopy=False)
                if not any(t.state == optuna.trial.TrialState.WAITING for t in trials):  # start points first
                    proposal = ranker.propose(trials)
                    if proposal is not None:
                        self._ot_study.enqueue_trial(proposal[0], user_attrs={"ranked": proposal[1]})
            config = super().suggest(trial_id)
            drawn = self._ot_trials[trial_id]
            drawn.set_user_attr(TUNE_ID, trial_id)
            NUMBERS[trial_id] = drawn.number
            others = [t for t in self._ot_study.get_trials(deepcopy=False, states=states) if t.number != drawn.number]
            twin = next((t for t in others if t.params == drawn.params), None)
            measured = {key(t.params) for t in others}
            fresh = unmeasured(measured) if twin is not None and len(measured) < size else None
            if fresh is None:
                return config
            # PRUNED, not FAIL: nothing failed (the dashboard showed a failure), and TPE, which ignores a FAIL and so
            # proposed the same configuration again, counts a pruned trial among the worse ones
            drawn.set_user_attr("skipped", f"a draw of trial {twin.number}'s configuration again")
            drawn.set_user_attr("status", "skipped")
            self._ot_study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
            del self._ot_trials[trial_id]
            self._ot_study.enqueue_trial(fresh, user_attrs={"explore": f"instead of trial {drawn.number}'s draw"})
            config = super().suggest(trial_id)
            self._ot_trials[trial_id].set_user_attr(TUNE_ID, trial_id)
            NUMBERS[trial_id] = self._ot_trials[trial_id].number
            return config

        def on_trial_complete(self, trial_id, result=None, error=False):
            if (result or {}).get("store_failed") or store_failure() is not None:
                return  # left RUNNING in the study: a resume settles it from the store's rows
            if trial_id in self.in_flight:
                self.in_flight.discard(trial_id)
                if not error and (result or {}).get("status") in FREE:
                    self.free_run += 1
                    if self.free_run == FREE_RUN:
                        self.stopped_why = (f"stopped drawing: the last {FREE_RUN} draws were refused or pruned before "
                                            "running (see their reasons in the table): narrow the space with --set "
                                            "or --space")
                else:
                    self.counted, self.free_run = self.counted + 1, 0
            try:
                self._complete(trial_id, result, error)
            except Exception as e:  # noqa: BLE001
                if (why := guard.failure_of(e)) is None:
                    raise
                store_failed(why)

        def _complete(self, trial_id, result=None, error=False):
            drawn = self._ot_trials.get(trial_id)
            if drawn is not None and result and trial_id not in self._completed_trials:
                attrs = outcome_attrs(result)
                for k, v in attrs.items():
                    drawn.set_user_attr(k, v)
                set_constraint(drawn, attrs)
                if attrs["status"] == Status.UNSCHEDULED:  # nothing ran: FAIL, which the samplers ignore
                    result, error = None, True
                if attrs["status"] == Status.STOPPED:  # ASHA stopped it (or stopped it before): PRUNED, with each
                    # reported step as an intermediate value (OptunaSearch.on_trial_result), the last its value;
                    # Tune hands the step ASHA stopped it at to on_trial_complete alone
                    step = result.get("training_iteration")
                    if step is not None and (getattr(self, "reported", None) or {}).get(trial_id) != step:
                        drawn.report(result.get(METRIC) or 0.0, step)
                    self._ot_study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
                    self._completed_trials.add(trial_id)
                    return
            super().on_trial_complete(trial_id, result, error)

    searcher = DistinctOptunaSearch(space=space.sample, metric=METRIC, mode="max", sampler=sampler, study_name=name,
                                    storage=ostorage, points_to_evaluate=start or None)
    # the objective's name, for optuna-dashboard ("Objective 0" before) and any tool reading the study
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        searcher._ot_study.set_metric_names([METRIC])
    return searcher


def recover_interrupted(ostorage, name: str, store: Store) -> int:
    """Optuna trials left RUNNING (a driver killed, interrupted, or ended by its time budget while a trial ran or
    was about to): one whose Tune trial the store holds (it finished; only the report to Optuna was lost) is told
    its stored outcome (COMPLETE with its value; PRUNED where ASHA or the stop ended it), so the sampler knows it
    was measured; one with reported steps and no row was stopped mid-run: PRUNED at its last step; any other never
    ran, or its measurement was lost: FAIL, with the user attribute status "not run". Run on every resume and after
    every run, so no trial stays RUNNING. Returns the study's trial count."""
    import optuna
    try:
        study = optuna.load_study(study_name=name, storage=ostorage)
    except KeyError:
        return 0
    rows = {t["trial"]: t for t in store.trials(name)}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        row = rows.get(t.user_attrs.get(TUNE_ID))
        if row is not None:
            attrs = outcome_attrs({**row, METRIC: row["tokens_per_s"]})
            for k, v in attrs.items():
                ostorage.set_trial_user_attr(t._trial_id, k, v)
            set_constraint(optuna.trial.Trial(study, t._trial_id), attrs)
            if attrs["status"] == Status.STOPPED:
                if not t.intermediate_values:
                    ostorage.set_trial_intermediate_value(t._trial_id, 1, row["tokens_per_s"] or 0.0)
                ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.PRUNED,
                                                [row["tokens_per_s"] or 0.0])
            else:
                ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.COMPLETE,
                                                [row["tokens_per_s"] or 0.0])
        elif t.intermediate_values:
            ostorage.set_trial_user_attr(t._trial_id, "status", str(Status.STOPPED))
            ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.PRUNED,
                                            [t.intermediate_values[max(t.intermediate_values)]])
        else:
            ostorage.set_trial_user_attr(t._trial_id, "status", "not run")
            ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(study.trials)
