"""Issue 50, item 1: a record says which other trials shared the node during its timed steps (trial.contention), and
a measurement taken with peers on its CPU or GPU is kept apart: never served, replaced by the key's first clean one,
ranked after clean ones, marked in results.

The peers are real processes on this box that registered as trials (trial.contention.enter) and run no model: the
registry's bookkeeping across processes is what is tested; the trial measured beside one is a real `trainscout
search` (Ray Tune, a tiny model on the CPU). A GPU cannot run here: the GPU device rule is tested by the device ids
the peers register with (named as such). Each test has its own registry folder (TRAINSCOUT_RUNNING_DIR), so other
tests running on the box do not count as peers; the real search's is the test session's own (tests/conftest.py).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import pytest

from trainscout.trial import contention

pytestmark = pytest.mark.timeout(300)


def _peer(conn, folder: str) -> None:
    """A peer process: registers as a trial, leaves or dies, as the test tells it."""
    os.environ[contention.DIR_ENV] = folder
    while True:
        cmd, *args = conn.recv()
        if cmd == "enter":
            contention.enter(*args)
        elif cmd == "leave":
            contention.leave()
        elif cmd == "die":  # killed mid-trial: its entry stays open
            os._exit(0)
        elif cmd == "exit":
            return
        conn.send("done")


class Peer:
    def __init__(self, folder):
        self.conn, child = mp.get_context("fork").Pipe()
        self.proc = mp.get_context("fork").Process(target=_peer, args=(child, folder), daemon=True)
        self.proc.start()

    def __call__(self, *cmd):
        self.conn.send(cmd)
        if cmd[0] not in ("die", "exit"):
            assert self.conn.recv() == "done"
        else:
            self.proc.join(10)


def _window(during=lambda: None, trial="me", devices=("cpu",)) -> dict:
    contention.enter(trial, list(devices))
    contention.timed_start()
    during()
    out = contention.timed_end()
    contention.leave()
    return out


@pytest.fixture
def registry(tmp_path, monkeypatch):
    folder = str(tmp_path / "running")
    monkeypatch.setenv(contention.DIR_ENV, folder)
    return folder


def test_registry_counts_the_other_trials_of_the_node_across_processes(registry):
    a, b = Peer(registry), Peer(registry)
    assert _window() == {"trials": 0, "sharing": 0, "devices": ["cpu"]}  # alone
    a("enter", "peer-a", ["cpu"])
    b("enter", "me", ["cpu"])  # another rank of this trial (same token): not a peer
    assert _window() == {"trials": 1, "sharing": 1, "devices": ["cpu"]}
    a("leave")  # ended before the next window began: not present in it
    assert _window()["trials"] == 0
    # a peer that began and ended inside the window is counted (its file holds its end)
    assert _window(during=lambda: (a("enter", "peer-a2", ["cpu"]), a("leave")))["sharing"] == 1
    # GPU device rule (no GPU here: the ids the peers register with): another GPU is counted, not contending; the
    # same GPU, or a CPU trial, contends
    a("enter", "peer-gpu1", ["1"])
    assert _window(devices=["0"]) == {"trials": 1, "sharing": 0, "devices": ["0"]}
    assert _window(devices=["1"])["sharing"] == 1
    a("leave")
    b("leave")
    b("enter", "peer-cpu", ["cpu"])
    assert _window(devices=["0"])["sharing"] == 1
    # killed mid-trial (open entry, dead pid) before the window began: not counted; its entry is kept until it is
    # older than any window (PRUNE_S), then removed
    b("die")
    assert not b.proc.is_alive()
    assert _window()["trials"] == 0
    path = os.path.join(registry, f"{b.proc.pid}.json")
    entry = json.load(open(path))
    json.dump(dict(entry, start=time.time() - contention.PRUNE_S - 1), open(path, "w"))
    _window()
    assert not os.path.exists(path)
    a("exit")


def test_contended_records_are_not_served_and_give_way_to_a_clean_one(tmp_path):
    """Rules on stored records (no run): served, the store's measurement of a key, the ranking, the column."""
    from trainscout.analysis.ties import choose
    from trainscout.store import open_store
    from trainscout.trial.records import Record
    from trainscout.trial.status import served

    def rec(tid, tps, sharing):
        return Record(trial_id=tid, model="tiny", config={}, status="ok", metrics={
            "tokens_per_s": tps, "shared_with": {"trials": sharing, "sharing": sharing, "devices": ["cpu"]}})
    shared, clean = rec("t1", 321.0, 4), rec("t2", 1293.0, 0)
    assert contention.contended(shared) and not contention.contended(clean)
    assert not served("ok", None, shared.metrics) and served("ok", None, clean.metrics) and served("ok", None)
    assert contention.label(shared.metrics) == "4 trials (cpu)" and contention.label(clean.metrics) is None
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    assert store.add_measurement("k", shared) == "first"
    assert store.add_measurement("k", rec("t3", 300.0, 2)) == "sample"  # contended again: kept beside
    assert store.add_measurement("k", clean) == "replaced"  # the first clean one is the key's measurement
    assert store.get("k").trial_id == "t2" and [r.trial_id for r in store.samples("k")] == ["t2", "t3", "t1"]
    assert store.add_measurement("k", rec("t4", 350.0, 1)) == "sample"  # a clean one is never replaced
    fast_shared = rec("t5", 5000.0, 3).replace(key="b")
    assert choose([fast_shared, clean.replace(key="a")]).best.trial_id == "t2"  # clean first
    assert choose([fast_shared]).best.trial_id == "t5"  # only contended ones: ranked all the same
    assert "2 of 3 measurements ran beside other trials" in contention.note([shared, clean, fast_shared])


def _search(capsys, out, *extra):
    """`trainscout search` in this process on the session's Ray (ray_local), as tests/test_search.py runs it (no
    interpreter and Ray of its own to start): (exit code, what it printed)."""
    from trainscout.cli.main import main
    capsys.readouterr()
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--steps", "2", "--warmup", "1",
               "--set", "compile=false", "--set", "zero_stage=0", "--set", "micro_batch_size=8",
               "--out", str(out), "-q", *extra])
    return rc, capsys.readouterr()


def test_a_search_beside_a_peer_is_marked_and_the_next_search_measures_it_again(tmp_path, ray_local, capsys):
    """A real search measured while a peer trial is registered on the node: its record says so, the summary and
    `results` mark it; a second search on the same store measures the configuration again (not served), alone, and
    that clean measurement becomes the key's. The peer registers in the session's registry (tests/conftest.py's
    TRAINSCOUT_RUNNING_DIR), the one the session's Ray gave the trials' ranks."""
    from trainscout.store import open_store
    peer = Peer(os.environ[contention.DIR_ENV])
    peer("enter", "another-search", ["cpu"])
    t0 = time.perf_counter()
    rc, r = _search(capsys, tmp_path / "a")
    peer("exit")  # ended: its entry stays open with a dead pid, begun before the next search's window
    assert rc == 0, r.err[-3000:]
    assert "1 of 1 measurements ran beside other trials on the node" in r.out, r.out
    url = f"sqlite:///{tmp_path}/a/results.db"
    store = open_store(url)
    (first,) = store.measurements()
    assert first.m["shared_with"] == {"trials": 1, "sharing": 1, "devices": ["cpu"]} and contention.contended(first)
    from trainscout.cli.main import main  # `results` in this process: the same command, no interpreter of its own
    assert main(["results", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().out
    assert "shared" in shown.splitlines()[0] and "1 trial (cpu)" in shown, shown
    t1 = time.perf_counter()
    rc, r2 = _search(capsys, tmp_path / "b", "--storage", url)
    assert rc == 0, r2.err[-3000:]
    (row,) = store.trials(store.searches()[-1])
    assert row["key"] == first.key and row["status"] == "ok" and not row["cached"], row  # measured again
    now = store.get(first.key)
    assert now.trial_id != first.trial_id and not contention.contended(now), now.m.get("shared_with")
    assert [r.trial_id for r in store.samples(first.key)] == [now.trial_id, first.trial_id]
    print(f"contended {first.m['tokens_per_s']:,.0f} tokens/s, alone {now.m['tokens_per_s']:,.0f} tokens/s; "
          f"searches {t1 - t0:.0f} s and {time.perf_counter() - t1:.0f} s")


def test_the_live_table_marks_a_measurement_beside_other_trials():
    """The live table's row of a measurement other trials shared the device of says so (ok~), as the summary does."""
    import io
    import types

    from trainscout.search.live import Printer
    from trainscout.search.space import Space
    stream = io.StringIO()
    printer = Printer(Space({}, {"compile": (False, True)}), stream)
    for i, shared in enumerate((1, 0)):
        printer(types.SimpleNamespace(trial_id=f"t{i}", config={"compile": False}),
                {"status": "ok", "tokens_per_s": 1000.0, "cached": False, "shared": shared})
    rows = [line.split() for line in stream.getvalue().splitlines() if line.split()[1:2] in (["t0"], ["t1"])]
    assert [r[2] for r in rows] == ["ok~", "ok"], stream.getvalue()


def test_a_measurement_whose_contention_is_unknown_is_kept_apart():
    """The registry could not be read or written during a trial: its record says contention `unknown`, and it was then
    served to the next search as clean. Unknown is never clean: not served, marked in results."""
    from trainscout.trial.status import served
    unknown = {"shared_with": {"unknown": "the registry /x cannot be written (Permission denied)"}}
    assert contention.contended({"metrics": unknown}) and not served("ok", None, unknown)
    assert contention.label(unknown) == "unknown trials" and served("ok", None, {"shared_with": {"trials": 0,
                                                                                                "sharing": 0}})


def test_a_search_refuses_to_start_where_the_registry_cannot_be_used(tmp_path, monkeypatch, capsys):
    """TRAINSCOUT_RUNNING_DIR under a regular file (no folder can be made there, even as root): the search stops in one
    line naming the variable and the folder, exit 2, before anything is started or written."""
    from trainscout.cli.main import main
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(contention.DIR_ENV, str(blocker / "running"))
    out = tmp_path / "out"
    assert main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and contention.DIR_ENV in err[0] and str(blocker / "running") in err[0], err
    assert not out.exists()
