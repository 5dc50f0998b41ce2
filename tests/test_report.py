"""`trainscout report` and the cost model on real measurements (tiny model, 2 gloo workers): three successful
configurations, a real crash (fault injection) and a configuration refused before running, stored as a search
stores them."""
import html
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from trainscout.cli.main import main
from trainscout.store import Store, default_url
from trainscout.trial import run_trial

pytestmark = pytest.mark.timeout(600)

RUNS = [({"precision": "fp32", "micro_batch_size": 4}, None), ({"precision": "fp32", "micro_batch_size": 8}, None),
        ({"precision": "bf16-mixed", "micro_batch_size": 4}, None),
        ({"precision": "fp32", "micro_batch_size": 2}, "crash")]


def make_store(d: str) -> str:
    store = Store(default_url(d))
    store.add_search("s", {"model": "tiny"})
    first = None
    for i, (settings, fault) in enumerate(RUNS):
        rec = run_trial("tiny", settings, device="cpu", workers=2, steps=2, warmup=1, global_batch=32, fault=fault)
        assert rec.status == ("crash" if fault else "ok"), rec.error
        key = f"k{i}" + "0" * 30
        store.put(key, rec)
        store.add_trial("s", f"t{i}", key, rec.status, False, (rec.metrics or {}).get("tokens_per_s", 0.0),
                        rec.config)
        first = first or (key, rec)
    key, rec = first  # a trial the search served from the store
    store.add_trial("s", "t7", key, "ok", True, rec.metrics["tokens_per_s"], rec.config)
    refused = run_trial("tiny", {**rec.config, "precision": "fp16-mixed"}, device="cpu", workers=2, global_batch=32)
    assert refused.status == "invalid"
    store.add_trial("s", "t9", None, "invalid", False, 0.0, refused.config)  # the search keeps no reason
    store.checkpoint()
    return d


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, ray_local):
    return make_store(str(tmp_path_factory.mktemp("out")))


@pytest.fixture
def cpu_prices(tmp_path):
    """A prices file that prices CPU runs (the built-in table prices GPUs only) and changes one GPU's rate."""
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"gpus": {
        "cpu-box": {"match": "^CPU$", "gpu_usd": 0, "gpus_per_machine": 2, "machine_usd": 3000,
                    "rent_usd_per_gpu_hour": 0.05, "source": "test"},
        "H100": {"rent_usd_per_gpu_hour": 2.0}}}))
    return str(path)


def best_row(store_dir):
    from trainscout.analysis import table
    df = table.load(store_dir)
    return df[df["status"] == "ok"].sort_values("tokens_per_s", ascending=False).iloc[0]


def test_report_writes_a_self_contained_html_and_names_the_best_config(store_dir, cpu_prices, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", store_dir, "--out", str(out), "--prices", cpu_prices]) == 0
    text = capsys.readouterr().out
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href|xlink:href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"""<script|<link|<img|<iframe|@import|url\(\s*["']?(?!#)""", page, re.I)  # url(#id): inside
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # the inline plots share one document
    assert page.count("<svg") >= 5  # Pareto, cost, importance, tokens/s per knob value, timeline
    assert "Pareto front" in page and "cpu-box" in page and "What failed and why" in page
    best = best_row(store_dir)
    first = next(line for line in text.splitlines() if line.strip().startswith("rank 1"))
    assert best["key"][:12] in first and f"micro_batch_size={best['micro_batch_size']}" in first
    assert f"precision={best['precision']}" in first and "rent $" in first
    assert re.search(r"crash x1: .*(closed|crash|exit|Error)", text, re.I) and "invalid x1" in text
    assert "knobs that mattered in search s (6 trials, PED-ANOVA" in text
    assert str(out / "report.html") in text


def test_costs_follow_the_price_table(store_dir, cpu_prices):
    from trainscout.analysis import cost, report, table
    prices = cost.load_prices(cpu_prices)
    df = cost.with_costs(table.load(store_dir), prices)
    ok = df[df["status"] == "ok"]
    assert len(ok) == 4 and (ok["price"] == "cpu-box").all()
    for _, r in ok.iterrows():
        assert r["rent_usd"] == pytest.approx(r["projected_days"] * 24 * 0.05 * 2)
        assert r["box_usd"] == pytest.approx(3000)  # 2 ranks: one machine; its GPUs cost nothing here
    hw = cost.compare_hardware(df, prices)
    assert len(hw) == 1 and hw.loc[0, "hardware"] == "CPU" and hw.loc[0, "world_size"] == 2
    assert hw.loc[0, "tokens_per_s"] == pytest.approx(best_row(store_dir)["tokens_per_s"])
    assert hw.loc[0, "ok"] == 4 and hw.loc[0, "trials"] == 5  # the refused trial ran on nothing
    # the built-in table: GPU names as torch reports them, with a source for every entry
    builtin = cost.load_prices()
    names = {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H100 PCIe": "H100-PCIe",
             "NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA A100-SXM4-80GB": "A100-80GB", "NVIDIA L40S": "L40S",
             "NVIDIA L4": "L4", "NVIDIA RTX A6000": "A6000", "NVIDIA GeForce RTX 4090": "RTX 4090"}
    for gpu, entry in names.items():
        assert cost.price_for(gpu, builtin).name == entry, gpu
    assert cost.price_for("CPU", builtin) is None and all(p.source and p.gpu_usd > 0 for p in builtin)
    h100 = cost.price_for("NVIDIA H100 80GB HBM3", prices)
    assert h100.rent_usd_per_gpu_hour == 2.0 and h100.gpu_usd == cost.price_for("H100", builtin).gpu_usd
    days = float(ok["projected_days"].iloc[0])
    assert cost.rent_usd(days, 8, h100) == pytest.approx(days * 24 * 2.0 * 8)
    assert h100.box_usd(16) == pytest.approx(16 * h100.gpu_usd + 2 * h100.host_usd)
    # knob importance comes from Optuna's evaluator over the searched knobs
    imp = report.analyse(store_dir).importance[0]["values"]
    assert set(imp) == {"micro_batch_size", "precision"} and sum(imp.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("prices, says", [
    ({"gpus": {"H100": {"rent_usd_per_gpu_hour": -1}}},
     "gpus.H100.rent_usd_per_gpu_hour is -1 (negative): give a price >= 0"),
    ({"gpus": {"H10O": {"gpu_usd": 1}}}, "gpus.H10O: unknown GPU"),
    ({"gpus": {"A6000": {"gpu_usd": "cheap"}}}, "gpus.A6000.gpu_usd is 'cheap'"),
    ({"gpus": {"L4": {"price": 1}}}, "gpus.L4.price is not a price field"),
    ("{not json", "is not JSON"),
])
def test_bad_prices_file_exits_2_with_one_line(store_dir, tmp_path, capsys, prices, says):
    path = tmp_path / "p.json"
    path.write_text(prices if isinstance(prices, str) else json.dumps(prices))
    assert main(["report", store_dir, "--out", str(tmp_path / "r"), "--prices", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "--prices" in err
    assert not (tmp_path / "r" / "report.html").exists()


def test_report_without_prices_for_the_hardware_says_so(store_dir, tmp_path, capsys):
    assert main(["report", store_dir, "--out", str(tmp_path)]) == 0
    assert "no price for CPU: add it with --prices" in capsys.readouterr().out
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    # no cost plot: progress, Pareto, step time, importance, tokens/s per knob value, knob pairs, timeline
    assert "No rental price for the hardware measured here" in page and page.count("<svg") == 7


def test_report_of_a_folder_without_a_store_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _trial_rows(page: str) -> dict:
    """The All trials table: row number -> the row's HTML."""
    return dict(re.findall(r'<tr id="trial-(\d+)">(.*?)</tr>', page, re.S))


def test_report_views_and_a_stopped_trial_uses_gpu_time(store_dir, tmp_path, capsys):
    from trainscout import analysis
    d = tmp_path / "s"
    d.mkdir()
    shutil.copy(f"{store_dir}/results.db", d / "results.db")  # checkpointed: the file holds everything
    store = Store(default_url(str(d)))
    before = analysis.load(str(d))
    ok = before[(before["status"] == "ok") & ~before["cached"]]
    # ASHA ended it after some steps: it ran, and left no record
    store.add_trial("s", "t8", None, "stopped", False, float(ok["tokens_per_s"].min()) / 2,
                    store.get(ok.iloc[0]["key"]).config)
    store.checkpoint()
    df = analysis.load(str(d))
    assert len(df) == len(before) + 1
    records = {m.key: m for m in store.measurements()}
    for _, r in df[df["key"].notna()].iterrows():  # what each ran, from its record
        rec = records[r["key"]]
        assert r["micro_batch"] == rec.plan.micro_batch_size and r["grad_accum"] == rec.grad_accum
        assert r["gpu_s"] == (0 if r["cached"] else pytest.approx(rec.wall_s * rec.world_size))
    assert (df.loc[df["status"] == "invalid", "gpu_s"] == 0).all()
    stopped = df[df["status"] == "stopped"].iloc[0]
    assert stopped["gpu_s_estimated"] and stopped["gpu_s"] == pytest.approx(statistics.median(ok["gpu_s"]))
    assert not df.loc[df["status"] != "stopped", "gpu_s_estimated"].any()

    out = tmp_path / "rep"
    assert main(["report", str(d), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ASHA stopped early" in text and "worker-hours (CPU) spent" in text
    page = (out / "report.html").read_text(encoding="utf-8")
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for view in ('id="progress"', 'id="trials"', 'id="importance-caveat"'):
        assert view in page, view
    assert "Should I keep going?" in page and "All trials" in page
    assert f"{int((df['status'].isin(['ok', 'stopped'])).sum())} trial(s) measured tokens/s" in page
    rows = _trial_rows(page)
    # numbered from 0 as Optuna numbers a study's trials (a store without a study: by row; with one: Optuna's number)
    assert sorted(map(int, rows)) == list(range(len(df)))
    for n, r in zip(range(len(df)), df.to_dict("records")):  # the table's rows are load()'s, in order
        row = rows[str(n)]
        assert f">{r['status']}<" in row and f"<code>{r['trial']}</code>" in row
        if r["status"] == "ok":
            assert f"trainscout export {shlex.quote(str(d))} --trial {r['key'][:12]} --format all" in row
            assert f'<td class="n">{r["micro_batch"]}</td><td class="n">{r["grad_accum"]}</td>' in row
        if r["status"] == "stopped":
            assert "(est.)" in row and "stopped early by ASHA" in row
    assert re.search(r"crash</span></td><td>[^<]*(closed|crash|exit|Error)", page, re.I)  # the reason, per row
    # every plotted trial carries its row's label as a hover title; the stopped one is drawn as having run
    titles = re.findall(r"<title>([^<]*)</title>", page)
    for n, r in zip(range(len(df)), df.to_dict("records")):
        assert any(t.startswith(f"#{n} {r['trial']}") for t in titles), n
    assert any(t.startswith(f"#{len(df) - 1} t8 stopped") and "estimated" in t for t in titles)
    assert f"#{len(df) - 1} est." in page  # its hatched bar in the timeline
    # the export command of the best row works as written
    best = df[df["status"] == "ok"].sort_values("tokens_per_s").iloc[-1]
    cmd = shlex.split(re.search(r"<code>(trainscout export [^<]*)</code>", rows[str(best.name)])[1])
    cmd[cmd.index("--out") + 1] = str(tmp_path / cmd[cmd.index("--out") + 1])
    assert main(cmd[1:]) == 0
    assert (tmp_path / f"export-{best['key'][:12]}" / "trainscout.json").is_file()


def test_a_store_of_measurements_only_is_reported(store_dir, tmp_path, capsys):
    from trainscout import analysis
    from trainscout.analysis import report
    lines = tmp_path / "m.jsonl"
    source = Store(default_url(store_dir))
    n = source.export_jsonl(str(lines))
    d = tmp_path / "imported"
    d.mkdir()
    store = Store(default_url(str(d)))
    assert store.import_jsonl(str(lines)) == (n, 0, [])  # added, present, refused (store/contrib.py)
    store.checkpoint()
    assert store.searches() == []  # measurements, no search rows
    df = analysis.load(str(d))
    records = {m.key: m for m in source.measurements()}
    assert len(df) == n == len(records) and sorted(df["key"]) == sorted(records)  # one row per measurement
    assert df["search"].isna().all() and not df["cached"].any()
    for _, r in df.iterrows():
        rec = records[r["key"]]
        assert r["status"] == rec.status and r["micro_batch"] == rec.plan.micro_batch_size
        assert r["grad_accum"] == rec.grad_accum and r["gpu_s"] == pytest.approx(rec.wall_s * rec.world_size)
        if rec.ok:
            assert r["tokens_per_s"] == rec.metrics["tokens_per_s"]
        else:
            assert r["tokens_per_s"] != r["tokens_per_s"] and r["error"]  # NaN, and the reason
    assert list(df["created_at"]) == sorted(df["created_at"])  # in the order they ran
    a = report.analyse(str(d))
    assert not a.searched and len(a.best) == sum(r.ok for r in records.values())
    out = tmp_path / "rep"
    assert main(["report", str(d), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{n} measurements, no search" in text and "rank 1 " in text
    page = (out / "report.html").read_text(encoding="utf-8")
    assert len(_trial_rows(page)) == n and 'id="progress"' in page and "(no search rows" in page
    assert page.count("<svg") >= 4


def test_the_package_imports_without_pandas():
    code = "import sys, trainscout.analysis as a; print(callable(a.load), 'pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() \
        == ["True", "False"]


H200 = Path(__file__).resolve().parent.parent / "bench" / "data" / "grid-h200"  # 64 real measurements on one H200


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """The H200 grid's analysis and report page (a copy of the store: reading must not touch the repository's)."""
    from trainscout.analysis import report
    d = tmp_path_factory.mktemp("h200")
    shutil.copy(H200 / "results.db", d / "results.db")
    a = report.analyse(str(d))
    return a, report.render_html(a)


def test_step_breakdown_adds_up_to_the_projected_step(h200, store_dir):
    from trainscout.analysis import report
    a, page = h200
    rows = report.step_breakdown(a)
    assert len(rows) == report.VIEW_TOP and [b["row"]["key"] for b in rows] == list(a.best["key"][:report.VIEW_TOP])
    for b in rows:
        rec = a.records[b["row"]["key"]]
        m, accum = rec.metrics, rec.grad_accum
        assert accum == rec.plan.grad_accum > 1
        assert list(b["parts"].values()) == [(accum - 1) * m["micro_batch_s"], m["last_micro_batch_s"],
                                             m["optimizer_s"]]
        # step_s is the median of per-step projections, the parts medians of their own: close, not equal
        assert sum(b["parts"].values()) == pytest.approx(m["step_s"], rel=0.02)
        assert b["residual_s"] == pytest.approx(m["step_s"] - sum(b["parts"].values()))
    assert 'id="step-breakdown"' in page and "Where a step's time goes" in page
    titles = re.findall(r"<title>([^<]*)</title>", page)
    first = rows[0]
    assert any(t.startswith(f"{report.label(first['row'])}: accumulating micro-batches {first['grad_accum'] - 1} x ")
               for t in titles)
    worst = max(abs(b["residual_s"]) / b["step_s"] for b in rows)
    assert f"within {100 * worst:.2f} % on these {len(rows)} rows" in page
    cpu_a = report.analyse(store_dir)
    cpu = report.step_breakdown(cpu_a)  # the tiny CPU trials: 3 ok measurements, 2 ranks
    assert sorted(b["grad_accum"] for b in cpu) == [2, 4, 4]
    for b in cpu:  # 2 timed steps on a shared CPU: the residual is noise (3-10 %), the parts are the record's
        m = cpu_a.records[b["row"]["key"]].metrics
        assert b["parts"][report.STEP_PARTS[0]] == (b["grad_accum"] - 1) * m["micro_batch_s"] > 0
        assert b["step_s"] == m["step_s"] and b["residual_s"] == pytest.approx(m["step_s"] - sum(b["parts"].values()))


def test_memory_view_puts_the_model_beside_the_measured_peak(h200, store_dir, tmp_path, capsys):
    from trainscout.analysis import report
    from trainscout.predictor import memory
    a, page = h200
    rows, skipped = report.memory_rows(a)
    assert len(rows) == report.VIEW_TOP and not skipped
    for r in rows:
        rec = a.records[r["row"]["key"]]
        assert list(r["parts"])[:6] == list(report.MEMORY_PARTS) and r["parts"][report.WORKSPACE] == pytest.approx(1.0)
        comp = memory.components(rec)
        assert all(r["parts"][k] == pytest.approx(v / memory.GiB) for k, v in comp.items())
        assert r["predicted_gib"] == pytest.approx(memory.predict(rec) / memory.GiB)
        assert r["measured_gib"] == pytest.approx(max(rec.metrics["peak_allocated_mib"]) / 1024)
        assert r["capacity_gib"] == 139.8 and r["calibrated_gib"] and r["calibration_n"] == 63
    assert 'id="memory-model"' in page and "GPU memory: NVIDIA H200 139.8 GiB" in page
    assert re.search(r"Analytic prediction against the measured peak: median [+-]\d", page)
    # a CPU store: the section is there and says why it is empty
    out = tmp_path / "rep"
    assert main(["report", store_dir, "--out", str(out)]) == 0
    capsys.readouterr()
    cpu = (out / "report.html").read_text(encoding="utf-8")
    section = cpu[cpu.index('id="memory-model"'):cpu.index("<h2>Hardware and cost")]
    assert "No measurement here ran on a GPU" in section and "<svg" not in section


def _rec(config, tps, spread=0.01, world=2, model="tiny", status="ok"):
    from trainscout.trial.records import Record
    return Record(model=model, config=config, status=status, device="cpu", world_size=world,
                  recipe={"global_batch": 32, "seq_len": 64}, hardware={"device": "cpu"},
                  metrics={"tokens_per_s": tps, "step_spread": spread} if status == "ok" else None,
                  key=f"{len(config)}{tps}{world}{model}{status}")


def _differing(a, b):
    """The knobs that apply to both configurations and differ between them."""
    from trainscout.spaces import all_knobs, applies, fmt
    ca, cb = ({k.name: c.get(k.name, k.default) for k in all_knobs()} for c in (a.config, b.config))
    return [k.name for k in all_knobs() if applies(k, ca) and applies(k, cb) and fmt(ca[k.name]) != fmt(cb[k.name])]


def test_knob_pairs_differ_in_exactly_one_knob():
    from trainscout.analysis import report
    base = _rec({"micro_batch_size": 4, "precision": "fp32"}, 1000.0, spread=0.03)
    bigger = _rec({"micro_batch_size": 8, "precision": "fp32"}, 1500.0, spread=0.04)
    bf16 = _rec({"micro_batch_size": 4, "precision": "bf16-mixed"}, 2000.0)
    both = _rec({"micro_batch_size": 8, "precision": "bf16-mixed", "zero_stage": 1}, 3000.0)  # 2 knobs from bf16
    compiled = _rec({"micro_batch_size": 4, "precision": "fp32", "compile": True, "compile_scope": "layers"}, 1200.0)
    others = [_rec({"micro_batch_size": 8, "precision": "fp32"}, 900.0, world=4),  # another world size
              _rec({"micro_batch_size": 8, "precision": "fp32"}, 900.0, model="pythia-14m"),  # another model
              _rec({"micro_batch_size": 2, "precision": "fp32"}, 0.0, status="oom")]  # no measurement
    pairs = report.knob_pairs([bf16, bigger, base, both, compiled, *others])
    found = {(p["knob"], p["from"], p["to"]): (p["a"], p["b"]) for p in pairs}
    assert found == {("micro_batch_size", "4", "8"): (base, bigger),  # a: the earlier value, whatever the input order
                     ("precision", "fp32", "bf16-mixed"): (base, bf16),
                     ("compile", "false", "true (compile_scope=layers)"): (base, compiled)}  # scope: only with compile
    for p in pairs:
        assert _differing(p["a"], p["b"]) == [p["knob"]]
        assert p["ratio"] == pytest.approx(p["b"].metrics["tokens_per_s"] / p["a"].metrics["tokens_per_s"])
    mbs = next(p for p in pairs if p["knob"] == "micro_batch_size")
    assert mbs["err"] == pytest.approx(1.5 * 0.05)  # 3 % and 4 % spreads in quadrature, times the ratio
    groups = report.pair_groups(pairs + report.knob_pairs([_rec({"micro_batch_size": 4}, 10.0, world=8),
                                                            _rec({"micro_batch_size": 8}, 30.0, world=8)]))
    g = next(g for g in groups if g["knob"] == "micro_batch_size")
    assert g["n"] == 2 and g["median"] == pytest.approx((1.5 + 3.0) / 2) and (g["min"], g["max"]) == (1.5, 3.0)


def test_knob_pairs_view_on_real_stores(h200, store_dir):
    import dataclasses

    from trainscout.analysis import report
    a, page = h200
    pairs = report.knob_pairs(list(a.records.values()))
    assert len(pairs) == 180  # of the grid's 63 ok measurements of one model on one H200
    for p in pairs:
        assert _differing(p["a"], p["b"]) == [p["knob"]] and p["a"].ok and p["b"].ok
    groups = report.pair_groups(pairs)
    assert {g["knob"] for g in groups} == {"activation_checkpointing", "compile", "loss_kernel", "micro_batch_size",
                                           "zero_stage", "fsdp"}
    section = page[page.index('id="knob-pairs"'):page.index("<h2>What failed and why")]
    assert section.count("<svg") == 1
    for g in groups:
        assert (f"<td>{html.escape(g['knob'])}</td><td>{html.escape(g['from'] + ' → ' + g['to'])}</td>"
                f'<td class="n">{g["n"]}</td><td class="n">{g["median"]:.3f}</td>') in section
    ckpt = next(g for g in groups if g["knob"] == "activation_checkpointing")
    assert ckpt["median"] < 1  # recomputing every layer is slower, in every pair of the grid
    assert ckpt["max"] < 1
    # the CPU store: micro-batch 4 -> 8 and fp32 -> bf16-mixed at micro-batch 4
    cpu = report.analyse(store_dir)
    found = report.pair_groups(report.knob_pairs(list(cpu.records.values())))
    assert {(g["knob"], g["from"], g["to"]) for g in found} == {("micro_batch_size", "4", "8"),
                                                                ("precision", "fp32", "bf16-mixed")}
    alone = report.pairs_section(dataclasses.replace(cpu, best=cpu.best.head(1)))
    assert "No two successful measurements here differ in exactly one knob" in "".join(alone)
