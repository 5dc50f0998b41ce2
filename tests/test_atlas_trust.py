"""Issue 47: the atlas rebuilt from every measurement and checked, contributions that cannot be true refused, a
conflicting sample kept apart, errors quoted per GPU kind and architecture family, answers a user can act on.
Real records (a tiny CPU trial measured on this box: tests/data/cpu_tiny_record.json; the shipped H200 rows), real
stores, the real FLOP count."""
import json
import os
import subprocess
import sys
import time

from trainscout.atlas import db, lookup, predict, render
from trainscout.atlas.families import MOE, arch_family
from trainscout.atlas.loo import loo_table_by
from trainscout.atlas.samples import samples
from trainscout.cli.main import main
from trainscout.store import Store, default_url, measurement_key, record_checks, row_format
from trainscout.trial.gpus import gpu_kind
from trainscout.trial.records import Record
import bench_script  # tests/bench_script.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_RECORD = os.path.join(ROOT, "tests", "data", "cpu_tiny_record.json")


def _key(rec: dict) -> str:
    r = Record.from_dict(rec)
    return measurement_key(r, r.hardware or {}, r.versions or {}, r.placement)


def cpu_row() -> dict:
    """The genuine CPU measurement as a share row (its key recomputed, its provenance its own)."""
    with open(CPU_RECORD, encoding="utf-8") as f:
        rec = json.load(f)
    return row_format.make_row(rec, _key(rec), row_format.provenance_of(rec, command="trainscout trial --model tiny",
                                                                origin="contributed", source="store lab"))


def forged(row: dict, change) -> dict:
    """row edited by change(row), its key recomputed from the edited record and its content hash made to match."""
    row = json.loads(json.dumps(row))
    change(row)
    row["key"] = _key(row["record"])
    row["content_hash"] = row_format.content_hash(row)
    return row


def at_rate(row: dict, tokens_per_s: float) -> None:
    """tokens/s set, the step time made consistent with it (global batch x seq len / step)."""
    m, recipe = row["record"]["metrics"], row["record"]["recipe"]
    m["tokens_per_s"] = tokens_per_s
    m["step_s"] = recipe["global_batch"] * recipe["seq_len"] / tokens_per_s


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_genuine_cpu_row_imports_and_a_forged_one_at_1e12_tokens_per_s_is_refused(tmp_path, capsys):
    good = cpu_row()
    assert record_checks.refusal(good) is None
    fast = forged(good, lambda r: at_rate(r, 1e12))
    why = record_checks.refusal(fast)
    assert why.startswith("physically impossible") and "CPU host" in why and "FLOP/s" in why
    f = write(tmp_path / "share.jsonl", [good, fast])
    assert main(["results", str(tmp_path / "pool"), "--import", f]) == 1
    cap = capsys.readouterr()
    assert "line 2" in cap.err and "physically impossible" in cap.err
    assert "imported 1 measurements" in cap.out
    assert {m.key for m in Store(default_url(str(tmp_path / "pool"))).measurements()} == {good["key"]}


def test_a_plain_export_edited_to_1e12_tokens_per_s_is_refused(tmp_path, capsys):
    with open(CPU_RECORD, encoding="utf-8") as f:
        rec = json.load(f)
    line = dict(rec, key=_key(rec), source="local")
    m = dict(line["metrics"])
    m["tokens_per_s"] = 1e12
    m["step_s"] = line["recipe"]["global_batch"] * line["recipe"]["seq_len"] / 1e12
    bad = dict(line, metrics=m)
    f = write(tmp_path / "plain.jsonl", [line, bad])
    assert main(["results", str(tmp_path / "pool"), "--import", f]) == 1
    cap = capsys.readouterr()
    assert "line 2" in cap.err and "physically impossible" in cap.err, cap.err
    rows = Store(default_url(str(tmp_path / "pool"))).measurements()
    assert [r.m["tokens_per_s"] for r in rows] == [rec["metrics"]["tokens_per_s"]]
    # and lookup --db never shows it as measured
    capsys.readouterr()
    atlas = db.load([str(tmp_path / "plain.jsonl")])
    assert all(r["record"]["metrics"]["tokens_per_s"] < 1e9 for r in atlas.rows if r["record"]["device"] == "cpu")


def test_a_cpu_row_under_an_h200s_copied_provenance_is_refused():
    h200 = next(r for r in db.shipped_rows() if "H200" in r["provenance"]["gpu"])
    relabelled = forged(cpu_row(), lambda r: r.update(provenance=dict(h200["provenance"])))
    assert record_checks.refusal(relabelled).startswith("provenance contradicts the record")


def test_an_h200_row_inflated_1_4x_is_a_conflict_never_averaged_in(tmp_path, capsys):
    real = next(r for r in db.shipped_rows() if r["record"]["model"] == "pythia-410m" and r["record"]["status"] == "ok"
                and (r["derived"] or {}).get("mfu", 1) < 0.6 and "H200" in r["provenance"]["gpu"])
    tps = real["record"]["metrics"]["tokens_per_s"]
    # 1.4x, the step made to match, a fresh trial and a fresh key the line claims: the duplicate rule still finds it
    fake = forged(real, lambda r: at_rate(r, tps * 1.4) or r["record"].update(trial_id="f" * 12))
    fake["key"] = "0" * 32
    fake["content_hash"] = row_format.content_hash(fake)
    assert record_checks.refusal(fake) is None  # possible on its own: only the stored sample contradicts it
    f = write(tmp_path / "inflated.jsonl", [fake])
    atlas = db.load([f])
    assert not [r for r in atlas.rows if r["record"]["trial_id"] == "f" * 12]
    (line, key, why), = atlas.layers[1].refused
    assert "conflicting duplicate" in why and "kept apart" in why
    got = lookup.measured(atlas, lookup.target_of("pythia-410m"), "H200", 1, real["record"]["recipe"]["global_batch"],
                          lookup.price_table(), top=50)
    rows = [r for g in got["groups"] for r in g["rows"] if r["key"] == real["key"]]
    assert rows and all(len(r["repeats"]) == 1 or tps * 1.4 not in r["repeats"] for r in rows)
    assert all(abs(r["tokens_per_s"] - tps * 1.4) > 1 for r in rows)
    # imported into a store that holds the real one: refused as a conflict, exit 1, the stored sample unchanged
    pool = tmp_path / "pool"
    assert main(["results", str(pool), "--import", write(tmp_path / "real.jsonl", [real])]) == 0
    assert main(["results", str(pool), "--import", f]) == 1
    assert "conflicting duplicate of the record already stored" in capsys.readouterr().err
    assert [m.m["tokens_per_s"] for m in Store(default_url(str(pool))).measurements()] == [tps]
    # imported into a store of its own (nothing there to contradict it), then that store layered on the shipped set:
    # the contributed row meets the shipped one as an import would, a conflict kept apart
    other = tmp_path / "other"
    assert main(["results", str(other), "--import", f]) == 0
    atlas = db.load([str(other)])
    assert not [r for r in atlas.rows if r["record"]["trial_id"] == "f" * 12]
    assert any("kept apart" in why for _, _, why in atlas.layers[1].refused)


def test_a_share_row_names_its_contributor_and_store(tmp_path, monkeypatch):
    from tests.test_atlas import store_copy
    monkeypatch.setenv("TRAINSCOUT_CONTRIBUTOR", "ada@lab")
    lab = store_copy(tmp_path)
    share = tmp_path / "share.jsonl"
    assert main(["results", lab, "--export", str(share), "--share"]) == 0
    rows = [json.loads(x) for x in share.read_text().splitlines()]
    assert {r["provenance"]["contributor"] for r in rows} == {"ada@lab"}
    assert {r["provenance"]["source"] for r in rows} == {"store lab/results.db"}
    assert main(["results", str(tmp_path / "pool"), "--import", str(share)]) == 0
    m = Store(default_url(str(tmp_path / "pool"))).measurements()[0]
    assert m.extra["provenance"]["imported_from"] == "share.jsonl" and m.extra["provenance"]["contributor"] == "ada@lab"


# --- the shipped atlas: rebuilt from bench/data, checked --------------------------------------------------------
def test_the_shipped_atlas_is_a_rebuild_of_bench_data():
    """bench/build_atlas.py --check --fast: the shipped records equal a rebuild from every measurement in bench/data
    (H100 and mixtures of experts included), model.json's features (sampled) and leave-one-out a recomputation."""
    t0 = time.time()
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "build_atlas.py"), "--check", "--fast"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "the shipped atlas is up to date" in run.stdout
    assert time.time() - t0 < 90
    rows = db.shipped_rows()
    kinds = {gpu_kind(r["provenance"]["gpu"]) for r in rows}
    assert {"H100", "H200"} <= kinds
    assert any(arch_family(r["record"].get("model_config")) == MOE for r in rows)


def _build_atlas():
    """bench/build_atlas.py as a module (a script, not a package)."""
    return bench_script.load("build_atlas")


def test_check_allows_a_float_sum_in_another_order_and_refuses_a_real_difference(tmp_path):
    """--check compared model.json byte for byte: another machine's sums differ in the last digits of 299 floats
    while every row is equal. Now: numbers to a relative 1e-9, rows, keys and strings exactly; the records' rows
    exactly, whatever zlib compressed them. The shipped files against copies of themselves, changed."""
    import gzip
    import shutil
    build = _build_atlas()
    atlas = os.path.join(ROOT, "atlas")
    with open(os.path.join(atlas, "model.json"), encoding="utf-8") as f:
        rebuilt = f.read()
    with open(os.path.join(atlas, "records.jsonl.gz"), "rb") as f:
        records = f.read()
    shipped = json.loads(rebuilt)
    rid = sorted(shipped["features"])[0]

    def copy_with(change=None, records_text=None) -> str:
        out = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        shutil.copy(os.path.join(atlas, "records.jsonl.gz"), out / "records.jsonl.gz")
        if records_text is not None:
            with gzip.open(out / "records.jsonl.gz", "wb", compresslevel=1) as f:
                f.write(records_text)
        model = json.loads(rebuilt)
        if change:
            change(model)
        (out / "model.json").write_text(json.dumps(model, sort_keys=True, indent=1) + "\n")
        return str(out)

    def scale(by):
        def change(m):
            m["features"][rid]["acts"] *= by
        return change

    assert build.shipped_differences(copy_with(), records, rebuilt) == []
    assert build.shipped_differences(copy_with(scale(1 + 3e-16)), records, rebuilt) == []  # the last digit
    assert build.shipped_differences(copy_with(scale(1 + 1e-10)), records, rebuilt) == []
    # the same rows recompressed: other gzip bytes, the same records
    assert build.shipped_differences(copy_with(records_text=gzip.decompress(records)), records, rebuilt) == []
    real = build.shipped_differences(copy_with(scale(1 + 1e-6)), records, rebuilt)
    assert len(real) == 1 and f"features/{rid}/acts" in real[0]

    def renamed(m):
        m["features"][rid]["arch"] = str(m["features"][rid].get("arch")) + "x"
    assert "arch" in build.shipped_differences(copy_with(renamed), records, rebuilt)[0]

    def dropped(m):
        del m["features"][rid]
    assert "keys" in build.shipped_differences(copy_with(dropped), records, rebuilt)[0]
    lines = gzip.decompress(records).splitlines(keepends=True)
    changed = b"".join(lines[1:])  # a row left out
    assert "records.jsonl.gz is not a rebuild" in build.shipped_differences(copy_with(records_text=changed), records,
                                                                            rebuilt)[0]


def test_difference_compares_numbers_to_a_relative_tolerance_and_the_rest_exactly():
    difference = _build_atlas().difference
    assert difference({"a": [1, 2.0, "x", None, True]}, {"a": [1.0, 2.0000000000000004, "x", None, True]}) is None
    assert difference(1e-300, 0.0) is not None and difference(0.0, 0.0) is None
    assert difference(True, 1) == "the top: True against 1"  # a boolean is not a number here
    assert difference("1", 1) is not None and difference([1, 2], [1]) == "the top: 2 items against 1"
    assert difference({"a": {"b": 1.0}}, {"a": {"b": 1.001}}) == "a/b: 1.0 against 1.001"


def test_errors_are_reported_per_gpu_kind_and_family_and_the_docs_print_them():
    model = db.shipped_model()
    by = model["loo_by"]["model"]
    assert {"H200|dense", "H200|MoE", "H100|dense"} <= set(by)
    table = loo_table_by(model)
    with open(os.path.join(ROOT, "docs", "BENCHMARKS.md"), encoding="utf-8") as f:
        assert table in f.read()


def test_a_mixture_of_experts_prediction_quotes_moe_error(tmp_path):
    with open(os.path.join(ROOT, "bench", "models", "qwen3-moe-2b.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg = dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] + 4)  # a shape never measured
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(cfg))
    got = lookup.lookup(db.load(), str(path), gpu="H200", gpus=1)
    rows = got["predicted"]["rows"]
    assert rows and all(r["calibrated_families"] == [MOE] for r in rows)
    loo = db.shipped_model()["loo"]["model"]
    moe_ids = {r["id"] for r in loo if r["family"] == MOE}
    assert set(rows[0]["calibrated_ids"]) <= moe_ids | {None} and rows[0]["error"]["tokens_per_s"]["n"] >= 1
    assert "MoE" in rows[0]["error_scope"]
    assert "calibrated on dense models only" not in " ".join(got["predicted"]["notes"])


def test_h100_is_measured_now():
    got = lookup.lookup(db.load(), "pythia-410m", gpu="H100", gpus=1)
    notes = " ".join(got["predicted"]["notes"])
    assert "was never measured" not in notes and "no H100 row" not in notes


# --- answers a user can act on ---------------------------------------------------------------------------------
def test_lookups_first_row_is_what_export_best_would_write():
    from trainscout.analysis.ties import choose
    from trainscout.trial.quality import FAILED
    atlas = db.load()
    for model in ("pythia-160m", "bench/models/llama-1b.json", "bench/models/qwen3-moe-2b.json"):
        got = lookup.lookup(atlas, model, gpu="H200", gpus=1, top=500)
        for g in got["measured"]:
            if not g["rows"]:
                continue
            assert g["rows"][0]["best"]
            fit = [r for r in g["rows"] if r["quality"][0] != FAILED]
            recs = []
            for r in fit:
                row = next(x for x in atlas.rows if x["key"] == r["key"])
                recs.append(Record.from_dict(dict(row["record"], key=r["key"],
                                                  metrics=dict(row["record"]["metrics"],
                                                               tokens_per_s=r["tokens_per_s"]))))
            assert choose(recs).best.key == g["rows"][0]["key"], model


def test_lookup_db_shows_mfu_for_a_store(tmp_path, capsys):
    from tests.test_atlas import store_copy
    lab = store_copy(tmp_path)
    atlas = db.load([lab], shipped=False)
    got = lookup.lookup(atlas, "pythia-160m", gpus=1)
    rows = [r for g in got["measured"] for r in g["rows"]]
    assert rows and all(r["mfu"] is not None for r in rows)


def test_a_model_measured_only_at_another_global_batch_is_predicted_for_the_one_asked():
    """Pythia-160M's only H100 rows are a bench's (16 sequences per step, eager): they do not answer the recipe's
    1,024, so lookup predicts too, and the one-line summary (the seed table's) gives the prediction with the
    measurement beside it; at the bench's own batch the measurement is the answer."""
    atlas = db.load()
    got = lookup.lookup(atlas, "pythia-160m", gpu="H100", gpus=1)
    assert {g["global_batch"] for g in got["measured"]} == {16} and got["predicted"]["rows"]
    line = render.render_summary([got])
    assert "PREDICTED" in line and "measured 235,186 tokens/s at 16 sequences per step" in line
    at16 = lookup.lookup(atlas, "pythia-160m", gpu="H100", gpus=1, global_batch=16)
    assert at16["predicted"] is None and "measured" in render.render_summary([at16]).split("\n")[1]


def test_a_configuration_whose_gate_failed_is_never_offered():
    """A row whose quality gate failed is a speed (it calibrates) but never a configuration to offer: Llama-3.2-3B's
    H100 rows (precision=bf16 with FP8, MFU 0.748, every one failed) had become every H100 answer's configuration.
    Here every H100 row but Pythia-1B's is marked failed: each predicted configuration comes from Pythia-1B's."""
    import dataclasses
    pool = samples(list(db.shipped_rows()), db.shipped_model()["features"])
    assert any(s.gate_failed for s in pool if s.model == "llama-3.2-3b")
    marked = [dataclasses.replace(s, gate_failed=s.gpu == "H100" and s.model != "pythia-1b") for s in pool]
    rows = predict.predict_model("pythia-1.4b", "NVIDIA H100 80GB HBM3", 1, marked)["rows"]
    assert rows and {r["from"] for r in rows} == {"pythia-1b"}


def test_a_prediction_never_ranks_sharding_over_one_gpu_first():
    got = lookup.lookup(db.load(), "pythia-12b", gpu="H200", gpus=1)
    rows = got["predicted"]["rows"]
    assert rows and not rows[0]["shards_nothing"]


def test_a_model_whose_measured_rows_all_failed_quality_gets_a_prediction_without_that_change():
    """Every measured row of a model on a GPU kind failed its quality gate (planted here on the shipped Pythia-6.9B
    H100 rows: precision=bf16 with FP8): none is the best, so lookup predicts too, and no predicted row holds the
    change that failed (FP8 goes back to its default beside the saver the model needs), said in its notes. The
    shipped Mistral-7B H100 row is such a case: its answer was the failed configuration."""
    import copy
    atlas = db.load()
    rows, hit = copy.deepcopy(atlas.rows), 0
    for r in rows:
        rec = r["record"]
        if rec.get("model") == "pythia-6.9b" and "H100" in str(r["provenance"].get("gpu")) and rec["status"] == "ok":
            assert rec["config"]["precision"] == "bf16" and rec["config"]["fp8"] == "tensorwise"
            rec["metrics"]["quality"] = {"gate": "failed", "changes": {"precision": "x", "fp8": "x"}, "why": "planted"}
            hit += 1
    assert hit
    got = lookup.lookup(db.Atlas(atlas.layers, rows, atlas.model), "pythia-6.9b", gpu="H100", gpus=1)
    measured = [r for g in got["measured"] for r in g["rows"]]
    assert measured and not any(r["best"] for r in measured)
    pred = got["predicted"]["rows"]
    assert pred and not any(r["config"]["precision"] == "bf16" and r["config"]["fp8"] == "tensorwise" for r in pred)
    assert any("fp8=tensorwise precision=bf16: its quality gate failed" in n for n in got["predicted"]["notes"])


def test_a_saver_that_keeps_activations_on_the_host_is_tried_at_a_smaller_micro_batch_where_the_host_is_short():
    """Activation offload's host memory grows with the micro-batch: on a 32 GiB host the largest micro-batch is
    refused for host memory and a smaller one fits (the search's start point took 8; predict.largest_fit stopped at the
    first, 256, 459 GiB). Mock: the H100 is its fingerprint."""
    from trainscout.predictor import memory
    from trainscout.trial.models import resolve_model
    hw = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "gpu_memory_gib": 79.2,
          "capability": "9.0"}
    host = 32 * 2**30
    spec, mem, why, refused = predict.largest_fit(resolve_model("pythia-410m"), {"activation_offload": "on"}, 1, None,
                                                   hw, frozenset(), lambda fam: None, 0.85 * 79.2 * 2**30, host)
    assert spec is not None and why is None and not refused, why
    assert memory.host_refusal(spec, host, memory.MARGIN) is None
    assert 1 <= spec.plan.micro_batch_size < 256
    bigger = spec.replace(plan=spec.plan.replace(micro_batch_size=spec.plan.micro_batch_size * 2))
    assert memory.host_refusal(bigger, host, memory.MARGIN) is not None  # the largest that the host holds


def test_a_7b_on_an_h200_is_answered_without_what_failed_on_the_h100_and_without_a_5x_slower_saver():
    """Mistral-7B on one H200 (never measured there): its H100 row failed the quality gate with FP8 (a model's
    numerics, whatever the GPU), so no predicted row holds FP8 with precision=bf16; and activation offload, which
    keeps fp32 states, is not taken where it is predicted more than dtypes.KEEP_STATE_COST slower than
    precision=bf16 (it was answered first at 2,064 tokens/s against 11,452)."""
    from trainscout.predictor import dtypes
    got = lookup.lookup(db.load(), os.path.join(ROOT, "bench", "models", "hub", "mistral-7b-v0.3.json"), gpu="H200",
                        gpus=1)
    pred = got["predicted"]["rows"]
    assert pred and not any(r["config"].get("fp8") == "tensorwise" and r["config"].get("precision") == "bf16"
                            for r in pred)
    first = pred[0]
    assert first["config"].get("activation_offload") in (None, "off") and first["tokens_per_s"] > 5_000, first
    # the rule itself: a state-keeping saver within the cost is taken, one beyond it is not
    keep, lower = (False, 1.9, 1, "offload"), (True, 1.0, 0, "bf16")
    assert dtypes.prefer([lower, keep]) == keep
    assert dtypes.prefer([lower, (False, 2.1, 1, "offload")]) == lower
