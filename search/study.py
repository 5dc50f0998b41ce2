"""Ray Tune's Searcher interface over a search's Optuna study, by Optuna's public ask/tell API (Study.ask, Study.tell,
Study.enqueue_trial, Trial.report). It hands Tune only configurations the study has not measured nor is measuring,
puts the ranker's proposals before the sampler's, counts the trials toward --trials, and keeps the study's trial
states (PRUNED for a trial ASHA stopped or a repeated draw skipped, FAIL for one that never ran).

It replaces a subclass of Ray's OptunaSearch that wrote OptunaSearch's private study and trial table (_ot_study,
_ot_trials); what OptunaSearch itself did for us (ask on suggest, the define-by-run space, report on each result,
tell on completion) is the few lines of _ask, _report and _tell. Imported by searcher.make_searcher only: importing
Ray Tune costs more than a second, which no other command pays.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
import warnings
from typing import TYPE_CHECKING

import optuna
from ray.tune.search import Searcher

from trainscout.store import guard
from trainscout.trial.status import NOT_MEASURED, Status

from .halt import store_failed, store_failure
from .outcomes import INFEASIBLE, NUMBERS, TUNE_ID, optuna_state, outcome_attrs, set_constraint
from .ranked import WIDEN
from .space import knob_params
from .trainable import FREE, FREE_RUN, METRIC

if TYPE_CHECKING:
    from .space import Space

log = logging.getLogger(__name__)
RANDOM_TRIES = 200  # random draws tried for a configuration a search has not measured, in place of a repeat
MEASURED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
STEP = "training_iteration"  # Tune's count of a trial's reports: the step of an intermediate value
HALT_POLL_S = 0.25  # how often a draw's wait looks whether the search must end (the time budget, Ctrl-C, the store)


class DistinctSearcher(Searcher):
    """Tune's searcher over the Optuna study `name` of `storage`, drawing with `sampler` on `space` (define-by-run,
    Space.sample); searcher.make_searcher says what it does and why. start: configurations drawn first (enqueued).
    drawn: Tune trial id -> the Optuna trial asked for it (optuna.Trial); counted: the ended trials that count toward
    target; stopped_why: why the drawing ended before target (FREE_RUN free draws in a row), else None."""

    def __init__(self, space: Space, name: str, storage, sampler, start: list[dict] | None = None, seed: int = 0,
                 ranker=None, target: int | None = None, judge=None):
        super().__init__(metric=METRIC, mode="max")
        self.space, self.ranker, self.target = space, ranker, target
        self.judge = judge  # config -> None where its trial would run, else why not (a refusal, over memory)
        # NopPruner: early stopping is Tune's scheduler (ASHA), which ends a trial; the study only records it
        self.study = optuna.create_study(storage=storage, sampler=sampler, pruner=optuna.pruners.NopPruner(),
                                         study_name=name, load_if_exists=True, direction="maximize")
        for point in start or []:  # each by the parameter names the space draws it under (valid: start.py checked)
            self.study.enqueue_trial(space.params_of(point))
        # the objective's name, for optuna-dashboard ("Objective 0" before) and any tool reading the study
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names([METRIC])
        self.size = math.prod(len(v) for v in space.domains.values())  # at least the distinct configurations
        self.scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))  # in memory: random draws
        self.drawn: dict[str, optuna.Trial] = {}
        self.completed: set[str] = set()  # told to the study
        self.reported: dict[str, int] = {}  # Tune trial id -> the last step told to Optuna as an intermediate value
        self.counted, self.free_run, self.in_flight, self.stopped_why = 0, 0, set(), None

    # --- Tune's Searcher interface ------------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        """The configuration of Tune's trial trial_id; None (ask again later) or Searcher.FINISHED."""
        if store_failure() is not None:
            return None  # the store failed: nothing more is drawn (the stopper ends the run)
        if self.target is not None and self.counted >= self.target:
            return Searcher.FINISHED
        if self.free_run >= FREE_RUN and not self._fallback():
            return Searcher.FINISHED
        if self.target is not None and self.counted + len(self.in_flight) >= self.target:
            return None  # the running trials may end the search; ask again when one ends
        try:
            config = self._suggest(trial_id)
            if isinstance(config, dict):
                self.in_flight.add(trial_id)
            return config
        except Exception as e:  # a storage failure stops the search, in one line (run_search)
            if (why := guard.failure_of(e)) is None:
                raise
            store_failed(why)
            return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """A step of a running trial: its throughput so far, an intermediate value of its Optuna trial."""
        if store_failure() is not None:
            return
        try:
            self._report(trial_id, result)
        except Exception as e:
            if (why := guard.failure_of(e)) is None:
                raise
            store_failed(why)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """A trial ended (result: its last report; error: it raised): counted toward the target, told to the study."""
        if (result or {}).get("store_failed") or store_failure() is not None:
            return  # left RUNNING in the study: a resume settles it from the store's rows
        if trial_id in self.in_flight:
            self.in_flight.discard(trial_id)
            if not error and (result or {}).get("status") in FREE:
                self.free_run += 1
            else:
                self.counted, self.free_run = self.counted + 1, 0
        try:
            self._complete(trial_id, result, error)
        except Exception as e:
            if (why := guard.failure_of(e)) is None:
                raise
            store_failed(why)

    def save(self, checkpoint_path: str) -> None:
        """Tune saves its searcher's state in its experiment folder: here what was drawn, as JSON (a search resumes
        from its store, never from Tune's folder; the study is in the store)."""
        with open(checkpoint_path, "w", encoding="utf-8") as f:
            json.dump({"study": self.study.study_name, "drawn": {k: t.number for k, t in self.drawn.items()},
                       "completed": sorted(self.completed), "counted": self.counted, "free_run": self.free_run}, f)

    def restore(self, checkpoint_path: str) -> None:
        raise NotImplementedError("a search resumes from its store (trainscout search --resume DIR), not from Ray "
                                  "Tune's experiment folder")

    # --- drawing ------------------------------------------------------------------------------------------------
    def _suggest(self, trial_id: str) -> dict:
        if self.ranker is not None:
            trials = self.study.get_trials(deepcopy=False)
            if not any(t.state == optuna.trial.TrialState.WAITING for t in trials):  # start points first
                proposal = self.ranker.propose(trials, wide=self.free_run >= WIDEN)
                if proposal is not None:
                    self.study.enqueue_trial(self.space.params_of(proposal[0]), user_attrs={"ranked": proposal[1]})
        config, drawn = self._ask(trial_id)
        others = [t for t in self.study.get_trials(deepcopy=False) if t.number != drawn.number and (
            t.state in MEASURED or t.user_attrs.get("status") in INFEASIBLE)]  # those FAIL ran (or were refused)
        twin = next((t for t in others if t.params == drawn.params), None)
        measured = {_key(t.params) for t in others}
        fresh = self._unmeasured(measured) if twin is not None and len(measured) < self.size else None
        if fresh is None:
            return config
        # PRUNED, not FAIL: nothing failed (the dashboard showed a failure), and TPE, which ignores a FAIL and so
        # proposed the same configuration again, counts a pruned trial among the worse ones
        drawn.set_user_attr("skipped", f"a draw of trial {twin.number}'s configuration again")
        drawn.set_user_attr("status", "skipped")
        self.study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
        del self.drawn[trial_id]
        self.study.enqueue_trial(fresh, user_attrs={"explore": f"instead of trial {drawn.number}'s draw"})
        return self._ask(trial_id)[0]

    def _fallback(self) -> bool:
        """After FREE_RUN draws in a row refused or pruned before running: a configuration the study has not tried
        that would run (judge: the rules and the memory model) is enqueued, so the search never stops drawing while
        one is known (True); False where none is found in RANDOM_TRIES random draws (stopped_why says so)."""
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == optuna.trial.TrialState.WAITING for t in trials):
            return True  # one is queued already
        if self.judge is not None:
            tried = {_key(t.params) for t in trials}
            for _ in range(RANDOM_TRIES):
                t = self.scratch.ask()
                config = self.space.sample(t)
                if _key(t.params) not in tried and self.judge(config) is None:
                    self.study.enqueue_trial(t.params, user_attrs={"explore": (
                        f"the last {self.free_run} draws were refused or pruned before running: a random "
                        "configuration the memory model predicts to fit")})
                    return True
                tried.add(_key(t.params))
        self.stopped_why = (f"stopped drawing: the last {FREE_RUN} draws were refused or pruned before running "
                            "(see their reasons in the table) and no configuration predicted to fit was found in "
                            f"{RANDOM_TRIES} random draws: narrow the space with --set or --space")
        return False

    def _ask(self, trial_id: str) -> tuple[dict, optuna.Trial]:
        """Ask the study for Tune's trial trial_id (the trial already asked for it, if any) and sample the space on
        it: (the configuration, the Optuna trial)."""
        if trial_id not in self.drawn:
            self.drawn[trial_id] = self.study.ask()
        trial = self.drawn[trial_id]
        config = self.space.sample(trial)
        config = {**knob_params(trial.params), **config}  # the suggested values first, as OptunaSearch ordered them
        trial.set_user_attr(TUNE_ID, trial_id)
        NUMBERS[trial_id] = trial.number
        return config, trial

    def _unmeasured(self, measured: set[str]) -> dict | None:
        """A random configuration the study has not measured (RANDOM_TRIES draws), or None."""
        for _ in range(RANDOM_TRIES):
            t = self.scratch.ask()
            self.space.sample(t)
            if _key(t.params) not in measured:
                return t.params
        return None

    # --- telling the study --------------------------------------------------------------------------------------
    def _report(self, trial_id: str, result: dict) -> None:
        if trial_id in self.completed:
            log.warning(f"Received additional result for trial {trial_id}, but it already finished. Result: {result}")
        else:
            self.drawn[trial_id].report(result[METRIC], result[STEP])
        self.reported[trial_id] = result.get(STEP)

    def _complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        drawn = self.drawn.get(trial_id)
        if drawn is not None and result and trial_id not in self.completed:
            attrs = outcome_attrs(result)
            for k, v in attrs.items():
                drawn.set_user_attr(k, v)
            set_constraint(drawn, attrs)
            if attrs["status"] in NOT_MEASURED:  # nothing ran, or the host killed it: FAIL, which the samplers ignore
                result, error = None, True
            if attrs["status"] == Status.STOPPED:  # ASHA stopped it (or stopped it before): PRUNED, with each
                # reported step as an intermediate value (_report), the last its value; Tune hands the step ASHA
                # stopped it at to on_trial_complete alone
                step = result.get(STEP)
                if step is not None and self.reported.get(trial_id) != step:
                    drawn.report(result.get(METRIC) or 0.0, step)
                self.study.tell(drawn, state=optuna.trial.TrialState.PRUNED)
                self.completed.add(trial_id)
                return
            if attrs["status"] in INFEASIBLE or attrs["status"] == Status.PRUNED:  # no tokens/s: FAIL (the reason
                # in its user attributes) or PRUNED (predicted not to fit), without a value; TPE reads the
                # constraint (searcher.make_sampler)
                self.study.tell(drawn, state=optuna_state(attrs["status"]))
                self.completed.add(trial_id)
                return
        self._tell(trial_id, result, error)

    def _tell(self, trial_id: str, result: dict | None, error: bool) -> None:
        """COMPLETE with the result's value; without one, FAIL where the trial raised, else PRUNED."""
        if trial_id in self.completed:
            log.warning(f"Received additional completion for trial {trial_id}, but it already finished. "
                        f"Result: {result}")
            return
        drawn = self.drawn[trial_id]
        value = result.get(METRIC) if result else None
        state = optuna.trial.TrialState.COMPLETE
        if value is None:
            state = optuna.trial.TrialState.FAIL if error else optuna.trial.TrialState.PRUNED
        try:
            self.study.tell(drawn, value, state=state)
        except Exception as e:  # noqa: BLE001 - e.g. a NaN value: the trial stays as it is, as OptunaSearch had it
            log.warning(e)
        self.completed.add(trial_id)



class HaltingSearcher(DistinctSearcher):
    """Ends the drawing once the search must end (halt: the driver's stop conditions), whatever the draw does.
    Tune asks its stopper only between the events of its loop; with no trial running it waits up to 600 s for a
    next trial in a loop of its own, asking the searcher once a second and nothing else: a draw that failed (a
    full disk: the searcher then proposes nothing) or that does not return would hold a search there.
    So each draw runs in a thread of its own while halt is looked at every HALT_POLL_S; once it says why, the
    searcher answers FINISHED (Tune's loop then ends) and keeps why, and how long Tune had waited (halted)."""

    halt = None  # () -> why the search must end now (the time budget, Ctrl-C, the store failed), else None
    halted: dict | None = None  # {"why", "waited_s", "draw": whether a draw was left unreturned}
    _waiting_since: float | None = None  # when the searcher began proposing nothing (Tune asks again and again)

    def suggest(self, trial_id: str):
        waiting = 0.0 if self._waiting_since is None else time.monotonic() - self._waiting_since
        if self.halted is not None or self._halt(waiting, False):
            return Searcher.FINISHED
        box: dict = {}

        def draw():
            try:
                box["config"] = DistinctSearcher.suggest(self, trial_id)
            except BaseException as e:  # noqa: BLE001 - raised again in Tune's thread
                box["error"] = e
        t0 = time.monotonic()
        worker = threading.Thread(target=draw, name=f"draw {trial_id}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(HALT_POLL_S)
            if worker.is_alive() and self._halt(time.monotonic() - t0, True):
                return Searcher.FINISHED  # the draw is left to end on its own: nothing waits for it
        if "error" in box:
            raise box["error"]
        if box["config"] is None and self.in_flight:  # waiting for the running trials: no stall
            self._waiting_since = None
        elif box["config"] is None:  # nothing proposed, nothing running: Tune asks again in a second, and again
            if self._waiting_since is None:
                self._waiting_since = t0
            if self._halt(time.monotonic() - self._waiting_since, False):
                return Searcher.FINISHED
        else:
            self._waiting_since = None
        return box["config"]

    def _halt(self, waited_s: float, in_draw: bool) -> bool:
        why = self.halt() if self.halt is not None else None
        if why is not None and self.halted is None:
            self.halted = {"why": why, "waited_s": waited_s, "draw": in_draw}
        return why is not None


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)
