"""Issue 57's small items: a stale build lock no process holds is removed before DeepSpeed builds (the ZeRO trial
itself: tests/test_issue50.py), every row of the live table within the terminal's width, prices by exact GPU kind, and
no prediction for a GPU kind never measured above its peak (MFU > 1). Then cases of its other items on the real
components: the shipped atlas imported, a read-only running-trials registry, a renamed folder resumed, an imported
measurement in results and the report, and a real full disk mid-search."""
import contextlib
import io
import json
import os
import time
from types import SimpleNamespace

import pytest

from trainscout.trial.engines.deepspeed import clear_stale_build_locks


# --- (a) a stale build lock -------------------------------------------------------------------------------------------
def lock_at(root, op: str, age_s: float):
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_build_lock_no_process_holds_is_removed_a_held_one_kept(tmp_path):
    """torch's builder holds its lock open from its creation to its removal: an old lock no process holds is a killed
    builder's and goes; one a process holds (a live build) stays; a young one no process holds goes once it is the
    grace old (the instant between a builder closing and removing it is not taken for a killed one)."""
    old, held, young = lock_at(tmp_path, "cpu_adam", 1200), lock_at(tmp_path, "fused_adam", 1200), \
        lock_at(tmp_path, "deepspeed_shm_comm", 0)
    fd = os.open(held, os.O_RDONLY)  # a live builder keeps its lock open
    try:
        t0 = time.time()
        removed = clear_stale_build_locks(str(tmp_path), grace_s=1.0)
        took = time.time() - t0
    finally:
        os.close(fd)
    assert sorted(removed) == sorted(map(str, (old, young))), removed
    assert held.exists() and not old.exists() and not young.exists() and 0.5 < took < 10, took
    assert clear_stale_build_locks(str(tmp_path / "none")) == []


# --- (b) the live table within 80 columns ----------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("columns", [80, 60])
def test_every_row_of_the_live_table_fits_the_terminal_as_it_shows_them(monkeypatch, columns):
    """Rows of every status, the marks of a served and a shared measurement, a five-digit trial number, figures past
    their columns, and reasons with Ray's tabs and colours: every line within the width as the terminal shows it
    (a tab to its next 8-column stop), also where the fixed columns alone pass it."""
    from trainscout.search.live import Printer
    from trainscout.search.outcomes import NUMBERS
    monkeypatch.setenv("COLUMNS", str(columns))
    space = SimpleNamespace(domains={f"knob_{i}": (1, 2) for i in range(12)})
    out = Terminal()
    printer = Printer(space, out, total=20, budget_s=5 * 3600, ranks=8)
    for i, status in enumerate(["unscheduled", "node_lost", "ok", "stopped", "crash", "invalid"]):
        trial = SimpleNamespace(trial_id=f"abcdef{i:04d}xyz", config={k: 1 for k in space.domains})
        NUMBERS[trial.trial_id] = 12345
        printer(trial, {"status": status, "tokens_per_s": 12345678901.0, "projected_days": 1234567.8, "wall_s": 1e6,
                        "cached": True, "shared": True,
                        "error": "\x1b[33m(raylet)\x1b[0m RuntimeError:\tthe\tactor\tdied " + "x" * 200,
                        "note": "served from\tanother search"})
    over = [ln for ln in out.getvalue().splitlines() if len(ln.expandtabs()) > columns]
    assert not over, over
    assert "\t" not in out.getvalue() and "\x1b" not in out.getvalue()


# --- (c) prices by exact GPU kind -------------------------------------------------------------------------------------
def test_prices_go_by_exact_gpu_kind():
    """An H200's price is not a GH200's nor an H20's (no substring of a name decides); a PCIe H100 is not an SXM one;
    a kind no entry names has no price (the report says which)."""
    from trainscout.analysis import cost
    prices = cost.load_prices()
    got = {name: (p.name if (p := cost.price_for(name, prices)) else None) for name in (
        "NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA H20", "H20", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
        "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40", "NVIDIA L4", "CPU")}
    assert got == {"NVIDIA H200": "H200", "NVIDIA GH200 480GB": None, "NVIDIA H20": None, "H20": None,
                   "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H100 PCIe": "H100-PCIe",
                   "NVIDIA A100-SXM4-40GB": "A100-40GB", "NVIDIA A100 80GB PCIe": "A100-80GB", "NVIDIA L40": None,
                   "NVIDIA L4": "L4", "CPU": None}, got


def test_a_prices_file_prices_a_kind_and_a_bad_kind_is_one_line(tmp_path, capsys):
    from trainscout.analysis import cost
    from trainscout.cli.main import main
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"gpus": {"H20": {"kind": "H20", "gpu_usd": 12000, "gpus_per_machine": 8,
                                                 "machine_usd": 150000, "rent_usd_per_gpu_hour": 1.2}}}))
    prices = cost.load_prices(str(path))
    assert cost.price_for("NVIDIA H20", prices).name == "H20" and cost.price_for("NVIDIA H200", prices).name == "H200"
    path.write_text(json.dumps({"gpus": {"H20": {"kind": "H2O", "gpu_usd": 1, "gpus_per_machine": 8,
                                                 "machine_usd": 1, "rent_usd_per_gpu_hour": 1}}}))
    assert main(["report", str(tmp_path), "--prices", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpus.H20.kind 'H2O' is not a GPU kind: give one of" in err, err
    assert "Traceback" not in err


# --- (d) no prediction above the peak --------------------------------------------------------------------------------
def test_a_kind_never_measured_is_predicted_no_nearer_its_peak_than_its_calibration_rows():
    """The H20, never measured, little compute for its bandwidth: the H100 rows' ratio to the roofline carried to it
    put its FP8 rows above its bf16 peak. Every H20 row is at most the highest MFU of the rows it is calibrated on,
    and a capped row says so; the H200 (measured) is not capped."""
    from trainscout.atlas import db, lookup, predict
    from trainscout.atlas.samples import samples
    atlas = db.load(None)
    pool = samples(atlas.rows, lookup.row_features(atlas))
    rows = predict.predict_model("pythia-2.8b", "H20", 1, pool)["rows"]
    mfus = [round(r["mfu"], 3) for r in rows]
    print(f"pythia-2.8b on 1 x H20, predicted MFU: {mfus}")
    assert rows and max(mfus) <= 1.0, mfus
    by_id = {s.id: s for s in pool}
    for r in rows:
        ceiling = max(by_id[i].mfu for i in r["calibrated_ids"] if by_id[i].mfu)
        assert r["mfu"] <= ceiling + 1e-9, (r["mfu"], ceiling)
    assert any("[capped at MFU" in r["describe"] for r in rows)
    assert not any("[capped" in r["describe"] for r in predict.predict_model("pythia-1b", "H200", 1, pool)["rows"])


# --- (e) the shipped atlas, imported ----------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_shipped_atlas_imports_refusing_only_its_own_conflicting_duplicates(tmp_path, capsys):
    """42 of the shipped atlas' rows were refused by the import rules (versions a first record does not name, a retired
    setting): imported into an empty store, the only rows refused are those that conflict with another row of the same
    file (the same configuration measured apart), each naming that row."""
    from trainscout.cli.main import main
    from trainscout.store import Store, default_url
    atlas = os.path.join(ROOT, "atlas", "records.jsonl.gz")
    rc = main(["results", str(tmp_path / "s"), "--import", atlas])
    out, err = capsys.readouterr()
    refused = [ln for ln in err.splitlines() if ln.startswith("trainscout: refused: ")]
    assert rc == (1 if refused else 0) and "Traceback" not in err, err[-3000:]
    bad = [ln for ln in refused if "conflicting duplicate of line " not in ln or " of this file " not in ln]
    assert not bad, bad
    imported = len(Store(default_url(str(tmp_path / "s"))).measurements())
    assert f"imported {imported} measurements" in out and f"{len(refused)} refused" in out, out
    print(f"the shipped atlas into an empty store: {imported} imported, {len(refused)} refused (conflicting "
          "duplicates within the file)")


# --- (f) a read-only running-trials registry --------------------------------------------------------------------------
def test_a_read_only_registry_folder_refuses_the_search_naming_it(tmp_path, monkeypatch, capsys):
    """The running-trials registry a read-only folder (chattr +i: root ignores the mode bits; skipped where that is not
    permitted): the search stops in one line naming the folder, exit 2, nothing written."""
    import subprocess

    from trainscout.cli.main import main
    from trainscout.trial import contention
    registry = tmp_path / "running"
    registry.mkdir()
    if subprocess.run(["chattr", "+i", str(registry)], capture_output=True).returncode:
        pytest.skip("chattr +i is not permitted here: no read-only folder for root")
    monkeypatch.setenv(contention.DIR_ENV, str(registry))
    out = tmp_path / "out"
    try:
        rc = main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--out", str(out)])
    finally:
        subprocess.run(["chattr", "-i", str(registry)], capture_output=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"the running-trials registry {registry} cannot be used" in err[0], err
    assert contention.DIR_ENV in err[0] and not out.exists() and os.listdir(registry) == []


# --- (g) a renamed folder resumed -------------------------------------------------------------------------------------
def test_a_renamed_folder_resumes_its_search_and_writes_nothing_where_it_was(tmp_path, capsys):
    """`--resume` of a folder renamed since its search started said "no search recorded there": the search it holds
    continues under its own name (here all its trials are done: nothing runs, exit 0), and the old path stays absent."""
    from dataclasses import asdict

    from trainscout.cli.main import main
    from trainscout.search.service import SearchArgs, validate
    from trainscout.store import Store, default_url
    out = tmp_path / "s"
    out.mkdir()
    args = SearchArgs(model="tiny", out=str(out), device="cpu", trials=2, steps=1, warmup=0,
                      sets={"compile": "false"}, recipe={"global_batch": 4})
    validate(args)
    store = Store(default_url(str(out)))
    store.add_search("s", asdict(args))
    for i in range(2):
        store.add_trial("s", f"t{i}", None, "timeout", False, 0.0, {"micro_batch_size": i + 1}, error="too slow")
    moved = tmp_path / "moved"
    out.rename(moved)
    assert main(["search", "--resume", str(moved), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["search"] == "s" and "all 2 trials done" in cap.err, cap.err
    assert "the folder was named s when the search started: it continues as s" in cap.err
    assert not out.exists() and "Traceback" not in cap.err


# --- (h) an imported measurement: results, the report and export --best agree -----------------------------------------
def test_an_imported_measurement_is_in_results_and_the_report_and_export_best_agrees(tmp_path, capsys):
    """An imported measurement was hidden from `results` and the report in a store with a search while `export --best`
    wrote it: a recorded GPU search's store with another store's measurements imported lists them in both, and the
    report's best is the one export --best writes."""
    import shutil

    from trainscout.analysis.report.analysis import analyse
    from trainscout.cli.main import main
    from trainscout.store import Store, default_url
    data = os.path.join(ROOT, "bench", "data", "gpu-2026-11-30-s4")
    folder = tmp_path / "bench"
    folder.mkdir()
    shutil.copy(os.path.join(data, "gpus1", "results.db"), folder / "results.db")
    Store(f"sqlite:///{os.path.join(data, 'kernels', 'results.db')}").export_jsonl(str(tmp_path / "other.jsonl"))
    assert main(["results", str(folder), "--import", str(tmp_path / "other.jsonl")]) == 0
    store = Store(default_url(str(folder)))
    imported = {m.key for m in store.measurements()} - {t["key"] for n in store.searches() for t in store.trials(n)}
    assert imported
    capsys.readouterr()
    assert main(["results", str(folder), "--format", "json"]) == 0
    assert imported <= {r["key"] for r in json.loads(capsys.readouterr().out)}
    report = analyse(str(folder))
    assert imported <= set(report.df["key"].dropna())
    assert main(["export", str(folder), "--best", "--out", str(tmp_path / "best")]) == 0
    written = json.loads((tmp_path / "best" / "trainscout.json").read_text())["key"]
    assert written == report.tie.best.key == list(report.best["key"])[0], (written, list(report.best["key"]))


# --- (i) a full disk mid-search ---------------------------------------------------------------------------------------
def _fill_when(root, db, table: str, search) -> float | None:
    """Once the store at db holds a row in table, write zeros into root until its filesystem is full: when it was
    full, or None where the search ended first."""
    import sqlite3
    while search.poll() is None:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)) as c:
                if c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                    break
        except sqlite3.Error:
            pass  # not made yet
        time.sleep(0.1)
    else:
        return None
    with open(root / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 16))
            f.flush()
    return time.time()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("when", ["trainscout_search_trials", "trials"], ids=["between-trials", "first-draw"])
def test_a_disk_that_fills_mid_search_ends_it_in_one_line_within_seconds(tmp_path, when):
    """`trainscout search` with its folder on a real small filesystem (a tmpfs; skipped where mounting is not
    permitted), filled once its first trial is stored (between two trials), or once the study drew its first
    (Optuna's trials table: that trial then runs on the full disk): the search ends within seconds, in one line
    saying the store failed and what it kept, exit 1, never a traceback (Ray Tune's experiment state, written empty
    on the full disk, was read back after its loop and raised)."""
    import subprocess
    import sys

    from trainscout.store import Store, default_url
    root = tmp_path / "disk"
    root.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(root)], capture_output=True).returncode:
        pytest.skip("no right to mount a tmpfs here: a full disk needs a real small filesystem")
    out, log = root / "s", tmp_path / "log"
    fixed = ["optimizer_state=fp32", "activation_offload=off", "optimizer_impl=auto", "compile=false",
             "loss_kernel=eager", "zero_stage=0", "tf32=true", "attention=sdpa", "sdpa_backend=math", "precision=fp32",
             "fsdp=off"]
    try:
        with open(log, "w") as f:
            search = subprocess.Popen([sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device",
                                       "cpu", "--steps", "1", "--warmup", "0", "--global-batch", "4",
                                       "--max-concurrent", "1", "--trials", "6", "--out", str(out),
                                       *[a for s in fixed for a in ("--set", s)]], stdout=f, stderr=f, cwd=ROOT)
        try:
            filled = _fill_when(root, out / "results.db", when, search)
            rc = search.wait(timeout=300)
        finally:
            if search.poll() is None:
                search.kill()
                search.wait()
        ended = time.time()
        printed = log.read_text()
        assert filled, printed[-3000:]
        (root / "filler").unlink()  # room to open the store again
        stored = Store(default_url(str(out))).trials("s")
    finally:
        (root / "filler").unlink(missing_ok=True)
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
    print(f"the search ended {ended - filled:.1f} s after its disk filled, {len(stored)} trials kept")
    assert rc == 1 and ended - filled < 30, (rc, ended - filled, printed[-3000:])
    assert "Traceback" not in printed, printed[-3000:]
    last = printed.strip().splitlines()[-1]
    assert last.startswith("trainscout: error: the results store failed (") and "the search stopped; the " in last
    assert "database or disk is full" in last or "No space left on device" in last, last
    assert "continue with: trainscout search --resume" in last and len(stored) < 6, (last, len(stored))
    assert f"the {len(stored)} trial" in last, last
