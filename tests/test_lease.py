"""Issue 50, item 3: one driver per search, always. A driver paused past its lease (SIGSTOP here) that another took
over stops when it wakes, in one line, exit 1, writing nothing of the search (it crashed on UpdateFinishedTrialError
before); a lease names the machine instance, not the hostname alone; a failing heartbeat is said. Real SQLite and
PostgreSQL (tests/pg.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from trainscout.store import Store, claims, default_url

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(400)


def _pause(lease: claims.Lease) -> None:
    """The holder stops beating (a paused process's heartbeat thread)."""
    lease._stop.set()
    lease._thread.join(timeout=10)


def test_a_paused_holder_finds_its_lease_taken_and_writes_nothing(url):
    import optuna
    engine = Store(url).engine
    first = claims.Lease(engine, "search:s", {"search": "s", "role": "driver"}, lease_s=1.2)
    first.try_acquire()
    assert first.check() is None
    ostorage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="s", storage=ostorage)
    t = study.ask()
    lost: list[str] = []
    claims.DRIVING[first.name] = first  # as hold_search registers it
    guarded = claims.guarded_storage(optuna.storages.RDBStorage(url), "s", lost.append)
    import pickle
    assert type(pickle.loads(pickle.dumps(guarded))).__name__ == "GuardedRDBStorage"  # Tune pickles its searcher
    guarded.set_trial_user_attr(t._trial_id, "x", 1)  # held: writes pass

    _pause(first)
    with pytest.raises(claims.Held):  # expired only after lease_s
        claims.Lease(engine, "search:s", lease_s=1.2).try_acquire()
    time.sleep(1.5)
    second = claims.Lease(engine, "search:s", {"search": "s", "role": "driver"}, lease_s=1.2)
    second.try_acquire()  # the first holder's process lives (paused): taken after the expiry, not before
    ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)  # the successor settles it

    line = first.check()
    assert first.lost and line is not None
    assert line.startswith(f"search s: another driver (host {claims.HOST}, pid {os.getpid()}) took over this "
                           "search's lease after ")
    assert line.endswith(" s without a heartbeat: this one stops; its trials are theirs")
    with pytest.raises(claims.LeaseLost):  # the study's write refused before it is made: no UpdateFinishedTrialError
        guarded.set_trial_state_values(t._trial_id, optuna.trial.TrialState.COMPLETE, [1.0])
    assert lost == [line]
    assert ostorage.get_trial(t._trial_id).state == optuna.trial.TrialState.FAIL
    first.release()  # frees nothing of the successor's
    assert second.check() is None
    second.release()


def test_the_driver_writes_nothing_once_its_lease_is_lost(tmp_path):
    from trainscout.search import driver, halt
    store = Store(default_url(str(tmp_path)))
    halt.clear_store_failure()
    lease = store.hold_search("d")
    assert claims.driving("d") is lease
    wrote = []
    assert driver.guarded_write(lambda: wrote.append(1), "d") and wrote == [1]
    with store.engine.begin() as c:  # another driver took it over (as after a pause)
        c.execute(claims.LEASES.update().values(token="x" * 32, holder=json.dumps(
            {"host": "h2", "pid": 7, "after_s": 61.0, "search": "d"})))
    assert not driver.guarded_write(lambda: wrote.append(2), "d") and wrote == [1]
    line = halt.lease_failure()
    assert line == ("search d: another driver (host h2, pid 7) took over this search's lease after 61 s without a "
                    "heartbeat: this one stops; its trials are theirs")
    assert halt.store_failure() == line  # the stopper and the searcher stop as for a failed store
    assert driver.make_stopper(search="d").stop_all()
    lease.release()
    assert claims.driving("d") is None
    halt.clear_store_failure()


def test_same_hostname_another_machine_is_not_taken_for_gone(url):
    """A holder named by this hostname but another boot (another host of the same name, another container): its
    pid means nothing here, so its live lease is refused until it expires, never taken at once."""
    engine = Store(url).engine
    dead_pid = 2**22 + 17  # no process of this machine has it
    other = claims.Lease(engine, "search:h", {"search": "h", "pid": dead_pid, "boot": "another-boot"}, lease_s=1.5)
    other.try_acquire()
    _pause(other)
    with pytest.raises(claims.Held) as e:
        claims.Lease(engine, "search:h", lease_s=1.5).try_acquire()
    assert e.value.holder["pid"] == dead_pid
    # the same holder named by this machine's instance: its process is gone here, taken at once
    same = claims.Lease(engine, "search:g", {"pid": dead_pid}, lease_s=60)
    same.try_acquire()
    _pause(same)
    taker = claims.Lease(engine, "search:g", lease_s=60)
    taker.try_acquire()
    assert taker.taken_over["pid"] == dead_pid
    # a pid reused by another process (its start differs) is not the holder's
    reused = claims.Lease(engine, "search:r", {"pid": os.getpid(), "started": "1"}, lease_s=60)
    reused.try_acquire()
    _pause(reused)
    claims.Lease(engine, "search:r", lease_s=60).try_acquire()
    # a live process of this machine: refused
    live = claims.Lease(engine, "search:l", lease_s=60)
    live.try_acquire()
    with pytest.raises(claims.Held):
        claims.Lease(engine, "search:l", lease_s=60).try_acquire()
    for lease in (other, same, taker, reused, live):
        lease.release()


HOLD = """
import sys, time
from trainscout.store import Store
lease = Store(sys.argv[1]).hold_search("twin")
print(lease.holder["boot"], flush=True)
time.sleep(120)
"""


def test_two_processes_of_one_hostname_keep_their_own_leases(tmp_path):
    url = default_url(str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", HOLD, url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == claims.BOOT
        from trainscout.spaces import ConfigError
        with pytest.raises(ConfigError, match=f"pid {p.pid}"):
            Store(url).hold_search("twin")
    finally:
        p.kill()
        p.wait()


def test_a_failing_heartbeat_is_said(tmp_path, capsys):
    engine = Store(default_url(str(tmp_path))).engine
    lease = claims.Lease(engine, "claim:k", lease_s=0.6)
    lease.try_acquire()
    with engine.begin() as c:
        c.execute(sa.text("DROP TABLE trainscout_leases"))
    time.sleep(0.5)
    lease.release()
    err = [ln for ln in capsys.readouterr().err.splitlines() if "heartbeat" in ln]
    assert len(err) == 1, err  # rate-limited: one line for several failed beats
    assert err[0].startswith("trainscout: warning: the heartbeat of lease claim:k failed (")
    assert "no such table" in err[0]


def _writable(path) -> bool:
    """Whether a write transaction on the SQLite file starts within a second (no other process holds its lock)."""
    import sqlite3
    c = sqlite3.connect(str(path), timeout=1.0)
    try:
        c.execute("BEGIN IMMEDIATE")
        c.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        c.close()


def test_a_driver_paused_past_its_lease_stops_in_one_line_when_it_wakes(tmp_path):
    """A real search (subprocess, CPU) stopped with SIGSTOP while a trial runs; its lease expires, another driver
    takes it and settles the study; SIGCONT: the first stops with the one line, exit 1, nothing of the study
    overwritten."""
    import optuna
    out = tmp_path / "s"
    url = f"sqlite:///{out}/results.db"
    lease_s = 4.0
    env = dict(os.environ, TRAINSCOUT_LEASE_S=str(lease_s), RAY_AUTH_MODE="disabled")
    err = open(tmp_path / "err", "w+")
    p = subprocess.Popen([sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
                          "--gpus-per-trial", "1", "--steps", "6", "--warmup", "0", "--timeout", "60", "--trials", "4",
                          "--out", str(out), "--set", "compile=false", "--set", "zero_stage=0"],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    stopped = False
    try:
        deadline, name = time.time() + 240, None
        while time.time() < deadline and p.poll() is None:  # wait for a trial of the study to run
            try:
                names = [s.study_name for s in optuna.get_all_study_summaries(url)]
                if names:
                    name = names[0]
                    study = optuna.load_study(study_name=name, storage=url)
                    if any(t.state == optuna.trial.TrialState.RUNNING for t in study.trials):
                        break
            except Exception:  # noqa: BLE001 - not made yet
                pass
            time.sleep(0.3)
        assert p.poll() is None and name, open(tmp_path / "err").read()[-3000:]
        for _ in range(20):  # paused outside a write: stopped inside SQLite's write lock, it would block every writer
            os.kill(p.pid, signal.SIGSTOP)  # (the lease's takeover is what this tests, not a lock held while paused)
            stopped = True
            if _writable(out / "results.db"):
                break
            os.kill(p.pid, signal.SIGCONT)
            stopped = False
            time.sleep(0.2)
        assert stopped
        time.sleep(lease_s + 1.5)
        second = Store(url).hold_search(name, "--resume")  # the second driver: taken after the expiry
        assert second.taken_over["pid"] == p.pid
        ostorage = optuna.storages.RDBStorage(url)
        study = optuna.load_study(study_name=name, storage=ostorage)
        for t in study.trials:  # what its recover_interrupted does to the first driver's running trials
            if t.state == optuna.trial.TrialState.RUNNING:
                ostorage.set_trial_user_attr(t._trial_id, "status", "not run")
                ostorage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        before = [(t.number, t.state, t.values, t.user_attrs, t.intermediate_values) for t in
                  optuna.load_study(study_name=name, storage=url).trials]
        os.kill(p.pid, signal.SIGCONT)
        stopped = False
        rc = p.wait(timeout=150)
        text = open(tmp_path / "err").read()
        lines = [ln for ln in text.splitlines() if ln.startswith("trainscout:")]
        assert rc == 1, text[-3000:]
        assert len(lines) == 1, text[-3000:]
        assert lines == [f"trainscout: error: search {name}: another driver (host {claims.HOST}, pid {os.getpid()}) "
                         f"took over this search's lease after {lines[0].split(' after ')[1].split(' s ')[0]} s "
                         "without a heartbeat: this one stops; its trials are theirs"], text[-3000:]
        assert "Traceback" not in text and "UpdateFinishedTrialError" not in text
        after = [(t.number, t.state, t.values, t.user_attrs, t.intermediate_values) for t in
                 optuna.load_study(study_name=name, storage=url).trials]
        assert after == before  # nothing of the study written by the first driver after it woke
        assert second.check() is None  # the lease is still the second's
        second.release()
    finally:
        if stopped:
            os.kill(p.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
        err.close()
