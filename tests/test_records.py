"""One typed plan end to end (issue 28, item 3): resolve() -> TrialSpec -> Ray's pickling -> Record -> the store ->
the memory model and the export, always a spaces.Plan; plans stored in the earlier form read into today's sections;
the records are validated dataclasses, and a stored row they refuse is left out with one warning. A record's metrics
read typed (Metrics, issue 58 item 2) and write back every stored metrics dict as it was."""
import glob
import json
import os
import pickle
import sqlite3

import pytest
from pydantic import ValidationError

from trainscout.spaces import Plan
from trainscout.store import Store, default_url
from trainscout.predictor import memory
from trainscout.trial import prepare
from trainscout.trial.records import METRIC_NAMES, TOKENS_PER_S, Metrics, Record, TrialSpec, metric_columns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plan_is_one_type_from_resolve_to_the_store_and_the_memory_model(tmp_path):
    spec = prepare("tiny", {"zero_stage": 2, "offload_optimizer": True, "micro_batch_size": 2}, device="cpu",
                   workers=2, global_batch=8)
    assert isinstance(spec.plan, Plan) and spec.plan.engine == "deepspeed"
    assert spec.plan.engine_config == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    sent = pickle.loads(pickle.dumps(spec))  # what Ray does to the spec on its way to each rank
    assert isinstance(sent.plan, Plan) and sent == spec
    rec = Record(model=spec.model, config=spec.config, status="ok", plan=spec.plan, recipe=spec.recipe,
                 world_size=2, device="cpu", model_config=spec.model_config, metrics={"tokens_per_s": 1.0})
    store = Store(default_url(str(tmp_path)))
    store.put("k" * 32, rec)
    back = store.get("k" * 32)
    assert isinstance(back.plan, Plan) and back.plan == spec.plan
    assert json.loads(json.dumps(back.to_dict()))["plan"] == spec.plan.to_dict()  # stored as JSON, read as a Plan
    assert memory.predict(back) == memory.predict(spec)  # the memory model reads the stored plan as the spec's


def test_a_plan_stored_in_the_earlier_form_reads_into_todays_sections(h200_grid):
    """bench/data/grid-h200's records were stored with the engines' sections (zero, fsdp, pipeline), the knobs'
    "extra" and sdpa_backend as fields: read, each engine's section is its engine_config, the rest is in knobs."""
    rows = sqlite3.connect(os.path.join(h200_grid, "results.db")).execute(
        "select key, record from trainscout_measurements").fetchall()
    stored = {k: json.loads(r)["plan"] for k, r in rows}
    assert all("zero" in p and "extra" in p and "engine_config" not in p for p in stored.values())  # the old form
    read = {r.key: r for r in Store(default_url(h200_grid)).measurements()}
    assert {p["engine"] for p in stored.values()} == {"ddp", "fsdp", "deepspeed"}
    for key, old in stored.items():
        plan = read[key].plan
        section = {"deepspeed": "zero", "fsdp": "fsdp", "ddp": None}[old["engine"]]
        assert plan.engine_config == (old[section] if section else {})
        assert plan.knobs == {**old["extra"], "sdpa_backend": old["sdpa_backend"]}
        assert plan.micro_batch_size == old["micro_batch_size"] and plan.compile_scope == old["compile_scope"]
        assert Plan.from_dict(plan.to_dict()) == plan  # today's form round-trips
    older = {k: v for k, v in next(iter(stored.values())).items() if k not in ("compile_scope", "mesh")}
    older["compile_mode"] = "default"  # a field of the first records, no longer planned
    plan = Plan.from_dict(dict(older, compile=True))
    assert plan.compile_scope == "model" and plan.mesh == {}  # before compile_scope the whole model compiled


def test_records_are_validated_and_keep_what_they_do_not_know():
    with pytest.raises(ValidationError, match="world_size"):
        TrialSpec(model="tiny", model_config={}, device="cpu", world_size="two", config={}, plan=Plan(), recipe={},
                  grad_accum=1, measured_accum=1, timed_steps=1, warmup_steps=0)
    with pytest.raises(ValidationError, match="knbos"):
        Plan(knbos={})  # a misspelt field is refused, never dropped
    d = {"model": "tiny", "config": {}, "status": "ok", "plan": {"engine": "ddp"}, "from_the_future": [1]}
    rec = Record.from_dict(d)
    assert rec.extra == {"from_the_future": [1]} and rec.to_dict()["from_the_future"] == [1]


def test_a_stored_row_the_record_types_refuse_is_left_out_with_one_warning(tmp_path, capsys):
    from trainscout.cli.main import main
    store = Store(default_url(str(tmp_path)))
    good = Record(model="tiny", config={"precision": "fp32"}, status="invalid", error="no", plan=Plan(), device="cpu",
                  world_size=1)
    store.put("a" * 32, good)
    store.put("b" * 32, good)
    db = sqlite3.connect(os.path.join(str(tmp_path), "results.db"))
    bad = dict(good.to_dict(), world_size="two")  # written by another tool
    db.execute("update trainscout_measurements set record = ? where key = ?", (json.dumps(bad), "b" * 32))
    db.commit()
    assert [r.key for r in store.measurements()] == ["a" * 32]
    assert store.get("b" * 32) is None
    err = capsys.readouterr().err
    assert err.count("warning: stored measurement " + "b" * 32 + " left out: its world_size") == 1
    assert main(["results", str(tmp_path), "--format", "json"]) == 0


def test_every_stored_metrics_dict_reads_typed_and_writes_back_as_it_was():
    """bench/data's stores: Metrics.from_dict(m).to_dict() is m, key order included; the core fields read as
    attributes, the rest in extras."""
    n = 0
    for path in glob.glob(os.path.join(ROOT, "bench", "data", "**", "*.db"), recursive=True):
        try:
            rows = sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
                "select record from trainscout_measurements").fetchall()
        except sqlite3.OperationalError:  # a store without measurements
            continue
        for (text,) in rows:
            rec = Record.from_dict(json.loads(text))
            m = rec.measured
            assert json.dumps(m.to_dict()) == json.dumps(rec.metrics or {})
            assert m.tokens_per_s == (rec.metrics or {}).get(TOKENS_PER_S)
            assert json.dumps(rec.to_dict()["metrics"]) == json.dumps(json.loads(text)["metrics"])
            n += 1
    assert n > 100


def test_metrics_keep_unknown_keys_in_extras_and_read_missing_ones_as_none():
    m = Metrics.from_dict({"step_s": 2, "future_metric": [1], TOKENS_PER_S: None})
    assert m.step_s == 2 and isinstance(m.step_s, int) and m.tokens_per_s is None and m.mfu is None
    assert m.extras == {"future_metric": [1]}
    assert list(m.to_dict().items()) == [("step_s", 2), ("future_metric", [1]), (TOKENS_PER_S, None)]
    assert Metrics.from_dict(None).to_dict() == {} and Record(model="m", config={}, status="oom").measured.mfu is None
    assert Metrics(tokens_per_s=1.0, extras={"x": 1}).to_dict() == {TOKENS_PER_S: 1.0, "x": 1}
    assert TOKENS_PER_S in METRIC_NAMES and "extras" not in METRIC_NAMES
    assert metric_columns(TOKENS_PER_S, "mfu") == (TOKENS_PER_S, "mfu")
    with pytest.raises(ValueError, match="tokens_per_sec: not a field"):
        metric_columns("tokens_per_sec")
