"""A search whose searcher cannot draw its next trial ends within seconds, saying why, what it measured kept.

With no trial running, Ray Tune waits up to 600 s for the searcher's next trial in a loop of its own that never asks
the stopper: a full disk between two trials (the study's write fails, the searcher proposes nothing) would hold a
search there past its time budget. Real searches (the
CPU tiny model, Ray Tune, Optuna, the session's Ray) in this process; the fault is put into the searcher's draw
(study.DistinctSearcher._suggest) after its first trial: the error SQLite raises on a full disk, or a draw that never
returns. A full disk at that moment cannot be made here (mounting a small filesystem needs rights a test may lack,
and the draw follows the trial's end at once)."""
import sqlite3
import threading
import time

import pytest

from trainscout.cli.main import main
from trainscout.store import Store, default_url

pytestmark = pytest.mark.timeout(300)
FIXED = ["--set", "optimizer_state=fp32", "--set", "activation_offload=off", "--set", "optimizer_impl=auto",
         "--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
         "--set", "attention=sdpa", "--set", "sdpa_backend=math", "--set", "precision=fp32", "--set", "fsdp=off"]


def search(out, *extra) -> list[str]:
    return ["search", "--model", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--global-batch", "4",
            "--max-concurrent", "1", "--out", str(out), *FIXED, *map(str, extra)]


def second_draw(monkeypatch, fault):
    """The searcher's draws: the first as it is, every later one `fault()` (its time kept in the list returned)."""
    from trainscout.search.study import DistinctSearcher
    real, faulted = DistinctSearcher._suggest, []

    def draw(self, trial_id):
        if not getattr(draw, "done", False):
            draw.done = True
            return real(self, trial_id)
        faulted.append(time.time())
        return fault()
    monkeypatch.setattr(DistinctSearcher, "_suggest", draw)
    return faulted


def test_a_store_that_fails_between_two_trials_ends_the_search_in_seconds(tmp_path, capsys, ray_local, monkeypatch):
    """The draw after the first trial fails as a full disk fails it: the search ends within seconds, in one line
    saying what failed and that the first trial is kept, exit 1."""
    def full():
        raise sqlite3.OperationalError("database or disk is full")
    faulted = second_draw(monkeypatch, full)
    out = tmp_path / "full"
    rc = main(search(out, "--trials", 3))
    ended = time.time()
    cap = capsys.readouterr()
    assert faulted, cap.out[-3000:]
    print(f"the search ended {ended - faulted[0]:.1f} s after its draw failed")
    assert rc == 1 and ended - faulted[0] < 15, (rc, ended - faulted[0], cap.err[-2000:])
    last = cap.err.strip().splitlines()[-1]
    assert last.startswith("trainscout: error: the results store failed (database or disk is full): the search "
                           "stopped; the 1 trial and 1 measurement recorded before are kept in "), last
    assert "Traceback" not in cap.err
    assert [t["status"] for t in Store(default_url(str(out))).trials("full")] == ["ok"]


def test_a_draw_that_never_returns_ends_at_the_time_budget_saying_why(tmp_path, capsys, ray_local, monkeypatch):
    """The draw after the first trial never returns (a sampler that cannot suggest): the search ends within seconds
    of its --time-budget, the live output says why in one line, the first
    trial's measurement is kept and summarised, exit 0."""
    release = threading.Event()

    def stuck():
        release.wait(600)
        raise RuntimeError("released at the test's end")
    faulted = second_draw(monkeypatch, stuck)
    out = tmp_path / "stuck"
    budget = 30  # the first trial, a cold worker group included, ends within it less driver.END_S
    t0 = time.time()
    try:
        rc = main(search(out, "--time-budget", budget))
    finally:
        release.set()
    took = time.time() - t0
    cap = capsys.readouterr()
    print(f"--time-budget {budget}: the search ended after {took:.1f} s")
    assert faulted and rc == 0, (rc, cap.out[-3000:], cap.err[-2000:])
    assert took < budget + 3, took
    stalled = [ln for ln in cap.out.splitlines() if "ended while Ray Tune waited" in ln]
    assert len(stalled) == 1 and "(its draw had not returned): its time budget (30s) ran out" in stalled[0], \
        cap.out[-3000:]
    assert [t["status"] for t in Store(default_url(str(out))).trials("stuck")] == ["ok"]
    assert "best, rank 1" in cap.out
