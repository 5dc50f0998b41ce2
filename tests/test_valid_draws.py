"""A search that stays a search as the space grows: every draw valid by construction (search/space.py), the dry run
that shows what a search would hand to its trials (search/dry_run.py), start points held to the same rules, and a
searcher that does not stop drawing while a configuration that fits is known (search/study.py)."""
import glob
import json
import os

import optuna
import pytest

from trainscout.cli.main import main
from trainscout.search.args import SearchArgs, space_for
from trainscout.search.dry_run import dry_run, gpu_box, trial_base
from trainscout.search.searcher import make_sampler
from trainscout.search.space import Space, knob_params
from trainscout.search.trainable import before_run
from trainscout.spaces import REGISTRY, ConfigError, Context, Knob, all_knobs, resolve

HUB = os.path.join(os.path.dirname(__file__), "..", "bench", "models", "hub")
BOXES = [("H100", 1), ("H200", 1), ("H100", 8)]  # the three: one H100, one H200, 8 H100s

optuna.logging.set_verbosity(optuna.logging.WARNING)


def draws(model: str, kind: str, gpus: int, n: int, seed: int = 0) -> list[str]:
    """The verdicts of the first n draws of a search's own sampler over the default space on a GPU box, each judged
    as its trial would judge it before running (no results told: TPE's random start, as a cold search draws)."""
    args = SearchArgs(model=model, out="unused", gpus_per_trial=gpus)
    hw = gpu_box(kind, gpus)
    space, _ = space_for(args, hw)
    base = trial_base(args, hw)
    study = optuna.create_study(sampler=make_sampler(seed, n))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(before_run(space.sample(trial), base)[0])
    return out


@pytest.mark.parametrize("kind,gpus", BOXES)
def test_every_draw_of_the_default_space_is_valid_on_hub_models(kind, gpus):
    """Draws of the default space (24 knobs) for published config.json files, a dense 1B with a 128k vocabulary, a
    mixture of experts and a 7B, on one H100, one H200 and 8 H100s: none is refused by the knobs' rules (random draws
    of the same space were 12.5-14.5 % valid); what the memory model prunes is told, not refused."""
    for name in ("llama-3.2-1b", "olmoe-1b-7b-0924", "mistral-7b-v0.3"):
        got = draws(os.path.join(HUB, f"{name}.json"), kind, gpus, 12)
        assert "invalid" not in got and set(got) <= {"ok", "pruned"}, (name, got)


@pytest.mark.slow
def test_every_draw_is_valid_on_every_hub_model_in_a_dry_run():
    """The issue's whole check: `search --dry-run` of every config.json of bench/models/hub on each box, 200
    configurations each: at least 99 % of those handed to trials are ok or pruned by memory, none invalid."""
    total, bad, counts = 0, [], {}
    for path in sorted(glob.glob(os.path.join(HUB, "*.json"))):
        for kind, gpus in BOXES:
            try:
                got = dry_run(SearchArgs(model=path, out="unused", gpus_per_trial=gpus), gpu_box(kind, gpus), 200)
            except ConfigError as e:  # a config.json trainscout refuses (gemma-3-4b-pt-text names no head counts)
                print(f"{os.path.basename(path)} {gpus}x{kind}: refused: {e}")
                continue
            total += len(got["configs"])
            for c in got["configs"]:
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
            bad += [(path, kind, gpus, c["reason"]) for c in got["configs"] if c["verdict"] == "invalid"]
            print(f"{os.path.basename(path)} {gpus}x{kind}: " + ", ".join(
                f"{v} {sum(c['verdict'] == v for c in got['configs'])}" for v in ("ok", "pruned", "invalid")))
    print(f"all: {total} configurations, {counts}")
    assert total and len(bad) <= 0.01 * total and not bad, bad[:5]


# --- it grows: ten plugin knobs, each with a rule against another knob ---------------------------------------------
RULES = [("compile", True), ("activation_checkpointing", "full"), ("precision", "fp32"), ("zero_stage", 1),
         ("attention", "eager"), ("micro_batch_size", 4), ("loss_kernel", "compiled"), ("test_rule_0", "a"),
         ("test_rule_3", "b"), ("tf32", False)]


def rule_knob(i: int, other: str, bad):
    class Rule(Knob):
        """A test plugin knob whose value `a` the rules refuse beside one value of another knob."""

        name = f"test_rule_{i}"
        default = "off"
        choices = ("off", "a", "b")

        def check(self, value, cfg, ctx):
            if value == "a" and cfg.get(other) == bad:
                raise ConfigError(self.name, f"{self.name}=a refuses {other}={bad}: set one of them otherwise")

        def apply(self, plan, value, cfg, ctx):
            plan.knobs[self.name] = value
    return Rule()


@pytest.fixture
def ten_rules():
    for i, (other, bad) in enumerate(RULES):
        REGISTRY[f"test_rule_{i}"] = rule_knob(i, other, bad)
    yield [f"test_rule_{i}" for i in range(len(RULES))]
    for i in range(len(RULES)):
        del REGISTRY[f"test_rule_{i}"]


def sampled(space: Space, ctx: Context, n: int) -> tuple[int, list[dict]]:
    """(how many of n draws of a seeded TPE the rules refuse, the draws)."""
    study = optuna.create_study(sampler=make_sampler(3, n))
    refused, got = 0, []
    for _ in range(n):
        cfg = space.sample(study.ask())
        got.append(cfg)
        try:
            resolve(cfg, ctx)
        except ConfigError:
            refused += 1
    return refused, got


def test_ten_plugin_knobs_with_rules_leave_every_draw_valid_and_the_start_point_as_it_was(ten_rules):
    """Ten plugin knobs, each refusing a value beside another knob's (seven built-ins, two of each other): every draw
    is still valid (without the rules in the sampler about (2/3)^10 of them would not be: measured below), and the
    search's first configuration (the defaults) is the same, so its time to the first measurement is as it was."""
    from trainscout.search.start import space_defaults
    from trainscout.trial import prepare
    from trainscout.trial.runner import context
    spec = prepare("tiny", {}, device="cpu", workers=2)
    ctx = context(spec.model_config, spec.recipe["global_batch"], 2, {"device": "cpu"})
    space = Space.build({}, {}, ctx)
    assert set(ten_rules) <= set(space.domains)
    refused, got = sampled(space, ctx, 60)
    assert refused == 0 and {g[k] for g in got for k in ten_rules} == {"off", "a", "b"}
    blind, _ = sampled(Space(space.fixed, space.domains), ctx, 60)  # the same space without its context
    assert blind >= 10, blind
    without = {k: v for k, v in space_defaults(space).items() if k not in ten_rules}
    REGISTRY_BACKUP = {k: REGISTRY.pop(k) for k in ten_rules}
    try:
        plain = Space.build({}, {}, ctx)
        assert space_defaults(plain) == without
    finally:
        REGISTRY.update(REGISTRY_BACKUP)


def test_a_conditional_knob_is_drawn_under_a_name_that_carries_its_allowed_values(ten_rules):
    """A knob whose allowed values depend on what was drawn before is a parameter named for them (Optuna keeps a
    distribution's choices under one name); knob_params names it by knob again, and a point given by knob name
    (params_of) is drawn back as it was, or refused with the rule's reason."""
    from trainscout.trial import prepare
    from trainscout.trial.runner import context
    spec = prepare("tiny", {}, device="cpu", workers=2)
    ctx = context(spec.model_config, spec.recipe["global_batch"], 2, {"device": "cpu"})
    space = Space.build({}, {}, ctx)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    while space.sample(trial)["compile"] is not True:  # test_rule_0=a refuses compile=true
        trial = study.ask()
    cfg = space.sample(trial)
    assert "test_rule_0|off,b" in trial.params and "test_rule_0" not in trial.params
    assert knob_params(trial.params)["test_rule_0"] == cfg["test_rule_0"] != "a"
    point = {k: cfg[k] for k in knob_params(trial.params)}
    assert space.params_of(point) == trial.params
    with pytest.raises(ConfigError, match="test_rule_0=a refuses compile=True"):
        space.params_of(dict(point, test_rule_0="a"))


# --- the searcher draws on while a configuration that fits is known ----------------------------------------------
def test_the_searcher_draws_on_while_a_configuration_that_fits_is_known(tmp_path):
    """A space of 144 configurations of which the memory model lets one fit: the sampler's draws are pruned, and
    after FREE_RUN of them in a row the searcher hands out the one that fits (it stopped drawing there, with nothing
    measured); it stops only once no configuration predicted to fit is left, and says why."""
    from ray.tune.search import Searcher

    from trainscout.search import service
    domains = {"micro_batch_size": (1, 2, 4, 8, 16, 32, 64, 128), "activation_checkpointing": ("none", "full", 2),
               "attention": ("eager", "sdpa"), "compile": (False, True), "tf32": (False, True)}
    space = Space({k.name: k.default for k in all_knobs() if k.name not in domains}, domains)
    target = {"micro_batch_size": 32, "activation_checkpointing": 2, "attention": "eager", "compile": False,
              "tf32": False}

    def judge(config):
        return None if all(config[k] == v for k, v in target.items()) else "predicted over the GPU's memory"
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    searcher = service.make_searcher(space, "s", storage, make_sampler(0, 10), seed=0, target=5, judge=judge)
    handed = []
    for i in range(200):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        fits = judge(config) is None
        handed.append(fits)
        searcher.on_trial_complete(f"t{i}", {service.METRIC: 100.0 if fits else 0.0,
                                             "status": "ok" if fits else "pruned"})
    assert handed.count(True) == 1, handed  # the one that fits, measured once
    assert config == Searcher.FINISHED and "no configuration predicted to fit" in searcher.stopped_why
    assert len(handed) - 1 - handed.index(True) == service.FREE_RUN  # then FREE_RUN more draws, all pruned


# --- the dry run from the command line ----------------------------------------------------------------------------
def test_a_dry_run_lists_the_configurations_a_search_would_run(tmp_path, monkeypatch, capsys):
    """`search --dry-run --gpu H100 --json`: lookup's answer first, then the defaults' start points, then the
    sampler's draws, each with its verdict and reason; none invalid; nothing written."""
    monkeypatch.chdir(tmp_path)
    model = os.path.abspath(os.path.join(HUB, "qwen2.5-0.5b.json"))
    assert main(["search", "--model", model, "--gpu", "H100", "--dry-run", "--trials", "8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 8 and all({"config", "verdict", "reason", "source"} <= set(c) for c in got)
    assert got[0]["source"].startswith("start point from the atlas (lookup's")
    assert any(c["source"] == "sampler" for c in got) and not any(c["verdict"] == "invalid" for c in got)
    assert all(c["reason"] for c in got if c["verdict"] == "pruned")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags,field", [
    (["--gpu", "H100"], "--gpu"),                                     # a dry run's box without --dry-run
    (["--dry-run"], "--gpu"),                                         # a dry run without its box
    (["--dry-run", "--gpu", "H999"], "--gpu"),                        # a GPU kind not known
    (["--dry-run", "--gpu", "H100", "--out", "x"], "--out"),          # a flag that writes
    (["--dry-run", "--gpu", "H100", "--host-memory", "lots"], "--host-memory"),
    (["--dry-run", "--gpu", "H100", "--gpus", "0"], "--gpus"),
    (["--dry-run", "--gpu", "H100", "--set", "zero_stage=7"], "zero_stage"),
    (["--dry-run", "--gpu", "H100", "--resume", "x"], "--resume"),         # the flags of a run that writes
    (["--dry-run", "--gpu", "H100", "--track", "mlflow"], "--track"),
    (["--dry-run", "--gpu", "H100", "--time-budget", "1h"], "--time-budget"),
    (["--dry-run", "--gpu", "H100", "--storage", "sqlite:///x.db"], "--storage"),
    (["--dry-run", "--gpu", "H100", "--space", "/nonexistent.yaml"], "--space"),
    (["--dry-run", "--gpu", "H100", "--trials", "0"], "--trials"),
    (["--dry-run", "--gpu", "H100", "--gpu-memory", "lots"], "--gpu-memory"),
    (["--dry-run", "--gpu", "H100", "--set", "nosuch=1"], "nosuch"),
    (["--dry-run", "--gpu", "H100", "--gpus", "2", "--gpus-per-trial", "4"], "--gpus"),
    (["--dry-run", "--gpu", "H100", "--seq-len", "0"], "--seq-len"),
    (["--dry-run", "--gpu", "H100", "--set", "micro_batch_size=3"], "micro_batch_size"),
    (["--dry-run", "--gpu", "H20x"], "--gpu"),                        # near a kind, no kind
    # the FP8 recipes' knobs
    (["--dry-run", "--gpu", "H100", "--set", "fp8_weight_grad=high", "--set", "fp8=tensorwise"], "fp8_weight_grad"),
    (["--dry-run", "--gpu", "H100", "--set", "fp8_weight_grad=bf16"], "fp8_weight_grad"),
    (["--dry-run", "--gpu", "H100", "--set", "fp8_ends=high", "--set", "fp8=off"], "fp8_ends"),
    (["--dry-run", "--gpu", "H100", "--set", "fp8_ends=maybe"], "fp8_ends"),
    (["--dry-run", "--gpu", "A100", "--set", "fp8=rowwise"], "FP8 tensor cores"),
])
def test_a_dry_run_refuses_bad_input_in_one_line(flags, field, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        code = main(["search", "--model", "pythia-14m", *flags])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and field in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainscout: error: "), err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flags,field", [
    (["/nonexistent", "--quality", "100"], "DIR"),
    (["{tmp}", "--quality", "100"], "DIR"),                          # a folder without a store
    (["{tmp}", "--quality", "10"], "--quality"),                     # too short to tell
    (["{tmp}", "--quality", "0"], "--quality"),
    (["{tmp}", "--quality", "abc"], "--quality"),
    (["{tmp}", "--quality", "100", "--seeds", "0"], "--seeds"),
    (["{tmp}", "--quality", "100", "--global-batch", "0"], "--global-batch"),
])
def test_a_training_verdict_refuses_bad_input_in_one_line(flags, field, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(["verify", *(f.format(tmp=tmp_path) for f in flags)]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and field in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainscout: error: "), err
    assert os.listdir(tmp_path) == []


def test_start_points_pass_the_rules_the_draws_pass():
    """A cold search of a 7B mixture of experts on one H100: the defaults do not fit, and the start point took the
    saver predicted fastest (ZeRO-2 with CPU offload) with micro_batch_size=max, which DeepSpeed refuses: the search's
    first trial was invalid. Every start point is now held to the sampler's rules (Space.point_of)."""
    from trainscout.search.start import first
    model = os.path.join(HUB, "olmoe-1b-7b-0924.json")
    args = SearchArgs(model=model, out="unused", gpus_per_trial=1)
    hw = gpu_box("H100", 1)
    space, _ = space_for(args, hw)
    notes = []
    points, _, _ = first(args, space, hw, None, None, [], notes)
    assert points, notes
    for p in points:
        space.point_of(p)  # ConfigError where a rule refuses it
        assert before_run(space.point_of(p)[0], trial_base(args, hw))[0] != "invalid"


def test_the_summary_sets_the_atlas_start_point_beside_its_measurement(tmp_path):
    """A cold search's first guess is lookup's answer: its summary says what lookup gave for that point and what the
    search measured of it (a store's real rows; the trial itself needs a GPU, so its tokens/s is written here)."""
    from trainscout.search.start import first
    from trainscout.search.summary import source_lines, sources_measured
    from trainscout.store.store import Store
    from trainscout.trial.status import Status
    model = os.path.join(HUB, "llama-3.2-1b.json")
    args = SearchArgs(model=model, out="unused", gpus_per_trial=1)
    hw = gpu_box("H100", 1)
    space, _ = space_for(args, hw)
    _, atlas, _ = first(args, space, hw, None, None, [], [])
    assert atlas and atlas[0][1].kind in ("measured", "predicted") and atlas[0][1].tokens_per_s > 0
    point, why = atlas[0]
    settings = space.point_of(point)[0]
    config = dict(settings, micro_batch_size=8) if settings.get("micro_batch_size") == "max" else settings
    store = Store(f"sqlite:///{tmp_path / 'results.db'}")
    store.add_trial("s", "t0", None, Status.PRUNED, False, 0.0, dict(config, micro_batch_size=999))
    store.add_trial("s", "t1", "k1", Status.OK, False, why.tokens_per_s / 1.25, config)
    rows = sources_measured(store.trials("s"), atlas)
    assert rows[0]["tokens_per_s"] == pytest.approx(why.tokens_per_s / 1.25)
    assert rows[0]["error"] == pytest.approx(0.25)
    line = source_lines(rows, "the atlas")[0]
    assert f"{why.kind} {why.tokens_per_s:,.0f} tokens/s" in line and "25.0% above it" in line
    assert "never ran" in source_lines(sources_measured([], atlas), "the atlas")[0]


def test_a_trial_that_cannot_rank_skips_its_quality_gate(tmp_path):
    """The gate's step costs a trial time (a 7B's took most of its overhead): a trial whose tokens/s is far below the
    search's best that trains the same model cannot rank, so it is measured without it, and says why (a real trial)."""
    from trainscout.search.trainable import RANK_MARGIN, rank_bar
    from trainscout.store.store import Store
    from trainscout.trial import execute, prepare, quality
    from trainscout.trial.status import Status
    spec = prepare("tiny", {"micro_batch_size": 2, "precision": "bf16"}, device="cpu", workers=1, steps=2,
                   warmup=1, global_batch=4, measure_accum=2)
    store = Store(f"sqlite:///{tmp_path / 'results.db'}")
    assert rank_bar(store, "s") is None  # nothing measured yet: every trial is gated
    plain = execute(prepare("tiny", {"micro_batch_size": 2, "precision": "fp32"}, device="cpu", workers=1, steps=2,
                            warmup=1, global_batch=4, measure_accum=2), timeout=300)
    assert plain.ok, plain.error
    store.add_measurement("k0", plain)
    store.add_trial("s", "t0", "k0", Status.OK, False, 1e12, plain.config)  # as if it ran far faster than any
    bar = rank_bar(store, "s")
    assert bar["tokens_per_s"] == pytest.approx(1e12 * (1 - RANK_MARGIN)) and bar["trial"] == "t0"
    rec = execute(spec.replace(quality=dict(spec.quality, rank_bar=bar)), timeout=300)
    assert rec.ok, rec.error
    q = rec.metrics["quality"]
    assert q.get("skipped") and "gate" not in q and "cannot rank" in q["why"] and "gate_s" not in rec.metrics
    assert quality.status(rec.metrics)[0] == quality.UNVERIFIED


def test_pure_bf16_is_not_compiled_on_the_cpu():
    """A 6-trial CPU search of pythia-14m drew precision=bf16 with compile=true and crashed in inductor's C++ compile:
    the precision knob refuses the pair on the CPU, naming the fix, so the sampler never draws it there."""
    ctx = Context(device="cpu", installed=frozenset({"torchao"}))
    with pytest.raises(ConfigError, match="set compile=false or precision=bf16-mixed"):
        resolve({"precision": "bf16", "compile": True}, ctx)
    resolve({"precision": "bf16", "compile": False}, ctx)
    resolve({"precision": "bf16", "compile": True}, Context(device="cuda", installed=ctx.installed))
