"""Issue 57's small items: a stale build lock no process holds is removed before DeepSpeed builds (the ZeRO trial
itself: tests/test_issue50.py), every row of the live table within the terminal's width, prices by exact GPU kind, and
no prediction for a GPU kind never measured above its peak (MFU > 1)."""
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
    atlas = db.load(None)
    pool = predict.samples(atlas.rows, lookup._features(atlas))
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
