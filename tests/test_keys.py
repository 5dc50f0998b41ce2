"""Keys that survive (issue 48, item 4): a measurement key hashes only the knobs set away from their defaults, so a
knob added by a release or a plugin changes no key, and stores written under the old scheme (every knob hashed) are
re-keyed on read from each row's own record and served, nothing rewritten (store.store's docstring)."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from trainscout.store import Store, default_url
from trainscout.store.schema import KEY_VERSION, changed_knobs, legacy_key, measurement_key, record_key
from trainscout.trial import hardware, prepare


# The defaults every stored key of scheme KEY_VERSION leaves out: a change of one changes what an unset knob runs,
# so it needs a new KEY_VERSION (store.schema.measurement_key). A knob added later may be added here.
DEFAULTS = {"activation_checkpointing": "none", "attention": "sdpa", "compile": False, "compile_scope": "auto",
            "fsdp": "off", "loss_kernel": "eager", "offload_optimizer": False, "offload_params": False,
            "pipeline_microbatches": 4, "pipeline_schedule": "1f1b", "pipeline_stages": 1, "precision": "bf16-mixed",
            "sdpa_backend": "auto", "tf32": True, "zero_stage": 0, "fp8": "off", "context_parallel": 1,
            "tensor_parallel": 1}


def old_key(spec, hw: dict, versions: dict) -> str:
    """A copy of measurement_key as main had it before KEY_VERSION 2 (every knob hashed, defaults included)."""
    from trainscout.spaces.model_config import asked_dtype
    ident = {
        "config": spec.config, "model_config": spec.model_config, "recipe": spec.recipe,
        "device": spec.device, "world_size": spec.world_size,
        "hardware": {k: hw.get(k) for k in ("gpu", "gpu_memory_gib", "cpu", "cpu_count")},
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "deepspeed")},
    }
    if asked_dtype(spec.model_config):
        ident["master_dtype"] = spec.plan.master_dtype
    if spec.fault:
        ident["fault"] = spec.fault
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def test_the_defaults_left_out_of_keys_are_pinned():
    from trainscout.spaces import get
    moved = {n: (d, get(n).default) for n, d in DEFAULTS.items() if get(n).default != d}
    assert not moved, f"a knob's default changed {moved}: bump store.schema.KEY_VERSION (unset knobs run other values)"
    assert KEY_VERSION == 2


def test_a_knob_added_at_its_default_changes_no_key_and_a_set_one_does():
    from trainscout.spaces import REGISTRY, Knob

    class Added(Knob):
        """A knob a later release adds (test)."""
        name, default, choices = "test_added_knob", "off", ("off", "on")

        def apply(self, plan, value, cfg, ctx):
            plan.knobs[self.name] = value
    hw = {"device": "cpu", "cpu": "x", "cpu_count": 2}
    settings = {"micro_batch_size": 2, "precision": "fp32"}
    before = prepare("tiny", settings, workers=2, hw=hw)
    REGISTRY[Added.name] = Added()
    try:
        after = prepare("tiny", settings, workers=2, hw=hw)
        on = prepare("tiny", dict(settings, test_added_knob="on"), workers=2, hw=hw)
        assert "test_added_knob" in after.config and "test_added_knob" not in before.config
        assert legacy_key(after, hw, {}) != legacy_key(before, hw, {})  # the old scheme: every cached key lost
        assert measurement_key(after, hw, {}) == measurement_key(before, hw, {})
        assert measurement_key(on, hw, {}) != measurement_key(before, hw, {})
        assert changed_knobs(on, hw) == dict(changed_knobs(before, hw), test_added_knob="on")
    finally:
        del REGISTRY[Added.name]
    # an auto value and what it concretises to are one configuration: neither is in the key
    assert "optimizer_impl" not in changed_knobs(before, hw) or before.config.get("optimizer_impl") is None
    # a stored record re-keys to the key of its spec
    rec = {"model": "tiny", "config": before.config, "model_config": before.model_config, "recipe": before.recipe,
           "device": "cpu", "world_size": 2, "hardware": hw, "versions": {}, "status": "ok",
           "plan": before.plan.to_dict()}
    assert record_key(rec) == measurement_key(before, hw, {})


@pytest.fixture(scope="module")
def plugin_env(example_plugin):
    """The README's example plugin installed in a folder of its own (conftest's example_plugin) put on PYTHONPATH of
    a subprocess (the running venv is never changed), as tests/test_plugins.py does."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([example_plugin, *filter(None, [os.environ.get("PYTHONPATH")])]))


FAST = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
        "--set", "attention=sdpa", "--set", "precision=fp32", "--set", "micro_batch_size=4"]


def search(out, url, *extra):
    return ["search", "--model", "tiny", "--device", "cpu", "--gpus-per-trial", "2", "--steps", "1", "--warmup", "0",
            "--trials", "1", "--global-batch", "16", "--seed", "0", "--out", str(out), "--storage", url, *FAST, *extra]


@pytest.mark.timeout(900)
def test_the_same_search_with_the_example_plugin_installed_is_served(tmp_path, plugin_env, ray_local):
    """A 1-trial CPU search, then the same search on the same store with the example plugin installed (its knobs at
    their defaults in the start point): served from the store ("ok*"), not measured again."""
    from trainscout.cli.main import main
    url = default_url(str(tmp_path / "shared"))
    os.makedirs(tmp_path / "shared")
    assert main(search(tmp_path / "first", url)) == 0
    [first] = Store(url).trials("first")
    assert first["status"] == "ok" and not first["cached"]
    res = subprocess.run([sys.executable, "-m", "trainscout.cli", *search(tmp_path / "again", url)],
                         capture_output=True, text=True, timeout=600, env=plugin_env)
    assert res.returncode == 0, res.stderr[-3000:]
    store = Store(url)
    [again] = store.trials("again")
    assert again["config"]["cuda_alloc_conf"] == "default" and again["config"]["mlp_checkpointing"] is False
    assert again["cached"] and again["key"] == first["key"] and again["tokens_per_s"] == first["tokens_per_s"]
    assert " ok* " in res.stdout + res.stderr, (res.stdout + res.stderr)[-2000:]
    assert len(store.measurements()) == 1


def specs_of(store):
    """(record, the spec of its config prepared today on a mock of its GPU) of every stored measurement."""
    out = []
    for rec in store.measurements():
        mock_gpu = dict(rec.hardware)  # a mock of the record's GPU (no GPU here): its fingerprint as stored
        r = rec.recipe
        spec = prepare(rec.model, rec.config, workers=rec.world_size, hw=mock_gpu, global_batch=r["global_batch"],
                       seq_len=r["seq_len"], total_steps=r["total_steps"])
        out.append((rec, spec, mock_gpu))
    return out


def test_the_h200_grid_written_by_the_old_scheme_is_served(h200_grid):
    """bench/data/grid-h200 (64 H200 measurements, keys of the old scheme, measured before several knobs existed):
    none is found by the key of its own configuration under the old scheme today, all by the new one (re-keyed from
    each row's record), and the store's rows are as they were."""
    url = default_url(h200_grid)
    store = Store(url)
    before = {r.key: r.to_dict() for r in store.measurements()}
    assert len(before) == 64
    specs = specs_of(store)
    assert all(legacy_key(rec, rec.hardware, rec.versions) == rec.key for rec, _, _ in specs)  # the old scheme
    assert sum(store._has_key(old_key(spec, gpu, rec.versions)) for rec, spec, gpu in specs) == 0  # today's config
    served = 0
    for rec, spec, gpu in specs:
        key = measurement_key(spec, gpu, rec.versions)
        got = store.get(key)
        assert got is not None and store.stored_key(key) == rec.key, (rec.key, changed_knobs(spec, gpu))
        assert got.status == rec.status and got.m.get("tokens_per_s") == rec.m.get("tokens_per_s")
        served += 1
    assert served == 64 and not store.unkeyed
    after = Store(url)
    assert {r.key: r.to_dict() for r in after.measurements()} == before  # nothing rewritten, nothing added


@pytest.fixture
def pg_url(postgres):
    import uuid
    name = "k" + uuid.uuid4().hex[:12]
    postgres.create_database(name)
    return postgres.url(name, password=True)


def test_a_postgresql_store_of_old_keys_is_served_and_an_old_reader_still_finds_them(pg_url, monkeypatch):
    """Rows written with the old key function (a copy of it above), one measured before a knob existed (its config
    lacks sdpa_backend): a search's trial of the same configuration is served from them without running, reports
    the row's key, and a crash stored under an old key is measured again into that key (its sample), so an older
    trainscout reading the same database by its old keys finds both."""
    import ray.tune

    from trainscout.search import trainable
    from trainscout.trial.records import Record
    hw = hardware.fingerprint("cpu", 2)
    versions = hardware.versions()
    store = Store(pg_url)
    settings = {"compile": False, "zero_stage": 0, "precision": "fp32", "micro_batch_size": 2}
    crashed = dict(settings, micro_batch_size=4)
    keys = {}
    for name, cfg, status in (("ok", settings, "ok"), ("crash", crashed, "crash")):
        spec = prepare("tiny", cfg, workers=2, steps=2, warmup=0, hw=hw)
        spec = spec.replace(config={k: v for k, v in spec.config.items() if k != "sdpa_backend"})  # before it existed
        keys[name] = old_key(spec, hw, versions)
        rec = Record(model="tiny", config=spec.config, status=status, model_config=spec.model_config, device="cpu",
                     world_size=2, plan=spec.plan, recipe=spec.recipe, versions=versions, hardware=spec.hardware,
                     metrics={"tokens_per_s": 123.0, "step_s": 1.0} if status == "ok" else None,
                     error=None if status == "ok" else "crash!", started_at="2026-12-01T00:00:00+00:00")
        assert store.put(keys[name], rec)
    reports, calls = [], []

    class Ctx:
        def get_trial_id(self):
            return f"t{len(reports)}"

        def get_trial_name(self):
            return f"trial_{len(reports)}_t"
    monkeypatch.setattr(ray.tune, "get_context", lambda: Ctx())
    monkeypatch.setattr(ray.tune, "report", lambda m: reports.append(m))

    def fake_execute(spec, **kw):
        calls.append(spec.config)
        return Record(trial_id="x", model=spec.model, config=spec.config, status="ok", model_config=spec.model_config,
                      device="cpu", world_size=2, plan=spec.plan, recipe=spec.recipe, versions=versions,
                      hardware=spec.hardware, metrics={"tokens_per_s": 99.0, "step_s": 1.0})
    monkeypatch.setattr(trainable, "execute", fake_execute)
    base = {"model": "tiny", "workers": 2, "steps": 2, "warmup": 0, "hardware": hw, "seed": 0, "recipe": {},
            "storage": pg_url, "search": "s", "timeout": 5, "address": None, "trial_dir": "/tmp",
            "knob_names": list(trainable.space_knobs()), "max_failures": 0, "faults": {}, "offset": 0}
    trainable.tune_trial(settings, base)
    assert not calls and reports[-1]["cached"] and reports[-1]["status"] == "ok" and reports[-1]["key"] == keys["ok"]
    assert reports[-1]["tokens_per_s"] == 123.0
    trainable.tune_trial(crashed, base)  # a crash is measured again: into the old row's key, as its sample
    assert len(calls) == 1 and reports[-1]["key"] == keys["crash"] and not reports[-1]["cached"]
    reader = Store(pg_url)  # an older trainscout: finds each measurement by the key it computes
    assert reader.get(keys["ok"]).m["tokens_per_s"] == 123.0
    assert reader.get(keys["crash"]).status == "ok"  # the new measurement; the crash kept as its sample
    assert [str(r.status) for r in reader.samples(keys["crash"])] == ["ok", "crash"]
    assert {r.key for r in reader.measurements()} == set(keys.values())  # no row added under a new key


def test_a_record_of_16_bit_weights_measured_before_the_master_dtype_is_not_served(tmp_path, capsys):
    """The special case kept: a config asking for 16-bit weights measured before 2026-12-06 (its plan has no master
    dtype: it trained the asked weights under a mixed label) is not re-keyed, so never served, with a warning; the
    same record measured since (its plan names the master dtype) is served."""
    from trainscout.trial.models import resolve_model
    tiny = resolve_model("tiny")
    model = tiny.__class__("m", dict(tiny.config, torch_dtype="bfloat16"), tiny.recipe)
    hw = {"device": "cpu", "cpu": "x", "cpu_count": 2}
    spec = prepare(model, {"micro_batch_size": 2}, workers=2, hw=hw)
    store = Store(default_url(str(tmp_path)))
    plan = spec.plan.to_dict()
    rec = {"model": "m", "config": spec.config, "model_config": spec.model_config, "recipe": spec.recipe,
           "device": "cpu", "world_size": 2, "hardware": hw, "versions": {}, "status": "ok",
           "metrics": {"tokens_per_s": 1.0, "step_s": 1.0}}
    # its key then hashed no master dtype: any key other than today's old-scheme one stands for it here
    before = {k: v for k, v in plan.items() if k != "master_dtype"}
    assert store.put("measured-before-2026-12-06", dict(rec, plan=before))
    key = measurement_key(spec, hw, {})
    assert store.get(key) is None and store.stored_key(key) == key
    assert "cannot be re-keyed" in capsys.readouterr().err and len(store.unkeyed) == 1
    old = legacy_key(spec, hw, {})  # measured since: the old scheme's key names the master dtype
    assert store.put(old, dict(rec, plan=plan, trial_id="since"))
    assert store.stored_key(key) == old and store.get(key).trial_id == "since"
