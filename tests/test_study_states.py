"""One reading of each number in the Optuna study (issue 49, item 3): a search's invalid, oom, crash and timeout
trials are FAIL with their reason as user attributes, a pruned (predicted not to fit) or ASHA-stopped one PRUNED,
none COMPLETE with value 0; ok is COMPLETE with its tokens/s. The sampler still learns from the FAIL ones: its TPE
reads them as infeasible (the constraint) and draws away from them. Real searcher and Optuna storage, no Ray."""
import json

import optuna

from trainscout.search import service
from trainscout.search.service import make_sampler, make_searcher, recover_interrupted
from trainscout.search.space import Space
from trainscout.spaces import all_knobs
from trainscout.store import Store, default_url

STATES = optuna.trial.TrialState


def space_of(domains: dict) -> Space:
    return Space({k.name: k.default for k in all_knobs() if k.name not in domains}, domains)


def test_each_outcome_is_told_its_own_state(tmp_path):
    space = space_of({"micro_batch_size": (1, 2, 4, 8, 16, 32, 64), "activation_checkpointing": ("none", "full")})
    url = default_url(str(tmp_path))
    ostorage = optuna.storages.RDBStorage(url)
    searcher = make_searcher(space, "s", ostorage, make_sampler(1, 10))
    outcomes = {"ok": {"status": "ok", service.METRIC: 123.0},
                "invalid": {"status": "invalid", service.METRIC: 0.0, "error": "x=1 needs y=2: set y=2"},
                "oom": {"status": "oom", service.METRIC: 0.0, "error": "CUDA out of memory"},
                "crash": {"status": "crash", service.METRIC: 0.0, "error": "rank 1 exited 3"},
                "timeout": {"status": "timeout", service.METRIC: 0.0, "error": "no step in 600 s"},
                "pruned": {"status": "pruned", service.METRIC: 0.0, "error": "predicted 90 GiB > 80 GiB"}}
    for tid, result in outcomes.items():
        searcher.suggest(tid)
        searcher.on_trial_complete(tid, result)
    # ASHA stopped one after two steps
    searcher.suggest("stopped")
    searcher.on_trial_result("stopped", {service.METRIC: 50.0, "training_iteration": 1, "status": "running"})
    searcher.on_trial_complete("stopped", {service.METRIC: 60.0, "training_iteration": 2, "status": "running"})
    trials = {t.user_attrs[service.TUNE_ID]: t for t in optuna.load_study(study_name="s", storage=ostorage).trials}
    assert trials["ok"].state == STATES.COMPLETE and trials["ok"].value == 123.0
    for tid in ("invalid", "oom", "crash", "timeout"):
        t = trials[tid]
        assert t.state == STATES.FAIL and t.value is None, (tid, t.state, t.value)
        assert t.user_attrs["status"] == tid and t.user_attrs["error"] == outcomes[tid]["error"]
        assert service.METRIC not in t.user_attrs and t.constraints == {"infeasible": 1.0}
    assert trials["pruned"].state == STATES.PRUNED and trials["pruned"].value is None
    assert trials["pruned"].user_attrs["error"] == "predicted 90 GiB > 80 GiB"
    assert trials["stopped"].state == STATES.PRUNED and trials["stopped"].user_attrs["status"] == "stopped"
    assert not [t for t in trials.values() if t.state == STATES.COMPLETE and not t.value]  # no value 0 anywhere


def test_a_resume_settles_a_stored_failure_as_fail(tmp_path):
    """A trial the killed driver left RUNNING whose row the store holds (invalid): FAIL, its reason kept."""
    space = space_of({"micro_batch_size": (1, 2), "activation_checkpointing": ("none", "full")})
    url = default_url(str(tmp_path))
    store, ostorage = Store(url), optuna.storages.RDBStorage(url)
    searcher = make_searcher(space, "s", ostorage, make_sampler(1, 4))
    searcher.suggest("a")
    store.add_trial("s", "a", None, "oom", False, 0.0, {}, error="CUDA out of memory")
    recover_interrupted(ostorage, "s", store, [])
    (t,) = optuna.load_study(study_name="s", storage=ostorage).trials
    assert t.state == STATES.FAIL and t.user_attrs["status"] == "oom" and t.user_attrs["error"] == "CUDA out of memory"


def test_tpe_learns_from_the_fail_trials(tmp_path):
    """One knob of 8 values; every value but 1 fails (invalid), the ok one is 1. After a few random draws, TPE
    (make_sampler's) draws the ok value far more often than chance (1 in 8), as it did when failures were COMPLETE
    with value 0; a plain TPE, which ignores FAIL, has nothing to tell the failing values from the ok one."""
    space = space_of({"micro_batch_size": (1, 2, 4, 8, 16, 32, 64, 128)})

    def hits(sampler) -> int:
        study = optuna.create_study(direction="maximize", sampler=sampler)
        got = 0
        for _ in range(40):
            trial = study.ask()
            params = space.sample(trial)
            ok = params["micro_batch_size"] == 1
            attrs = {"status": "ok" if ok else "invalid", "constraint": [0.0 if ok else 1.0]}
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            trial.set_constraint("infeasible", attrs["constraint"][0])
            if ok:
                study.tell(trial, 1.0)
                got += study.trials[-1].number >= 10
            else:
                study.tell(trial, state=STATES.FAIL)
        return got
    learned = hits(make_sampler(3, 30))
    plain = hits(optuna.samplers.TPESampler(multivariate=True, group=True, seed=3, constant_liar=True,
                                            n_startup_trials=10))
    print(json.dumps({"ok draws of 30 after the startup": learned, "plain TPE": plain}))
    assert learned >= 12 and plain <= 8, (learned, plain)  # chance: 30 / 8 = 3.75 (seeds 0-3: 15 and 2-4)


def test_a_failed_quality_sets_no_bar(tmp_path):
    """A trial whose quality gate failed (it trains another model) keeps its tokens/s in the study, infeasible to
    TPE; Ray's ASHA (make_scheduler's) forgets its rung values once it completes, so a slower gate-passing trial is
    not stopped against it. The control: the same fast trial with a passed gate stops the slower one at the rung."""
    from ray.tune.experiment import Trial
    from trainscout.search.searcher import make_scheduler

    def slower_after(quality: str) -> list[str]:
        asha = make_scheduler(6)
        fast, slow = Trial("x", stub=True, trial_id="fast"), Trial("x", stub=True, trial_id="slow")
        for t in (fast, slow):
            asha.on_trial_add(None, t)
        for it in (1, 2, 3):
            asha.on_trial_result(None, fast, {"training_iteration": it, service.METRIC: 100.0})
        asha.on_trial_complete(None, fast, {"training_iteration": 7, service.METRIC: 100.0, "status": "ok",
                                            "quality": quality})
        return [asha.on_trial_result(None, slow, {"training_iteration": it, service.METRIC: 60.0})
                for it in (1, 2, 3)]
    assert slower_after("passed") == ["CONTINUE", "STOP", "CONTINUE"]
    assert slower_after("failed") == ["CONTINUE"] * 3

    space = space_of({"micro_batch_size": (1, 2, 4, 8)})
    ostorage = optuna.storages.RDBStorage(default_url(str(tmp_path)))
    searcher = make_searcher(space, "s", ostorage, make_sampler(1, 10))
    searcher.suggest("fp8")
    searcher.on_trial_complete("fp8", {"status": "ok", service.METRIC: 160.0, "quality": "failed"})
    (t,) = optuna.load_study(study_name="s", storage=ostorage).trials
    assert t.state == STATES.COMPLETE and t.value == 160.0 and t.constraints == {"infeasible": 1.0}
    assert t.user_attrs["quality"] == "failed"
