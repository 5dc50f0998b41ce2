"""Knobs from another installed package (examples/knob-plugin): listed by `trainscout knobs`, sampled by the
search's define-by-run space, applied to the plan the workers get, and (mlp_checkpointing) transforming the model
through trainscout.runtime.prepare_model, as the trial engines run it."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "examples", "knob-plugin")

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
    t = study.ask(); cfg = space.sample(t); seen.add(cfg["cuda_alloc_conf"]); mlp.add(cfg["mlp_checkpointing"]); study.tell(t, 1.0)
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


@pytest.fixture(scope="module")
def plugin_installed():
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", PLUGIN]
    if subprocess.run(pip[:-2] + ["--no-build-isolation"] + pip[-2:], capture_output=True, timeout=300).returncode:
        subprocess.run(pip, check=True, capture_output=True, timeout=300)  # an older setuptools in the venv
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "trainscout-example-knob"],
                   capture_output=True, timeout=300)


def test_plugin_knob_is_listed_sampled_and_applied(plugin_installed):
    out = subprocess.run([sys.executable, "-m", "trainscout.cli", "knobs", "--json"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    row = {r["name"]: r for r in json.loads(out)}["cuda_alloc_conf"]
    assert row["module"] == "trainscout_example_knob" and row["domain"] == "default|expandable_segments"
    res = json.loads(subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True,
                                    timeout=300).stdout.strip().splitlines()[-1])
    assert res["seen"] == ["default", "expandable_segments"]  # the search samples it
    assert res["mlp"] == [False, True]
    assert res["env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert res["module"] == "trainscout_example_knob"
    # the plugin's model transform: each decoder layer's MLP checkpointed, applied in the declared order
    assert res["wrapped"] == {"False": ["GPTNeoXMLP"], "True": ["CheckpointWrapper"]}
    order = res["order"]
    assert order.index("mlp_checkpointing") > order.index("loss_kernel") and order.index("mlp_checkpointing") < order.index("compile_scope")


def test_a_real_search_samples_the_plugin_knob(plugin_installed, tmp_path):
    """`trainscout search` (Ray Tune + Optuna, tiny model on 2 gloo workers) with everything fixed but the plugins'
    knobs: every trial's configuration carries them, every trial ran (the model transform included), and the stored
    plans set the worker environment and the plugin setting they ask for."""
    out = tmp_path / "plug"
    fixed = {"compile": "false", "loss_kernel": "eager", "zero_stage": 0, "tf32": "true", "attention": "sdpa", "precision": "fp32",
             "micro_batch_size": 4, "fsdp": "off", "activation_checkpointing": "none", "pipeline_stages": 1}
    sets = [a for k, v in fixed.items() for a in ("--set", f"{k}={v}")]
    res = subprocess.run([sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
                          "--gpus-per-trial", "2", "--steps", "1", "--warmup", "0", "--trials", "2", "--seed", "0",
                          "--global-batch", "16", "--out", str(out), *sets], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    from trainscout.analysis.table import store_of
    store = store_of(str(out))
    trials = store.trials("plug")
    assert len(trials) == 2 and all(t["config"]["cuda_alloc_conf"] in ("default", "expandable_segments") for t in trials)
    assert all(t["config"]["mlp_checkpointing"] in (False, True) and t["status"] in ("ok", "stopped") for t in trials)
    for rec in store.measurements():
        want = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if rec["config"]["cuda_alloc_conf"] != "default" else {}
        assert rec["plan"]["env"] == want
        assert rec["plan"]["extra"] == ({"mlp_checkpointing": True} if rec["config"]["mlp_checkpointing"] else {})
