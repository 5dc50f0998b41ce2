"""The search service with the real Ray Tune, Optuna and ASHA on the CPU (tiny model, 2 gloo workers)."""
import json
import os
import re
import sys

import optuna
import pytest

from trainscout.cli.main import main
from trainscout.search.service import make_sampler

from trainscout.search.space import Space
from trainscout.store import Store, default_url
from trainscout.spaces import Context, all_knobs

pytestmark = pytest.mark.timeout(900)

# Fast knobs only (no inductor or DeepSpeed compiles), as the CPU demo: optimizer_state too (torchao's low-bit states
# compile their step; the core search drew fp8 states, test_verdict's 4-bit ones: 5 and 8 graphs on a cold cache).
FAST = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
        "--set", "attention=sdpa", "--set", "optimizer_state=fp32"]


def search_cli(out, *extra, fast=True):
    return [sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
            "--gpus-per-trial", "2", "--steps", "3", "--warmup", "1", "--out", str(out), *(FAST if fast else []),
            *extra]


def search_here(out, *extra, fast=True) -> int:
    """The same search in this process, on the session's Ray (ray_local): no interpreter, imports and Ray of its
    own to start (15-20 s of each subprocess search on 2 cores); its exit code."""
    return main(search_cli(out, *extra, fast=fast)[3:])


def store_of(out):
    return Store(default_url(str(out)))


def test_search_runs_stops_early_and_serves_repeats_from_the_store(tmp_path, ray_local, capsys):
    """The search in this process on the session's Ray (a subprocess's own interpreter and Ray cost 10-15 s here).
    Its first trial may run in an idle group an earlier test left (the session's pool keeps one per key): every
    later trial must run in that same group, after it. (An environment variable set in this process's
    runner.USER_CACHES to give it groups of its own reached the driver's warm-up only, not the Tune trial actors: the
    warmed group of the other key held the last CPU and the search waited forever for its next trial actor.)"""
    out = tmp_path / "s1"
    capsys.readouterr()
    rc = search_here(out, "--trials", "6", "--seed", "3", "--set", "precision=bf16-mixed")  # bf16: torchao's AdamW
    res = capsys.readouterr()
    assert rc == 0, res.err[-3000:]
    trials = store_of(out).trials("s1")
    from trainscout.search.service import counted
    assert counted(trials) == 6 and len({t["trial"] for t in trials}) == len(trials)  # refused draws do not count
    statuses = [t["status"] for t in trials]
    assert statuses.count("ok") >= 1, statuses  # trials run one at a time here: a later one must beat the rung
    assert "stopped" in statuses, statuses  # ASHA ended at least one clearly slower trial after a step or two
    # a stopped trial is no crash of its configuration; its ranks leave at their next step boundary and its group
    # serves the next trial (trial.pool.Pool.stop): every trial after the first ran in the first one's processes
    records = sorted(store_of(out).measurements(), key=lambda r: (r.started_at, r.reused))
    assert not [r for r in records if r.status != "ok"], [r.error for r in records]
    reused = [r.reused for r in records]
    assert all(a < b for a, b in zip(reused, reused[1:])), [(r.started_at, r.reused) for r in records]
    assert re.search(r"^best, rank 1 \(trial #\d+\)( \(tie\))?:", res.out, re.M) and "tokens/s" in res.out
    # one reading of each number: ok COMPLETE with its tokens/s; PRUNED where ASHA stopped it (its reported steps as
    # intermediate values, Optuna's convention) or it was pruned before running; FAIL with its reason for invalid,
    # oom, crash, timeout (no value 0: the sampler reads their constraint, tests/test_study_states.py); a draw
    # skipped as a repeat is PRUNED too (not FAIL), and nothing is left RUNNING
    study = optuna.load_study(study_name="s1", storage=default_url(str(out)))
    assert study.metric_names == ["tokens_per_s"]  # optuna-dashboard showed "Objective 0"
    P, C, F = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL
    ran = {t.user_attrs["tune_trial_id"]: t for t in study.trials if "skipped" not in t.user_attrs}
    assert len(ran) == len(trials) and all(t.state in (P, C, F) for t in study.trials), [t.state for t in study.trials]
    assert all(t.state == P for t in study.trials if "skipped" in t.user_attrs)
    for row in trials:
        t = ran[row["trial"]]
        want = C if row["status"] == "ok" else P if row["status"] in ("stopped", "pruned") else F
        assert t.state == want, (row["status"], t.state)
        if row["status"] == "stopped":
            assert t.intermediate_values and t.value == row["tokens_per_s"] == list(t.intermediate_values.values())[-1]
        if want == F:
            assert t.value is None and t.user_attrs["error"], t.user_attrs
    # and tells what happened, for the dashboard and any tool reading it: the store's status, value and key
    by_status = {t["status"]: t for t in trials}
    for t in ran.values():
        a = t.user_attrs
        assert a["status"] in by_status and a.get("tokens_per_s") == t.value, a
        assert a["constraint"] == [0.0 if a["status"] in ("ok", "stopped") else 1.0]
        assert t.constraints == {"infeasible": a["constraint"][0]}  # what TPE reads (Trial.set_constraint)
        if a["status"] == "ok":
            assert a["key"] in {r["key"] for r in trials} and a["wall_s"] > 0
    # one numbering: the live table's "#", the report's and Optuna's trial number are the same
    shown = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s*(\d+) ([0-9a-f]{5,10}) +([a-z]+\*?) ",
                                                              res.out, re.M)}
    assert len(shown) == len(trials) and all(ran[tid].number == shown[tid[-10:]]
                                             for tid in ran), (shown, res.out[-2000:])
    from trainscout.analysis.report import analyse
    df = analyse(str(out)).df
    assert {r["trial"]: r["n"] for r in df.to_dict("records")} == {tid: t.number for tid, t in ran.items()}

    # a repeat of the best configuration is answered from the store, not measured again
    best = max((t for t in trials if t["status"] == "ok"), key=lambda t: t["tokens_per_s"])
    sets = [a for k, v in best["config"].items() for a in ("--set", f"{k}={v}")]
    assert search_here(tmp_path / "s2", "--trials", "1", "--storage", default_url(str(out)), *sets, fast=False) == 0
    [again] = store_of(out).trials("s2")
    assert again["cached"] and again["key"] == best["key"] and again["tokens_per_s"] == best["tokens_per_s"]
    assert len(store_of(out).measurements()) == len({t["key"] for t in trials if t["key"]})


def test_a_configuration_asha_stopped_is_answered_from_the_search_when_proposed_again(tmp_path):
    """TPE may propose a stopped configuration again; the trial reports the stopped value instead of running again."""
    from trainscout.search.trainable import stopped_before
    store = store_of(tmp_path)
    cfg = {"micro_batch_size": 4, "compile": False, "precision": "fp32", "activation_checkpointing": "none"}
    store.add_trial("s", "t1", None, "stopped", False, 1234.5, cfg)
    store.add_trial("s", "t2", "k", "ok", False, 999.0, dict(cfg, micro_batch_size=2))
    assert stopped_before(store, "s", dict(cfg)) == 1234.5
    assert stopped_before(store, "s", dict(cfg, micro_batch_size=2)) is None  # it ran in full: the store answers
    assert stopped_before(store, "s", dict(cfg, compile=True)) is None
    assert stopped_before(store, "other", cfg) is None  # another search's ASHA decided among other trials


def test_infeasible_region_is_sampled_less_after_it_failed():
    """Our space + sampler + outcome convention (oom -> value 0, not an exception) with the real Optuna TPE."""
    ctx = Context(world_size=1, device="cuda", num_layers=12, global_batch=1024)
    searched = {"micro_batch_size", "activation_checkpointing", "compile"}  # other knobs at their defaults: a new
    fixed = {k.name: k.default for k in all_knobs() if k.name not in searched}  # knob does not reshuffle the draws
    space = Space.build({"micro_batch_size": [1, 2, 4, 8, 16, 32, 64, 128],  # numbers: "max" finds its own fit
                         "activation_checkpointing": ["none", "full"]}, dict(fixed, precision="bf16-mixed"), ctx)

    def infeasible(cfg):  # "out of memory" without checkpointing at large micro-batches
        return cfg["activation_checkpointing"] == "none" and cfg["micro_batch_size"] >= 16

    def objective(trial):
        cfg = space.sample(trial)
        if infeasible(cfg):
            return 0.0
        return 1000.0 * cfg["micro_batch_size"] ** 0.5 * (1.2 if cfg["compile"] else 1.0)

    first = last = 0.0
    for seed in range(3):  # over three seeds: one study's 20 trials hold only a few draws of the region
        study = optuna.create_study(direction="maximize", sampler=make_sampler(seed, 60))
        study.optimize(objective, n_trials=60)
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
        flags = [infeasible(t.params | {k: v for k, v in space.fixed.items()}) for t in study.trials]
        first, last = first + sum(flags[:20]) / 60, last + sum(flags[-20:]) / 60
    assert last < first and last <= 0.25, (first, last)


MARKER = "/tmp/trainscout-pwned-marker"


@pytest.mark.parametrize("content, field", [
    ("zero_stage: [0, 1", "--space"),                       # bad YAML
    ("- zero_stage\n- fsdp\n", "--space"),                  # not a mapping
    ("no_such_knob: 1\n", "no_such_knob"),                  # unknown key
    ("zero_stage: {a: 1}\n", "zero_stage"),                 # wrong type
    ("zero_stage: 4\n", "zero_stage"),                      # out of domain
    ("zero_stage: []\n", "zero_stage"),                     # empty list
    ("micro_batch_size: 0\n", "micro_batch_size"),
    ("micro_batch_size: .nan\n", "micro_batch_size"),
    ("offload_params: true\n", "offload_params"),           # impossible combination (needs zero_stage=3)
    (f"zero_stage: !!python/object/apply:os.system ['touch {MARKER}']\n", "--space"),
    ("a: " + "[" * 2000 + "]" * 2000 + "\n", "--space"),    # deep nesting
])
def test_bad_space_files_exit_2_with_one_line(tmp_path, capsys, content, field):
    path = tmp_path / "space.yaml"
    path.write_text(content)
    out = tmp_path / "out"
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--trials", "2", "--space", str(path), "--out",
               str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and field in err and "Traceback" not in err, err
    assert not out.exists() and not os.path.exists(MARKER)  # nothing written half-way, no payload ran


def test_huge_space_file_is_refused(tmp_path, capsys):
    path = tmp_path / "space.yaml"
    path.write_text("# " + "x" * (10 << 20))
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--trials", "2", "--space", str(path), "--out",
               str(tmp_path / "o")])
    assert rc == 2 and "at most" in capsys.readouterr().err


@pytest.mark.parametrize("args, field", [
    (["--trials", "0"], "--trials"),
    (["--time-budget", "soon"], "--time-budget"),
    ([], "--trials"),                                        # neither --trials nor --time-budget
    (["--trials", "2", "--storage", "nosuchdb://x/y"], "--storage"),
    (["--trials", "2", "--model", "gpt-7"], "--model"),
    (["--trials", "2", "--set", "zero_stage"], "--set"),
    (["--trials", "2", "--gpus-per-trial", "-1"], "--gpus-per-trial"),
])
def test_bad_search_flags_exit_2(tmp_path, capsys, args, field):
    argv = ["search", "--device", "cpu", "--out", str(tmp_path / "o")]
    if "--model" not in args:
        argv += ["--model", "tiny"]
    rc = main(argv + args)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "o").exists()


def test_resume_of_a_folder_without_a_search(tmp_path, capsys):
    assert main(["search", "--resume", str(tmp_path)]) == 2
    assert "--resume" in capsys.readouterr().err


def test_gpu_start_point_is_the_default_with_the_largest_micro_batch_that_fits(tmp_path):
    """No GPU needed: the start point is computed from the space and the memory model, for an H200-like box."""
    from trainscout.search.service import SearchArgs, start_points, validate
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    args = SearchArgs(model="pythia-410m", out=str(tmp_path), device="cpu", trials=4)
    space, _, hw = validate(args)
    hw = dict(hw, device="cuda", gpu_memory_gib=80.0, gpu="NVIDIA H100", gpu_count=1)
    point, compiled = start_points(args, space, hw, None)
    assert (point["micro_batch_size"] == "max" and point["zero_stage"] == 0
            and point["activation_checkpointing"] == "none")
    assert point["compile"] is False and "compile_scope" not in point  # compile is searched: both defaults,
    assert compiled["compile"] is True and compiled["compile_scope"] == "layers"  # each layer compiled (auto)
    assert point["loss_kernel"] == "eager" and compiled["loss_kernel"] == "compiled"  # and the loss on its own
    assert all(point[k] == v for k, v in compiled.items() if k not in ("compile", "compile_scope", "loss_kernel"))
    numbers = Space(space.fixed, dict(space.domains, micro_batch_size=(4, 8, 16, 32, 64), compile=(False,)))
    [point] = start_points(args, numbers, hw, None)
    fits = {m: memory.predict(prepare("pythia-410m", dict(point, micro_batch_size=m), hw=hw)) <= 0.85 * 80 * 2**30
            for m in (4, 8, 16, 32, 64)}
    assert fits[point["micro_batch_size"]] and not any(fits[m] for m in fits if m > point["micro_batch_size"])
    cpu = dict(hw, device="cpu")  # the CPU: the defaults first too, at the smallest micro-batch the host holds
    [on_cpu] = start_points(args, Space(space.fixed, dict(space.domains, micro_batch_size=(1, 2, 4, 8, 16, 32))), cpu,
                            None)
    import psutil
    host_fits = [m for m in (1, 2, 4, 8) if memory.host_refusal(prepare("pythia-410m", dict(point, micro_batch_size=m),
                                                                        hw=cpu), psutil.virtual_memory().total) is None]
    assert on_cpu == dict(point, micro_batch_size=min(host_fits), compile=False)
    # a GPU with FP8 tensor cores (compute capability 9.0) and torchao installed: FP8 matmuls on the compiled point
    pytest.importorskip("torchao")
    from trainscout.trial.runner import context
    hopper = dict(hw, capability="9.0")
    spec = prepare("pythia-410m", {}, hw=hopper)
    gpu_space = Space.build({}, {}, context(spec.model_config, spec.recipe["global_batch"], 1, hopper))
    *_, compiled, fp8 = start_points(args, gpu_space, hopper, None)
    assert {k: v for k, v in fp8.items() if k in compiled} == dict(compiled, fp8="tensorwise")
    assert compiled["fp8"] == "off"
    from trainscout.spaces import get  # the knobs that apply with FP8 on (its recipes) at their defaults
    assert {k: get(k).default for k in set(fp8) - set(compiled)} == {k: fp8[k] for k in set(fp8) - set(compiled)}


def test_start_point_adds_the_cheapest_memory_saver_that_fits(tmp_path):
    """No GPU needed (the hardware dicts describe GPUs that are not here): where the defaults do not fit at the
    smallest micro-batch, the start point adds the cheapest saver the memory model predicts to fit the GPU and the
    host; where none does there is no start point, and the note says why, with each saver's prediction."""
    from trainscout.search.service import FIT_SHARE, SearchArgs, fits, space_defaults, start_points, validate
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    args = SearchArgs(model="pythia-6.9b", out=str(tmp_path), device="cpu", trials=4)
    space, _, hw = validate(args)
    h200 = dict(hw, device="cuda", gpu_memory_gib=139.8, gpu="NVIDIA H200", gpu_count=1)
    defaults = space_defaults(space)
    notes = []
    point = fits(args, space, h200, None, defaults, notes, host=125e9)
    assert point["activation_checkpointing"] == "full" and "activation_checkpointing=full" in notes[0]
    for saver in (4, 3, 2):  # every n-th layer saves less: predicted over the share, so not taken
        spec = prepare("pythia-6.9b", {"activation_checkpointing": saver, "micro_batch_size": 1}, hw=h200,
                       device="cuda")
        assert memory.predict(spec) > FIT_SHARE * 139.8 * memory.GiB
    first, compiled = start_points(args, space, h200, None, [])
    assert first["activation_checkpointing"] == compiled["activation_checkpointing"] == "full"
    # an 80 GiB GPU: checkpointing is not enough, the optimizer goes to the host (which has room for it)
    off = fits(args, space, dict(h200, gpu_memory_gib=80.0), None, defaults, [], host=256e9)
    assert off["zero_stage"] == 2 and off["offload_optimizer"] is True
    notes = []  # 24 GB of host memory: no saver keeping fp32 master weights fits both; pure bf16 does (last resort)
    lean = fits(args, space, dict(h200, gpu_memory_gib=80.0), None, defaults, notes, host=24e9)
    assert lean["precision"] == "bf16" and "the start point adds precision=bf16" in notes[0]
    args = SearchArgs(model="pythia-6.9b", out=str(tmp_path), device="cpu", trials=4, sets={"precision": "bf16-mixed"})
    space, _, _ = validate(args)  # precision fixed: nothing to start from, and why
    notes = []
    assert fits(args, space, dict(h200, gpu_memory_gib=80.0), None, space_defaults(space), notes, host=24e9) is None
    assert notes[0].startswith("no start point") and "offload_optimizer=true" in notes[0] and "host" in notes[0]


def test_start_points_from_the_store_take_the_best_mfu_of_other_models_on_this_gpu(tmp_path, h200_grid):
    """No GPU needed: the real H200 grid of Pythia-160M (bench/data/grid-h200) seeds a Pythia-410M search on an
    H200-like box: its highest-MFU configurations, put into the space (micro-batch probed again), valid here."""
    from trainscout.search.service import SearchArgs, start_points, store_points, validate
    from trainscout.store import open_store
    grid = open_store("sqlite:///" + os.path.join(h200_grid, "results.db")).measurements()
    gpu = grid[0].hardware["gpu"]
    args = SearchArgs(model="pythia-410m", out=str(tmp_path), device="cpu", trials=4)
    space, _, hw = validate(args)
    hw = dict(hw, device="cuda", gpu_memory_gib=139.8, gpu=gpu, gpu_count=1)
    have = start_points(args, space, hw, None)
    known = store_points(args, space, hw, grid, have)
    assert len(known) == 2 and all(gpu in why and "pythia-160m" in why for _, why in known)
    best = max((r for r in grid if r.ok), key=lambda r: r.m["mfu"])
    first, _ = known[0]
    assert first["micro_batch_size"] == "max" and first not in have
    assert all(first[k] == best.config[k] for k in first if k in best.config and k != "micro_batch_size")  # its knobs
    # the same best with a failed quality gate (it trains another model): not a start point to copy
    failed = best.replace(metrics=dict(best.metrics, quality={"gate": "failed", "changes": {"fp8": "x"},
                                                              "why": "test"}))
    again = store_points(args, space, hw, [failed if r is best else r for r in grid], have)
    assert again and f"MFU {best.m['mfu']:.3f}" not in again[0][1], (again[0][1], best.m["mfu"])
    assert store_points(args, space, dict(hw, gpu="NVIDIA A100"), grid, have) == []  # another GPU kind: none
    assert store_points(SearchArgs(model="pythia-160m", out=str(tmp_path)), space, hw, grid, have) == []  # own model


# --- what counts toward --trials; the start point on every device (issue 30) --------------------------------------
def test_draws_refused_or_pruned_before_running_do_not_use_up_the_trials(tmp_path, ray_local):
    """The real Ray Tune + Optuna around a trainable that refuses half the space (invalid) and prunes a quarter: a
    search of --trials 2 ends after exactly 2 trials that ran, however many free draws came between (a CPU search
    of pythia-14m, 3 trials, ran 1 invalid and 2 pruned draws and measured nothing). Where every draw is refused,
    the search stops after FREE_RUN of them in a row and says so."""
    from ray import tune

    from trainscout.search import service
    ctx = Context(world_size=1, device="cpu", num_layers=2, global_batch=16)
    space = Space.build({"precision": ["fp32", "bf16-mixed"], "attention": ["eager", "sdpa"],
                         "activation_checkpointing": ["none", "full"]}, {}, ctx)
    space = Space(space.fixed, {k: v for k, v in space.domains.items()
                                if k in ("precision", "attention", "activation_checkpointing")})

    def outcome(config, refuse_all=False):
        if refuse_all or config["attention"] == "eager":
            return "invalid"
        return "pruned" if config["activation_checkpointing"] == "full" and config["precision"] == "fp32" else "ok"

    def trainable(config, refuse_all=False):
        status = outcome(config, refuse_all)
        tune.report({"tokens_per_s": 100.0 if status == "ok" else 0.0, "status": status})

    for refuse_all, want in ((False, 2), (True, 0)):
        storage = f"sqlite:///{tmp_path}/s{int(refuse_all)}.db"
        searcher = service.make_searcher(space, f"s{int(refuse_all)}", optuna.storages.RDBStorage(storage),
                                         make_sampler(0, 2), seed=0, target=2)
        tuner = tune.Tuner(tune.with_parameters(trainable, refuse_all=refuse_all), tune_config=tune.TuneConfig(
            search_alg=searcher, num_samples=-1, max_concurrent_trials=1, reuse_actors=True),  # as driver.py
            run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0))
        results = tuner.fit()
        statuses = [r.metrics["status"] for r in results]
        assert statuses.count("ok") == want and len(statuses) > want, statuses
        if refuse_all:
            assert len(statuses) == service.FREE_RUN and "last 30 draws were refused or pruned" in searcher.stopped_why
        else:
            assert searcher.stopped_why is None and statuses[-1] == "ok"  # it ended at the second that ran


def test_the_searcher_keeps_optunas_trial_states_through_its_public_api(tmp_path):
    """Tune's Searcher interface over the study (search/study.py), driven as Tune drives it, without Ray: each step an
    intermediate value; ASHA's stop PRUNED at the step it stopped, its value the last; an unscheduled trial or one
    that raised FAIL; an ok one COMPLETE; Tune's saved state JSON. It is a Searcher of its own, not Ray's
    OptunaSearch, whose private study and trial table (_ot_study, _ot_trials) it used to write."""
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    from trainscout.search import service
    domains = {"micro_batch_size": (1, 2, 4), "activation_checkpointing": ("none", "full")}
    space = Space({k.name: k.default for k in all_knobs() if k.name not in domains}, domains)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    searcher = service.make_searcher(space, "s", storage, make_sampler(0, 4), seed=0)
    assert isinstance(searcher, Searcher) and not isinstance(searcher, OptunaSearch)
    for tid in ("ok", "stopped", "unscheduled", "raised"):
        config = searcher.suggest(tid)
        assert set(domains) <= set(config) and searcher.drawn[tid].user_attrs[service.TUNE_ID] == tid
    searcher.on_trial_result("stopped", {service.METRIC: 5.0, "training_iteration": 1})
    searcher.on_trial_complete("ok", {service.METRIC: 9.0, "status": "ok"})
    searcher.on_trial_complete("stopped", {service.METRIC: 6.0, "status": "running", "training_iteration": 2})
    searcher.on_trial_complete("unscheduled", {service.METRIC: 0.0, "status": "unscheduled"})
    searcher.on_trial_complete("raised", None, error=True)
    study = optuna.load_study(study_name="s", storage=storage)
    by_tune = {t.user_attrs[service.TUNE_ID]: t for t in study.trials}
    S = optuna.trial.TrialState
    assert {k: t.state for k, t in by_tune.items()} == {"ok": S.COMPLETE, "stopped": S.PRUNED, "unscheduled": S.FAIL,
                                                         "raised": S.FAIL}
    assert by_tune["ok"].value == 9.0 and by_tune["ok"].constraints == {"infeasible": 0.0}
    assert by_tune["stopped"].intermediate_values == {1: 5.0, 2: 6.0} and by_tune["stopped"].value == 6.0
    assert by_tune["stopped"].user_attrs["status"] == "stopped" and study.metric_names == [service.METRIC]
    assert searcher.counted == 4 and searcher.stopped_why is None
    searcher.save(str(tmp_path / "state"))
    assert json.loads((tmp_path / "state").read_text())["completed"] == ["ok", "raised", "stopped", "unscheduled"]


def test_a_cpu_search_starts_from_the_defaults_with_the_knobs_it_is_given(tmp_path, ray_local):
    """`search --trials 1 --set ...` on the CPU runs the start point: the knobs given as given, every other searched
    knob at its default (it drew random values for them: eager attention, full checkpointing, FSDP on one GPU)."""
    out = tmp_path / "start"
    assert search_here(out, "--trials", "1", "--seed", "7", "--set", "precision=fp32", "--set",
                       "micro_batch_size=4") == 0
    [t] = store_of(out).trials("start")
    defaults = {k.name: k.default for k in all_knobs()}
    given = {"precision": "fp32", "micro_batch_size": 4, "compile": False, "loss_kernel": "eager", "zero_stage": 0,
             "tf32": True, "attention": "sdpa", "optimizer_impl": "foreach"}  # auto: foreach on the CPU, stored so
    assert t["status"] in ("ok", "stopped") and t["config"] == dict(defaults, **given), t["config"]


def test_a_fixed_probed_micro_batch_is_checked_for_fit_at_micro_batch_1():
    """fits() with micro_batch_size=max fixed predicted the defaults at the probe's largest candidate (128: 385 GiB
    for Pythia-410M) and gave no start point; the probe finds its own fit, so the check is at micro-batch 1."""
    from trainscout.search.service import SearchArgs, start_points
    from trainscout.trial import prepare
    from trainscout.trial.runner import context
    hw = {"device": "cuda", "gpu_count": 1, "gpu": "NVIDIA H200", "capability": "9.0", "gpu_memory_gib": 139.8,
          "cpu": "x86_64", "cpu_count": 16}
    ctx = context(prepare("pythia-410m", {}, hw=hw).model_config, 1024, 1, hw)
    space = Space.build({"micro_batch_size": "max", "compile": [False, True]}, {}, ctx)
    notes = []
    points = start_points(SearchArgs(model="pythia-410m", out="unused"), space, hw, None, notes)
    assert points, notes  # (fixed knobs are not in a point: the space holds them)
    assert not any("no start point" in n for n in notes), notes


def test_the_cpu_demo_keeps_the_flags_it_is_given(tmp_path, ray_local, capsys):
    """`trainscout search` without --model on a box without a GPU runs the CPU demo; a --steps, --warmup,
    --gpus-per-trial or --trials given beside it is kept, and the demo's line says what it runs (it set its own
    steps and ranks over the given ones, and always said 6 trials)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("the demo is what a box without a GPU runs")
    out = tmp_path / "demo"
    assert main(["search", "--trials", "1", "--steps", "2", "--gpus-per-trial", "1", "--out", str(out)]) == 0
    assert "running the CPU demo search (tiny model, 1 workers, 1 trials)" in capsys.readouterr().err
    [rec] = store_of(out).measurements()
    assert rec.model == "tiny" and rec.timed_steps == 2 and rec.world_size == 1


# --- a search that measured nothing (issue 46, item 1 and 2) -------------------------------------------------------
def test_a_search_where_nothing_fits_exits_1_and_says_what_came_closest(tmp_path, ray_local, monkeypatch, capsys):
    """A real CPU search on a host of 0.5 GiB (a mock of a smaller machine: the driver's hardware says so; the
    trials' host-memory rule, predictor/memory.host_refusal, prunes every draw before it runs): it measures nothing,
    stops drawing after FREE_RUN draws, exits 1 (it exited 0), and its summary, live and in --json, names the
    configuration the memory model puts closest to fitting and what would make it fit."""
    from trainscout.search import service
    real = service.validate

    def small_host(args):
        space, base, hw = real(args)
        return space, base, dict(hw, host_memory_gib=0.5)
    monkeypatch.setattr(service, "validate", small_host)
    out = tmp_path / "none"
    assert search_here(out, "--trials", "2", "--json") == 1
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    assert summary["measured"] == 0 and summary["best"] == [] and set(summary["by_status"]) <= {"pruned", "invalid"}
    assert summary["by_status"]["pruned"] >= 1 and "stopped drawing: the last 30 draws" in cap.err
    fit = summary["nothing_fits"]
    assert fit["host_gib"] == 0.5 and fit["closest"]["host_gib"] > 0.45 and fit["closest"]["over"] > 1
    host = next(w for w in fit["would_fit"] if w["how"] == "host")
    assert host["need_host_gib"] >= fit["closest"]["host_gib"] / 0.9  # the rule's 10 % margin
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    spec = prepare("tiny", fit["closest"]["config"], workers=2, device="cpu")  # its knobs other than the defaults
    assert fit["closest"]["host_gib"] == round(memory.host_need(memory.host_peak(spec)) / memory.GiB, 1)
    # live (here on stderr, beside the JSON) and in the error line
    assert "nothing measured: no trial of this search ended ok" in cap.err
    assert "nothing fits: the memory model puts every configuration" in cap.err and "  closest (" in cap.err
    assert f"a host with {host['need_host_gib']:.2f} GiB of memory (this one has 0.50)" in cap.err
    last = cap.err.strip().splitlines()[-1]
    assert last.startswith("trainscout: error: search none measured nothing: ") and "nothing fits" in last, last
    print(cap.err[cap.err.index("\n") + 1:][-3000:])


def test_a_search_whose_every_trial_ran_out_of_memory_exits_1(tmp_path, ray_local, monkeypatch, capsys):
    """Every trial out of memory (a real allocator failure, the fault schedule): nothing measured, exit 1, and no
    claim that nothing fits (the memory model predicts the start point to fit: the trials' reasons say why)."""
    monkeypatch.setenv("TRAINSCOUT_FAULT_SCHEDULE", "0:oom")
    out = tmp_path / "oom"
    assert search_here(out, "--trials", "1") == 1
    cap = capsys.readouterr()
    assert "1 trials: 1 oom" in cap.out and "nothing measured: no trial of this search ended ok (1 oom)" in cap.out
    assert "nothing fits" not in cap.out
    last = cap.err.strip().splitlines()[-1]
    assert last.startswith("trainscout: error: search oom measured nothing: 1 trial, none ok (1 oom): see each "
                           "trial's reason"), last


def test_where_nothing_fits_the_memory_model_says_what_would(tmp_path):
    """No GPU needed (the hardware dict is a mock of an H100 80 GB on a 128 GiB host; nothing runs): the user's
    Mistral-7B-shaped config.json (bench/models/hub) had no start point (the defaults 137.7 GiB at micro-batch 1, no
    saver of the space fitting GPU and host) and a search that measured nothing, saying neither what would run nor
    what to change. The closest is the start point's ZeRO-2 + optimizer offload saver, which fits the GPU but not
    the host; a host of 123.0 / 0.9 GiB would run it, and so would 2 GPUs, each by the memory model's own rules."""
    from trainscout.search.service import SearchArgs, validate
    from trainscout.search.nearest import fit_lines, nearest_fit
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    model = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "models", "hub",
                         "mistral-7b-v0.3.json")
    # fp32 master weights asked for (precision fixed): pure bf16 (precision=bf16) would fit one H100, and is the start
    # point where precision is searched (tests/test_agree.py)
    args = SearchArgs(model=model, out=str(tmp_path), device="cpu", time_budget_s=300, sets={"precision": "bf16-mixed"})
    space, _, hw = validate(args)
    h100 = dict(hw, device="cuda", gpu_memory_gib=79.1, gpu="NVIDIA H100 80GB HBM3 (mock)", gpu_count=1,
                capability="9.0")
    host = 128 * memory.GiB
    pruned = {"trial": "a" * 20, "status": "pruned", "config": {"micro_batch_size": 4, "predicted_gib": 150.0}}
    fit = nearest_fit(args, space, h100, None, host, [pruned])
    c = fit["closest"]
    assert c["config"]["offload_optimizer"] is True and c["config"]["micro_batch_size"] == 1
    assert c["gpu_gib"] < 0.85 * 79.1 and c["host_gib"] > 0.9 * 128 and c["over"] > 1  # fits the GPU, not the host
    spec = prepare(model, c["config"], hw=h100)
    assert c["gpu_gib"] == round(memory.predict(spec) / memory.GiB, 2)
    assert c["host_gib"] == round(memory.host_need(memory.host_peak(spec)) / memory.GiB, 2)
    assert memory.host_refusal(spec, host) is not None  # the search's own host rule refuses it
    ways = {w["how"]: w for w in fit["would_fit"]}
    assert ways["host"]["need_host_gib"] == pytest.approx(c["host_gib"] / 0.9, abs=0.02)
    assert memory.host_refusal(spec, ways["host"]["need_host_gib"] * memory.GiB) is None  # and that host runs it
    gpus = ways["ranks"]
    assert gpus["ranks"] == 2 and gpus["gpu_gib"] <= 0.85 * 79.1 and gpus["host_gib"] <= 0.9 * 128
    two = prepare(model, dict(c["config"], **gpus["changes"]), workers=2, hw=dict(h100, gpu_count=2))
    assert gpus["gpu_gib"] == round(memory.predict(two) / memory.GiB, 2) and memory.host_refusal(two, host) is None
    assert ways["knob"]["changes"] is None  # no one knob makes it fit one H100 on this host
    text = "\n".join(fit_lines(fit))
    assert "closest (the start point's defaults with a memory saver)" in text and "2 GPUs (--gpus-per-trial 2)" in text
    assert f"a host with {ways['host']['need_host_gib']:.1f} GiB of memory (this one has 128.0)" in text
    json.dumps(fit)  # the --json summary carries it
