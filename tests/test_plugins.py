"""Knobs from another installed package (examples/knob-plugin): listed by `trainscout knobs`, sampled by the
search's define-by-run space, applied to the plan the workers get, and (mlp_checkpointing) transforming the model
through trainscout.runtime.prepare_model, as the trial engines run it. A broken plugin is named and left out.

The plugins are installed into a temporary folder put on PYTHONPATH of the commands these tests run (a module and a
dist-info written as an install writes them): the environment the suite runs in is never changed (a pip install into
the running venv made a `trainscout trial` beside the suite fail with No module named 'trainscout_example_knob')."""
import json
import os
import subprocess
import sys
import textwrap

import pytest


CHECK = r"""
import json, optuna
from trainscout.search.space import Space
from trainscout.search.service import make_sampler
from trainscout.spaces import Context, resolve
ctx = Context(world_size=1, device="cuda", num_layers=2, global_batch=16)
space = Space.build({}, {}, ctx)
study = optuna.create_study(sampler=make_sampler(0, 12))
seen, mlp = set(), set()
for _ in range(12):
    t = study.ask(); cfg = space.sample(t); seen.add(cfg["cuda_alloc_conf"]); mlp.add(cfg["mlp_checkpointing"])
    study.tell(t, 1.0)
cfg, plan = resolve({"cuda_alloc_conf": "expandable_segments"}, ctx)
from trainscout.runtime import prepare_model, transforms
from trainscout.trial.models import build_model, resolve_model
model = build_model(resolve_model("tiny").config, "sdpa", 64)
wrapped = {}
for on in (False, True):
    model = build_model(resolve_model("tiny").config, "sdpa", 64)
    prepare_model(model, resolve({"mlp_checkpointing": on, "precision": "fp32"}, ctx)[1])
    wrapped[str(on)] = sorted({type(layer.mlp).__name__ for layer in model.gpt_neox.layers})
order = [k.name for k in transforms()]
print(json.dumps({"seen": sorted(seen), "mlp": sorted(mlp), "env": plan.env, "wrapped": wrapped, "order": order,
                  "module": type(__import__("trainscout.spaces", fromlist=["get"]).get("cuda_alloc_conf")).__module__}))
"""


def with_path(folder) -> dict:
    """This process's environment with folder first on PYTHONPATH (what the commands under test get)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture(scope="module")
def plugin_env(example_plugin):
    """The example plugin installed in a folder of its own (conftest's example_plugin), not the running venv."""
    return with_path(example_plugin)


def test_the_plugin_is_not_installed_in_the_running_environment(plugin_env):
    from importlib.metadata import entry_points
    assert not [ep for ep in entry_points(group="trainscout.knobs")]  # the suite's own venv is untouched
    assert "trainscout_example_knob" not in sys.modules


@pytest.fixture(scope="module")
def plugin_search(plugin_env, tmp_path_factory):
    """The search of test_a_real_search_samples_the_plugin_knob (the file's last test), started when
    test_plugin_knob_is_listed_sampled_and_applied starts: it runs while that test's commands and the broken plugins'
    run (after them, alone, it took 17.5 s): (Popen, out, read() -> stderr once it ended, from a file)."""
    root = tmp_path_factory.mktemp("plugin-search")
    out = root / "plug"
    fixed = {"compile": "false", "loss_kernel": "eager", "zero_stage": 0, "tf32": "true", "attention": "sdpa",
             "precision": "fp32", "micro_batch_size": 4, "fsdp": "off", "activation_checkpointing": "none",
             # torchao's low-bit states compile their step: 49 s here on a cold cache
             "pipeline_stages": 1, "optimizer_state": "fp32"}
    sets = [a for k, v in fixed.items() for a in ("--set", f"{k}={v}")]
    p = subprocess.Popen([sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
                          "--gpus-per-trial", "2", "--steps", "1", "--warmup", "0", "--trials", "2", "--seed", "0",
                          "--global-batch", "16", "--out", str(out), *sets], stdout=subprocess.DEVNULL,
                         stderr=open(root / "err", "w"), env=plugin_env)

    def read():
        p.wait(timeout=600)
        return (root / "err").read_text()
    yield p, out, read
    if p.poll() is None:
        p.kill()
        p.wait()


def test_plugin_knob_is_listed_sampled_and_applied(plugin_env, plugin_search):
    # the two commands at once (their interpreters' imports are most of each)
    knobs = subprocess.Popen([sys.executable, "-m", "trainscout.cli", "knobs", "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=plugin_env)
    check = subprocess.Popen([sys.executable, "-c", CHECK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=plugin_env)
    (out, err), (checked, check_err) = knobs.communicate(timeout=120), check.communicate(timeout=300)
    assert knobs.returncode == 0 and check.returncode == 0, (err[-2000:], check_err[-2000:])
    row = {r["name"]: r for r in json.loads(out)}["cuda_alloc_conf"]
    assert row["module"] == "trainscout_example_knob" and row["domain"] == "default|expandable_segments"
    res = json.loads(checked.strip().splitlines()[-1])
    assert res["seen"] == ["default", "expandable_segments"]  # the search samples it
    assert res["mlp"] == [False, True]
    assert res["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert res["module"] == "trainscout_example_knob"
    # the plugin's model transform: each decoder layer's MLP checkpointed, applied in the declared order
    assert res["wrapped"] == {"False": ["GPTNeoXMLP"], "True": ["CheckpointWrapper"]}
    order = res["order"]
    assert order.index("loss_kernel") < order.index("mlp_checkpointing") < order.index("compile_scope")


# --- broken plugins (issue 30) -----------------------------------------------------------------------------------
KNOB = """
from trainscout.spaces import Knob, register

@register
class {cls}(Knob):
    '''A plugin knob for the tests.'''
    name = {name!r}
    default = "off"
    choices = ("off", "on")
{body}
"""
APPLY = "    def apply(self, plan, value, cfg, ctx):\n        plan.knobs[self.name] = value\n"
# an apply that changes what a worker reads (its environment): the knob passes every check that does not look at
# its requires
APPLY_ENV = "    def apply(self, plan, value, cfg, ctx):\n        plan.env['TS_TEST_KNOB'] = value\n"
BROKEN = {  # distribution -> (entry point, module source, what its warning says)
    "ts-bad-import": ("bad_import", "import trainscout_no_such_module_x\n", "ModuleNotFoundError"),
    "ts-bad-choices": ("bad_choices", KNOB.format(cls="Ch", name="bad_choices", body=APPLY + textwrap.indent(
        "@property\ndef choices(self):\n    raise RuntimeError('no domain today')\n", "    ")), "no domain today"),
    "ts-bad-apply": ("bad_apply", KNOB.format(cls="Ap", name="bad_apply", body=(
        "    def apply(self, plan, value, cfg, ctx):\n        plan.knobs[self.name] = cfg['no_such_knob']\n")),
        "KeyError"),
    "ts-no-apply": ("no_apply", KNOB.format(cls="Na", name="no_apply", body="    pass\n"), "has no apply"),
    "ts-collides": ("collides", KNOB.format(cls="Zs", name="zero_stage", body=APPLY), "registered twice"),
    # a required value no configuration has: the knob would never apply, without a word
    "ts-bad-requires": ("bad_requires", KNOB.format(cls="Rq", name="bad_requires", body=APPLY_ENV + (
        "    requires = {'zero_stage': (3, 7)}\n")), "requires zero_stage=7, outside zero_stage's domain 0|1|2|3"),
    "ts-requires-none": ("requires_none", KNOB.format(cls="Rn", name="requires_none", body=APPLY_ENV + (
        "    requires = {'no_such_knob_x': ('on',)}\n")), "requires no_such_knob_x, which no knob registers"),
}
WORKS_UNTIL_USED = ("ts-bad-transform", "bad_transform", "from trainscout.spaces.roles import Costs, Runtime\n"
                    "class Swaps(Runtime):\n"
                    "    def transform(self, model, plan):\n"
                    "        if plan.knobs.get('bad_transform') == 'on':\n"
                    "            raise ValueError('cannot swap these modules')\n"
                    "        return model\n"
                    "class Guesses(Costs):\n"
                    "    def memory(self, terms, plan, spec):\n        raise ZeroDivisionError('no estimate')\n"
                    + KNOB.format(cls="Tr", name="bad_transform", body=APPLY + (
                        "    runtime = Swaps(stage='modules')\n    costs = Guesses()\n")))


def fake_dist(folder, dist: str, module: str, source: str) -> None:
    """An installed distribution as importlib.metadata finds it on sys.path: its module and a dist-info folder."""
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[trainscout.knobs]\n{module} = {module}\n")


@pytest.fixture
def broken_env(tmp_path):
    for dist, (module, source, _) in BROKEN.items():
        fake_dist(tmp_path, dist, module, source)
    fake_dist(tmp_path, WORKS_UNTIL_USED[0], WORKS_UNTIL_USED[1], WORKS_UNTIL_USED[2])
    return with_path(tmp_path)


def test_a_broken_plugin_is_named_and_left_out_and_the_rest_works(broken_env):
    """Plugins that fail to import, raise in choices or in apply, have no apply, or take a built-in's name: each is
    left out with one warning naming its package, its entry point and the error; `trainscout knobs` lists every
    other knob (the built-ins and the plugin that loads) and exits 0; a configuration can be estimated."""
    estimating = subprocess.Popen([sys.executable, "-m", "trainscout.cli", "estimate", "--model", "tiny", "--set",
                                   "bad_transform=on"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=broken_env)  # at once with `knobs` (their interpreters' imports are most of each)
    res = subprocess.run([sys.executable, "-m", "trainscout.cli", "knobs", "--json"], capture_output=True, text=True,
                         timeout=120, env=broken_env)
    est_out, est_err = estimating.communicate(timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    names = {r["name"]: r["module"] for r in json.loads(res.stdout)}
    assert names["zero_stage"] == "trainscout.spaces.knobs.zero_stage" and "bad_transform" in names
    assert not {"bad_choices", "bad_apply", "no_apply", "bad_requires", "requires_none"} & set(names)
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("trainscout: warning: the knob plugin")]
    assert len(warnings) == len(BROKEN), res.stderr
    for dist, (module, _, why) in BROKEN.items():
        [line] = [w for w in warnings if f" {dist} (entry point {module} = {module})" in w]
        assert why in line and "left out" in line and f"uninstall {dist}" in line, line
    assert estimating.returncode == 0 and "predicted" in est_out, est_err[-3000:]
    assert "ts-bad-transform (entry point bad_transform = bad_transform)'s memory hook of bad_transform is left out: " \
           "ZeroDivisionError: no estimate" in est_err, est_err


def test_every_registered_knob_requires_values_in_the_other_knobs_domain():
    """The load check plugins are held to, over the built-in knobs: each required knob exists and each required
    value is in its domain."""
    from trainscout.spaces import all_knobs
    from trainscout.spaces.plugins import requires_problem
    knobs = all_knobs()
    assert any(k.requires for k in knobs)
    assert {k.name: requires_problem(k) for k in knobs} == {k.name: None for k in knobs}


def test_a_plugin_transform_that_raises_fails_naming_the_plugin(broken_env):
    code = textwrap.dedent("""
        from trainscout.runtime import prepare_model
        from trainscout.spaces import Context, resolve
        from trainscout.trial.models import build_model, resolve_model
        ctx = Context(world_size=1, device="cpu", num_layers=2, global_batch=16)
        model = build_model(resolve_model("tiny").config, "sdpa", 64)
        prepare_model(model, resolve({"precision": "fp32"}, ctx)[1])  # at its default: nothing to swap, it runs
        try:
            prepare_model(model, resolve({"precision": "fp32", "bad_transform": "on"}, ctx)[1])
        except RuntimeError as e:
            print(e)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=broken_env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == ("the knob plugin ts-bad-transform (entry point bad_transform = bad_transform) failed "
                                  "in the transform of bad_transform (ValueError: cannot swap these modules): fix it, "
                                  "uninstall it, or set bad_transform=off"), res.stdout


def test_a_real_search_samples_the_plugin_knob(plugin_search):
    """`trainscout search` (Ray Tune + Optuna, tiny model on 2 gloo workers) with everything fixed but the plugins'
    knobs: every trial's configuration carries them, every trial ran (the model transform included), and the stored
    plans set the worker environment and the plugin setting they ask for. Ray's workers find the plugin through the
    driver's PYTHONPATH, as they would through a venv it was installed into."""
    p, out, read = plugin_search
    stderr = read()
    assert p.returncode == 0, stderr[-3000:]
    from trainscout.analysis.table import store_of
    store = store_of(str(out))
    trials = store.trials("plug")
    assert len(trials) == 2 and all(t["config"]["cuda_alloc_conf"] in ("default", "expandable_segments")
                                    for t in trials)
    assert all(t["config"]["mlp_checkpointing"] in (False, True) and t["status"] in ("ok", "stopped") for t in trials)
    for rec in store.measurements():
        want = ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if rec.config["cuda_alloc_conf"] != "default"
                else {})
        assert rec.plan.env == want
        assert rec.plan.knobs == ({"mlp_checkpointing": True} if rec.config["mlp_checkpointing"] else {})


def test_a_store_written_with_a_plugin_knob_is_read_without_the_plugin(plugin_search, tmp_path, capsys):
    """The real plugin search's store read in this process, where the plugin is not installed: results and export
    read it; train and verify of its configuration are one line naming the knob and that a plugin's knob
    needs its package installed (it said only "unknown knob"), exit 2, nothing written; a resume warns in one line
    that it draws without the plugin's knobs."""
    from trainscout.cli.main import main
    p, out, read = plugin_search
    assert p.wait(timeout=600) == 0, read()[-3000:]
    assert main(["results", str(out), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2  # its trials (a column per knob registered here)
    exp = tmp_path / "exp"
    assert main(["export", str(out), "--best", "--out", str(exp)]) == 0
    assert "cuda_alloc_conf" in json.loads((exp / "trainscout.json").read_text())["config"]
    capsys.readouterr()
    for argv in (["train", "--config", str(exp), "--steps", "1", "--out", str(tmp_path / "ckpt")],
                 ["verify", str(out), "--steps", "1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "unknown knob 'cuda_alloc_conf'" in err and "a plugin's knob needs its package installed" in err, err
    assert not (tmp_path / "ckpt").exists()
    assert main(["search", "--resume", str(out), "--json"]) == 0  # its 2 trials done: nothing runs
    warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("trainscout: warning:")]
    assert len(warned) == 1 and "its measurements set cuda_alloc_conf, mlp_checkpointing, which no installed knob " \
                                "registers" in warned[0] and "this run draws without them" in warned[0], warned
