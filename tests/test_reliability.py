"""Issue 6: reliability and security of the search, the store and the command line.

R1 faults injected into chosen trials of a real search (TRAINSCOUT_FAULT_SCHEDULE): the search finishes, clean
   results are stored, every fault is classified, hangs are killed at the timeout, nothing is left RUNNING and
   no process outlives the search. CI runs 6 trials with one fault of each kind; the issue's 40 trials with 12
   faults are marked slow (`pytest -m slow tests/test_reliability.py`).
R2 the driver SIGKILLed three times at random points, resumed each time.
R5 retries: oom and invalid never, a crash up to --max-failures times.
R6 two processes writing one store; a damaged SQLite file.
R7 100 malformed inputs: exit 2, one line naming the field, no traceback, no payload runs.
R8 the local Ray listens on 127.0.0.1 only, no dashboard; results and exports are JSON/SQL, never pickles.
"""
from __future__ import annotations

import collections
import ipaddress
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import optuna
import psutil
import pytest

from trainscout.cli.main import main
from trainscout.store import Store, default_url, open_store
from trainscout.trial.records import Record

pytestmark = pytest.mark.timeout(900)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
        "--set", "attention=sdpa"]
EXPECTED = {"oom": "oom", "crash": "crash", "hang": "timeout", "assert": "crash"}  # fault kind -> status
TIMEOUT = 18  # per trial, its worker group's start included: a clean tiny trial took 6-14 s on 2 cores (CI,
# 2026-12-04); a hang is killed at this limit, and R1's hang waits it out (25 s before: 7 s of the suite)


def pinned() -> list[str]:
    """Knobs pinned so that every configuration sampled for the tiny model on 2 CPU workers can run (a faulted
    trial must run for its fault to fire, and a clean one must not fail): 2 pipeline stages leave micro-batches that
    do not divide the batch; the 8-bit AdamW states crash on the CPU (torchao's OptimState8bit under dynamo: R2's
    seed 57848 drew one, and a 4-bit one refused, so 4 rows for --trials 3)."""
    from trainscout.spaces import REGISTRY, all_knobs
    all_knobs()
    pins = {"pipeline_stages": "1", "optimizer_state": "fp32"}
    return [a for k, v in pins.items() if k in REGISTRY for a in ("--set", f"{k}={v}")]


def search_cli(out, *extra):
    return [sys.executable, "-m", "trainscout.cli", "search", "--model", "tiny", "--device", "cpu",
            "--gpus-per-trial", "2", "--steps", "2", "--warmup", "0", "--timeout", str(TIMEOUT), "--out", str(out),
            *FAST, *pinned(), *extra]


def tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def in_session(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.pid != os.getpid():
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return out


def names(procs) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(p.name())
        except psutil.Error:
            pass
    return out


def alive(procs) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


class Watch:
    """Run a command in its own session and sample its process tree every second: every process it started, the
    sockets they listen on, and whether a dashboard ran."""

    def __init__(self, cmd, env=None, log=None, sockets=True):
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.sockets = sockets  # False: no listening sockets read (R8's; 0.3 s of CPU a sample of 30 processes)
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                     start_new_session=True)
        self.seen: dict[tuple, psutil.Process] = {}
        self.listening: set[tuple] = set()  # (pid, process name, ip, port)
        self.cmdlines: dict[int, str] = {}
        self.titles: dict[int, set] = collections.defaultdict(set)  # a Ray worker renames itself per task

    def sample(self):
        for p in tree(self.proc.pid):
            try:
                self.seen.setdefault((p.pid, p.create_time()), p)
                self.cmdlines[p.pid] = " ".join(p.cmdline())
                self.titles[p.pid].add(p.name())
                for c in (p.net_connections(kind="inet") if self.sockets else ()):
                    if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr):  # TCP, UDP
                        self.listening.add((p.pid, p.name(), c.laddr.ip, c.laddr.port))
            except psutil.Error:
                pass

    def wait(self, timeout: float) -> int:
        deadline = time.time() + timeout
        while self.proc.poll() is None and time.time() < deadline:
            self.sample()
            time.sleep(1)
        if self.proc.poll() is None:
            self.kill()
            raise AssertionError(f"{self.proc.args} ran past {timeout} s")
        self.wall = time.time() - self.t0
        return self.proc.returncode

    def run_for(self, seconds: float) -> bool:
        """Sample for `seconds`; True if the command is still running then."""
        deadline = time.time() + seconds
        while self.proc.poll() is None and time.time() < deadline:
            self.sample()
            time.sleep(0.5)
        return self.proc.poll() is None

    def kill(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def survivors(self, grace: float = 20.0) -> list[psutil.Process]:
        """Processes the command started (or its session holds) that are still alive after `grace` seconds."""
        deadline = time.time() + grace
        while True:
            left = alive(set(self.seen.values()) | set(in_session(self.proc.pid)))
            if not left or time.time() >= deadline:
                return left
            time.sleep(0.5)

    def cleanup(self):
        for p in self.survivors(grace=0):
            try:
                p.kill()
            except psutil.Error:
                pass


# --- R1 (+ R5 in a real search, + R8 on the same run): faults injected into chosen trials -------------------
def faulted_search(out, trials: int, schedule: dict[int, str], max_failures: int = 0):
    env = dict(os.environ, TRAINSCOUT_FAULT_SCHEDULE=",".join(f"{n}:{k}" for n, k in schedule.items()))
    w = Watch(search_cli(out, "--trials", str(trials), "--seed", "5", "--max-failures", str(max_failures)), env=env,
              log=str(out) + ".log")
    rc = w.wait(timeout=3600)
    return w, rc


def check_faulted_search(out, w: Watch, rc: int, trials: int, schedule: dict[int, str]) -> dict:
    """Every R1 property of a finished faulted search; returns figures for the report."""
    log = open(str(out) + ".log").read()
    assert rc == 0, log[-3000:]
    name = os.path.basename(str(out))
    store = Store(default_url(str(out)))
    rows = store.trials(name)
    assert len(rows) == trials and len({t["trial"] for t in rows}) == trials, [t["status"] for t in rows]
    records = {m.key: m for m in store.measurements()}
    faulted = [t for t in rows if t["key"] and records[t["key"]].fault]
    clean = [t for t in rows if t not in faulted]
    kinds = [records[t["key"]].fault.split("@")[0] for t in faulted]
    # every scheduled fault happened in the trial it was scheduled for, and in no other
    assert collections.Counter(kinds) == collections.Counter(k.split("@")[0] for k in schedule.values()), kinds
    number = {m.group(2): int(m.group(1)) for d in (out / "tune").glob("*/trial_*")
              if (m := re.match(r"trial_(\d+)_([0-9a-f]+)_", d.name))}  # Tune's trial names: trial_N_ID
    assert sorted(number[t["trial"]] for t in rows) == list(range(trials))
    for t in rows:
        assert (records[t["key"]].fault if t["key"] else None) == schedule.get(number[t["trial"]]), t
    for t in faulted:
        rec = records[t["key"]]
        assert t["status"] == rec.status == EXPECTED[rec.fault.split("@")[0]], (rec.fault, rec.status)
        assert rec.metrics is None and rec.error
    # every clean trial is stored with its outcome: measured (ok), stopped early by ASHA after a step (with the
    # throughput it had), or refused before running (invalid, value 0)
    assert len(clean) == trials - len(schedule)
    assert {t["status"] for t in clean} <= {"ok", "stopped", "invalid"}, [t["status"] for t in clean]
    for t in clean:
        assert t["tokens_per_s"] > 0 or t["status"] == "invalid"
        if t["status"] == "ok":
            assert records[t["key"]].metrics["tokens_per_s"] == t["tokens_per_s"]
    # hangs killed within the timeout + 5 s
    hangs = [records[t["key"]].wall_s for t in faulted if records[t["key"]].fault.startswith("hang")]
    assert hangs and max(hangs) <= TIMEOUT + 5, hangs
    # nothing left RUNNING
    study = optuna.load_study(study_name=name, storage=default_url(str(out)))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert "running" not in {t["status"] for t in rows}
    # no process of the search outlives it
    assert len(w.seen) > 5  # the watch saw Ray and the trial workers
    left = w.survivors()
    assert not left, names(left)
    return {"trials": trials, "faults": len(faulted), "clean": len(clean),
            "clean_by_status": dict(collections.Counter(t["status"] for t in clean)),
            "cached": sum(bool(t["cached"]) for t in rows),
            "measured": len(records), "hang_wall_s": hangs, "wall_s": round(w.wall, 1)}


CI_SCHEDULE = {1: "oom", 2: "crash@1", 3: "hang", 4: "assert"}


@pytest.fixture(scope="module")
def ci_search(tmp_path_factory):
    """The CI subset: 6 trials, one fault of each kind, crashes measured again once (--max-failures 1)."""
    out = tmp_path_factory.mktemp("r1") / "ci"
    w, rc = faulted_search(out, 6, CI_SCHEDULE, max_failures=1)
    yield out, w, rc
    w.cleanup()


def test_r1_search_survives_one_fault_of_each_kind(ci_search):
    out, w, rc = ci_search
    figures = check_faulted_search(out, w, rc, 6, CI_SCHEDULE)
    print("R1 CI subset:", figures)


def test_r5_real_search_measures_a_crash_again_but_never_an_oom_or_hang(ci_search):
    out, _, rc = ci_search
    assert rc == 0
    runs = collections.Counter()  # fault kind -> trial executions (each has its own folder of rank logs)
    for trial_dir in (out / "trials").iterdir():
        logs = " ".join(p.read_text(errors="replace") for p in trial_dir.glob("logs/*.log"))
        m = re.search(r"injected fault (\w+)", logs)
        runs[m.group(1) if m else "clean"] += 1
    assert (runs["oom"], runs["hang"], runs["crash"], runs["assert"]) == (1, 1, 2, 2), runs
    attempts = {m.fault: m.attempt for m in Store(default_url(str(out))).measurements() if m.fault}
    assert attempts == {"oom": 1, "crash@1": 2, "hang": 1, "assert": 2}, attempts


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_r1_forty_trials_with_twelve_faults(tmp_path):
    """The issue's figures: 40 trials, 6 OOM, 3 crash, 2 hang, 1 assertion (about 12 minutes on 2 cores)."""
    schedule = {1: "oom", 3: "crash@1", 5: "oom", 8: "hang", 10: "oom", 13: "assert", 16: "crash", 19: "oom",
                23: "hang@1", 27: "oom", 31: "crash", 35: "oom@1"}
    out = tmp_path / "r1full"
    w, rc = faulted_search(out, 40, schedule)
    try:
        figures = check_faulted_search(out, w, rc, 40, schedule)
    finally:
        w.cleanup()
    assert figures["faults"] == 12 and figures["clean"] == 28
    print("R1 full:", figures)


# --- R8: the Ray a search starts, and what it writes ------------------------------------------------------------
def loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip.split("%")[0])
    return a.is_loopback or bool(getattr(a, "ipv4_mapped", None) and a.ipv4_mapped.is_loopback)


def test_r8_ray_listens_on_loopback_only_and_starts_no_dashboard(ci_search):
    _, w, _ = ci_search
    names = {n for _, n, _, _ in w.listening}
    assert {"gcs_server", "raylet"} <= names and any("ray::Rank" in n for n in names), names
    # the ranks' rendezvous on one machine is a file (trial.pool), not torch's TCPStore, which binds every interface
    exposed = sorted({(pid, n, ip, port) for pid, n, ip, port in w.listening if not loopback(ip)})
    assert not exposed, exposed
    print(f"R8: {len(w.listening)} listening sockets of {len({x[0] for x in w.listening})} Ray processes, "
          "none off the loopback")
    # Ray runs its dashboard head without its web UI when include_dashboard=False (--disable-frontend, no HTTP port).
    # Installed minimal it serves nothing; with ray[default] (trainscout[cluster], which CI installs) its gRPC server
    # listens, on the loopback like every socket above
    heads = {pid for pid, c in w.cmdlines.items() if "dashboard/dashboard.py" in c}
    assert all("--disable-frontend" in w.cmdlines[pid] for pid in heads)
    from ray._private.utils import get_dashboard_dependency_error
    if get_dashboard_dependency_error() is not None:  # the minimal install
        assert all("--minimal" in w.cmdlines[pid] for pid in heads)
        assert not [x for x in w.listening if x[0] in heads], w.listening
    assert not [x for x in w.listening if x[3] == 8265], w.listening


PICKLE_PATTERNS = [
    r"\bpickle\.loads?\(", r"\bcloudpickle\.loads?\(", r"\bdill\.loads?\(", r"\bjoblib\.load\(", r"\bmarshal\.loads?\(",
    r"\bshelve\.open\(", r"\byaml\.(unsafe_|full_)?load\((?![^)]*SafeLoader)", r"\byaml\.load_all\(",
    r"\bnp\.load\([^)]*allow_pickle=True", r"\beval\(", r"\bexec\(", r"\b__import__\(",
    r"\bpd\.read_pickle\(", r"\.to_pickle\(", r"\bpickle\.dumps?\(",
]


def package_sources() -> list[str]:
    out = []
    for pkg in ("cli", "spaces", "trial", "search", "analysis"):
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return out


def test_r8_package_source_never_unpickles():
    hits = []
    for path in package_sources():
        text = open(path, encoding="utf-8").read()
        for pat in PICKLE_PATTERNS:
            hits += [f"{os.path.relpath(path, ROOT)}: {m.group(0)}" for m in re.finditer(pat, text)]
        for m in re.finditer(r"\btorch\.load\(([^)]*)\)", text):
            if "weights_only=True" not in m.group(1):
                hits.append(f"{os.path.relpath(path, ROOT)}: {m.group(0)}")
    assert not hits, hits
    assert len(package_sources()) > 20


def test_r8_stored_results_and_exports_are_json(ci_search, tmp_path):
    out, _, rc = ci_search
    assert rc == 0
    import sqlite3
    con = sqlite3.connect(str(out / "results.db"))
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert {"trainscout_measurements", "trainscout_search_trials", "trainscout_searches", "studies"} <= set(tables)
    for table in tables:  # Optuna's tables included: no pickled value anywhere in the database
        for row in con.execute(f'SELECT * FROM "{table}"'):
            for v in row:
                assert not (isinstance(v, bytes) and v[:1] == b"\x80"), (table, v[:20])
                assert not (isinstance(v, str) and v.startswith(("\x80", "gASV", "ccopy_reg"))), (table, v[:20])
    for table, cols in (("trainscout_measurements", ("config", "record")), ("trainscout_search_trials", ("config",)),
                        ("trainscout_searches", ("args",))):
        for row in con.execute(f"SELECT {', '.join(cols)} FROM {table}"):
            assert all(isinstance(json.loads(v), dict) for v in row)
    con.close()
    exp = tmp_path / "export"
    assert main(["export", str(out), "--best", "--format", "all", "--out", str(exp)]) == 0
    assert main(["results", str(out), "--export", str(tmp_path / "all.jsonl")]) == 0
    files = sorted(exp.iterdir()) + [tmp_path / "all.jsonl"]
    import yaml
    for f in files:
        data = f.read_bytes()
        assert b"\x80\x04\x95" not in data and b"\x80\x05\x95" not in data and b"cbuiltins" not in data, f
        if f.suffix == ".json":
            json.loads(data)
        elif f.suffix == ".jsonl":
            assert [json.loads(line) for line in data.splitlines()]
        elif f.suffix in (".yaml", ".yml"):
            yaml.safe_load(data)
        else:
            data.decode("utf-8")  # the launch command: text
    assert any(f.suffix == ".json" for f in files)


# --- R5: the retry rules, unit by unit (the trainable with a scripted execute) --------------------------------
class FakeContext:
    def get_trial_id(self):
        return "t0001"

    def get_trial_name(self):
        return "trial_0_t0001"


@pytest.fixture
def trainable(tmp_path, monkeypatch):
    """Run search.trainable.tune_trial once with `execute` answering from a script; returns (calls, reports, store)."""
    import ray.tune

    from trainscout.search import service
    from trainscout.search.trainable import tune_trial
    from trainscout.trial import hardware

    url = default_url(str(tmp_path))
    reports = []
    monkeypatch.setattr(ray.tune, "get_context", lambda: FakeContext())
    monkeypatch.setattr(ray.tune, "report", lambda m: reports.append(m))
    hw = hardware.fingerprint("cpu", 2)

    def run(statuses, settings=None, max_failures=0, seed_store=None):
        calls = []

        def fake_execute(spec, **kw):
            calls.append(spec.config)
            st = statuses[min(len(calls), len(statuses)) - 1]
            return Record(trial_id=f"x{len(calls)}", model=spec.model, config=spec.config, status=st,
                          error=None if st == "ok" else f"{st}!", wall_s=1.0,
                          metrics={"tokens_per_s": 100.0} if st == "ok" else None)
        monkeypatch.setattr("trainscout.search.trainable.execute", fake_execute)  # read where tune_trial runs
        base = {"model": "tiny", "workers": 2, "steps": 2, "warmup": 0, "hardware": hw, "seed": 0, "recipe": {},
                "storage": url, "search": "s", "timeout": 5, "address": None, "trial_dir": str(tmp_path / "trials"),
                "knob_names": list(service.space_knobs()), "max_failures": max_failures, "faults": {}, "offset": 0}
        cfg = {"compile": False, "zero_stage": 0, "precision": "fp32", "micro_batch_size": 2, **(settings or {})}
        if seed_store:
            from trainscout.store import measurement_key
            from trainscout.trial import prepare
            spec = prepare("tiny", cfg, workers=2, steps=2, warmup=0, hw=hw)
            open_store(url).add_measurement(measurement_key(spec, hw, hardware.versions()),
                                    {"model": "tiny", "config": spec.config, "status": seed_store, "metrics": None})
        reports.clear()
        tune_trial(cfg, base)
        return calls, reports[-1], open_store(url)
    return run


@pytest.mark.parametrize("statuses, max_failures, runs, final", [
    (["oom"], 3, 1, "oom"),                       # deterministic: never measured again
    (["timeout"], 3, 1, "timeout"),               # a hang would cost the whole timeout again
    (["crash"], 0, 1, "crash"),                   # the default: no retry
    (["crash"], 2, 3, "crash"),                   # at most max_failures retries
    (["crash", "ok"], 2, 2, "ok"),                # a transient crash: the retry measures it
    (["crash", "oom"], 5, 2, "oom"),              # a retry that ends deterministic stops there
])
def test_r5_retry_rules(trainable, statuses, max_failures, runs, final):
    calls, report, store = trainable(statuses, max_failures=max_failures)
    assert len(calls) == runs and report["status"] == final
    [rec] = store.measurements()
    assert rec.status == final and rec.attempt == runs
    [row] = store.trials("s")
    assert row["status"] == final


def test_r5_invalid_is_never_run(trainable):
    calls, report, store = trainable(["ok"], settings={"offload_params": True}, max_failures=3)
    assert calls == [] and report["status"] == "invalid" and store.trials("s")[0]["status"] == "invalid"


@pytest.mark.parametrize("stored, runs", [("oom", 0), ("ok", 0), ("crash", 1), ("timeout", 1)])
def test_r5_stored_deterministic_outcomes_are_served_not_measured_again(trainable, stored, runs):
    calls, report, _ = trainable(["ok"], max_failures=2, seed_store=stored)
    assert len(calls) == runs and report["cached"] == (runs == 0)


# --- R2: the driver SIGKILLed three times at random points -----------------------------------------------------
def stored_trials(out, name: str) -> int | None:
    """Trials stored by search `name` (None while it is not recorded), read without writing anything."""
    import sqlite3
    path = out / "results.db"
    if not path.exists():
        return None
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        if not con.execute("SELECT 1 FROM trainscout_searches WHERE name = ?", (name,)).fetchone():
            return None
        return con.execute("SELECT count(*) FROM trainscout_search_trials WHERE search = ?", (name,)).fetchone()[0]
    except sqlite3.Error:
        return None
    finally:
        con.close()


# CI kills the driver once (the class: a killed driver loses nothing and resumes to exactly n); three kills are the
# long variant (-m slow): about 4 minutes on 2 cores
@pytest.mark.parametrize("times", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_r2_driver_killed_three_times_then_resumed_completes_exactly_n(tmp_path, times):
    # a reused worker's trial takes a second or two here: with three kills the search must outlast the third (8
    # trials); one kill comes while the first trial runs (at most 6 s after the search is recorded), 3 trials outlast it
    n, seed = 8 if times == 3 else 3, int(os.environ.get("TRAINSCOUT_TEST_SEED", random.randrange(1 << 16)))
    rng = random.Random(seed)
    out = tmp_path / "r2"
    name = "r2"
    snapshots, kills, leftovers = [], [], []
    cmd = search_cli(out, "--trials", str(n), "--seed", "2")
    for k in range(times):
        w = Watch(cmd, sockets=False)
        # a random point once the search is recorded (so that --resume finds it) and, for the k-th kill, at least
        # k trials are stored: Ray starting, a trial running, a trial being stored, between trials
        recorded = False
        while w.run_for(0.5):
            count = stored_trials(out, name)
            recorded = count is not None and count >= k
            if recorded:
                break
        delay = rng.uniform(0, 6)
        if recorded and w.run_for(delay):
            w.kill()
            kills.append(round(delay, 1))
            leftovers.append(sorted(names(w.survivors(grace=5))))
        w.cleanup()  # a killed driver's local Ray is cleaned up as its process group would be
        store = Store(default_url(str(out)))
        snapshots.append({t["trial"]: t for t in store.trials(name)})
        store.engine.dispose()
        if recorded:
            cmd = [sys.executable, "-m", "trainscout.cli", "search", "--resume", str(out)]
    w = Watch(cmd, log=str(tmp_path / "final.log"), sockets=False)
    rc = w.wait(timeout=900)
    assert rc == 0, open(tmp_path / "final.log").read()[-3000:]
    after = Store(default_url(str(out))).trials(name)
    assert len(after) == n and len({t["trial"] for t in after}) == n, (seed, [t["status"] for t in after])
    by_id = {t["trial"]: t for t in after}
    for snap in snapshots:  # nothing stored before a kill was lost or changed
        for tid, t in snap.items():
            assert by_id.get(tid) == t, (seed, tid)
    keys = [m.key for m in Store(default_url(str(out))).measurements()]
    assert len(keys) == len(set(keys))
    study = optuna.load_study(study_name=name, storage=default_url(str(out)))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert not w.survivors()
    print(f"R2: seed {seed}, kills after {kills} s, trials stored at each kill "
          f"{[len(s) for s in snapshots]}, processes left by each killed driver {leftovers}, final {len(after)}")
    assert len(kills) == times, (seed, kills, [len(s) for s in snapshots])


# --- R6: two writers on one store; a damaged SQLite file ---------------------------------------------------------
WRITER = textwrap.dedent("""
    import json, os, sys, time
    from trainscout.store import Store
    url, who, n, shared = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    log, go = sys.argv[5], sys.argv[6]
    store = Store(url)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    with open(log, "a") as f:
        for i in range(n):
            key = f"{who}-{i:04d}"
            assert store.put(key, {"model": "tiny", "status": "ok", "config": {"who": who, "i": i},
                                   "metrics": {"tokens_per_s": float(i)}, "trial_id": key})
            f.write(key + "\\n")
            f.flush()
            if i < shared:  # both writers measure the shared configurations again (crash/timeout: newer wins)
                store.add_measurement(f"shared-{i:03d}", {"model": "tiny", "status": "crash",
                                                          "config": {"i": i, "by": who}, "metrics": None})
""")

READER = textwrap.dedent("""
    import os, sys, time
    from trainscout.store import Store
    url, go, stop, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = Store(url)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    misses = reads = 0
    while not os.path.exists(stop):
        for i in range(n):
            reads += 1
            misses += store.get(f"shared-{i:03d}") is None
    print(misses, reads)
""")


def record(key: str, i: int) -> dict:
    return {"model": "tiny", "status": "ok", "config": {"i": i}, "metrics": {"tokens_per_s": float(i)},
            "trial_id": key, "pad": "x" * 300}


def py(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def ready(*procs: subprocess.Popen) -> None:
    """Wait until each WRITER/READER has imported and opened the store (its first line): fixed sleeps of 2-3 s
    before, too long on an idle box and maybe too short on a loaded one."""
    for p in procs:
        line = p.stdout.readline().strip()
        assert line == "ready", (line, p.stderr.read()[-2000:] if p.poll() is not None else "")


def test_r6_two_processes_write_500_records_each_none_lost_none_duplicated(tmp_path):
    url, n, shared = default_url(str(tmp_path)), 500, 50
    go, stop = tmp_path / "go", tmp_path / "stop"
    seed = Store(url)
    for i in range(shared):  # configurations both writers measure again while a reader looks them up
        seed.add_measurement(f"shared-{i:03d}", {"model": "tiny", "status": "crash", "config": {"i": i},
                                                 "metrics": None})
    writers = [py(WRITER, url, who, n, shared, tmp_path / f"{who}.log", go) for who in ("a", "b")]
    reader = py(READER, url, go, stop, shared)
    ready(*writers, reader)  # both imported and opened the store
    t0 = time.time()
    go.touch()
    for p in writers:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    wall = time.time() - t0
    stop.touch()
    got, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err[-2000:]
    misses, reads = map(int, got.split())
    rows = Store(url).measurements()
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys)) == 2 * n + shared  # 0 duplicated
    written = {k for who in ("a", "b") for k in (tmp_path / f"{who}.log").read_text().split()}
    assert len(written) == 2 * n and written <= set(keys)  # 0 lost
    for r in rows:
        if not r.key.startswith("shared-"):
            who, i = r.key.split("-")
            assert r.config == {"who": who, "i": int(i)} and r.metrics["tokens_per_s"] == int(i)
    # a measurement replaced by one process is never missing for another (replace is one transaction)
    assert reads > 0 and misses == 0, (misses, reads)
    print(f"R6: {2 * n} records + {shared} shared re-measured by 2 processes in {wall:.1f} s, "
          f"{reads} concurrent reads, 0 lost, 0 duplicated")


OPENER = textwrap.dedent("""
    import os, sys, time
    from trainscout.store import Store
    root, who, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for a in range(attempts):
        go = os.path.join(root, f"go{a}")
        open(os.path.join(root, f"ready{a}{who}"), "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
        store = Store("sqlite:///" + os.path.join(root, f"new{a}", "results.db"))  # the tables do not exist yet
        for i in range(5):
            assert store.put(f"{who}-{i:04d}", {"model": "tiny", "status": "ok", "config": {"who": who, "i": i},
                                                "metrics": {"tokens_per_s": float(i)}, "trial_id": f"{who}-{i}"})
        store.engine.dispose()
""")


def test_r6_two_processes_open_a_new_store_at_once(tmp_path):
    """Both create the tables of a store that does not exist yet, 10 times: two processes (not two per attempt: 20
    interpreters took 20 s of 2 cores), both waiting on the same go-file for each new store, so that they open it
    within a millisecond or two of each other (two fresh interpreters raced only as close as their imports)."""
    attempts = 10
    for a in range(attempts):
        os.makedirs(tmp_path / f"new{a}")
    openers = [py(OPENER, tmp_path, who, attempts) for who in ("a", "b")]
    for a in range(attempts):
        deadline = time.time() + 120
        while not all((tmp_path / f"ready{a}{who}").exists() for who in ("a", "b")):
            assert time.time() < deadline and all(p.poll() is None for p in openers), \
                [p.communicate()[1][-2000:] for p in openers if p.poll() is not None]
            time.sleep(0.005)
        (tmp_path / f"go{a}").touch()
    for p in openers:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    for a in range(attempts):
        assert len(Store(default_url(str(tmp_path / f"new{a}"))).measurements()) == 10


@pytest.fixture(scope="module")
def full_store_file(tmp_path_factory):
    """A store of 1000 measurements, folded into results.db (nothing left in the write-ahead log), written once for
    the module: (its folder, the records written)."""
    folder = tmp_path_factory.mktemp("full-store")
    s = Store("sqlite:///" + str(folder / "results.db"))
    written = {}
    for i in range(1000):
        key = f"k{i:04d}"
        written[key] = record(key, i)
        s.put(key, written[key])
    s.checkpoint()
    s.engine.dispose()
    return folder, written


@pytest.fixture
def full_store(full_store_file, tmp_path):
    """A copy of full_store_file's store in this test's folder (each test damages its own)."""
    import shutil
    folder, written = full_store_file
    for f in folder.iterdir():  # results.db, and a -wal or -shm file if one was left
        shutil.copy(f, tmp_path / f.name)
    path = tmp_path / "results.db"
    return path, "sqlite:///" + str(path), dict(written)


def damage(path, how: str) -> None:
    size, page = os.path.getsize(path), 4096
    if how == "truncated":  # the last 10 pages are gone (a copy cut short, a full disk)
        os.truncate(path, size - 10 * page)
    elif how == "garbage-tail":  # the last 3 pages overwritten
        with open(path, "r+b") as f:
            f.seek(size - 3 * page)
            f.write(random.Random(0).randbytes(3 * page))
    elif how == "cut-mid-page":  # 100 bytes short: the b-tree is intact, values on the last page are zeroed
        os.truncate(path, size - 100)


@pytest.mark.parametrize("how", ["truncated", "garbage-tail", "cut-mid-page"])
def test_r6_damaged_tail_still_opens_and_says_what_was_dropped(full_store, capsys, how):
    path, url, written = full_store
    damage(path, how)
    store = Store(url)
    err = capsys.readouterr().err
    assert store.warning and err.count("\n") == 1 and "trainscout: warning:" in err and "Traceback" not in err
    assert "dropped" in store.warning and "trainscout_measurements" in store.warning
    rows = store.measurements()
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys))  # 0 duplicated
    for r in rows:  # every row kept is the row written
        assert {k: v for k, v in r.to_dict().items() if k not in ("key", "source")} == written[r.key]
    dropped = len(written) - len(rows)
    assert 0 < dropped < 200
    counted = re.search(r"trainscout_measurements (\d+) of 1000 rows", store.warning)
    after = re.search(r"every row after rowid (\d+)", store.warning)
    assert counted or after, store.warning
    if counted:  # nothing lost that the warning does not count
        assert int(counted.group(1)) == dropped
    else:  # the rows after the last readable one are the last rows written
        assert sorted(keys) == sorted(written)[:len(rows)] and int(after.group(1)) == len(rows)
    assert [p for p in os.listdir(path.parent) if ".damaged-" in p]  # the damaged file is kept aside
    assert store.put("new", record("new", 1)) and store.get("new").config == {"i": 1}  # and it works
    assert Store(url).warning is None  # repaired once
    print(f"R6 {how}: kept {len(rows)}, dropped {dropped} (named in the warning: {store.warning.split(', the')[0]})")


def test_r6_torn_write_ahead_log_loses_no_committed_record(tmp_path):
    """A writer killed mid-stream, its log's tail torn: every record whose put() returned is still there."""
    url, go, log = default_url(str(tmp_path)), tmp_path / "go", tmp_path / "w.log"
    p = py(WRITER, url, "w", 100000, 0, log, go)
    ready(p)
    go.touch()
    while not log.exists() or len(log.read_text().split()) < 300:
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    wal = str(tmp_path / "results.db-wal")
    assert os.path.getsize(wal) > 0
    with open(wal, "ab") as f:  # half a frame of garbage: the write the kill interrupted
        f.write(random.Random(1).randbytes(2048))
    committed = set(log.read_text().split())
    store = Store(url)
    keys = [r.key for r in store.measurements()]
    assert store.warning is None
    assert committed <= set(keys) and len(keys) == len(set(keys)), len(committed - set(keys))
    print(f"R6 torn WAL: {len(committed)} committed before the kill, {len(keys)} stored, 0 lost, 0 duplicated")


def test_r6_a_file_that_is_not_sqlite_is_refused_not_touched(tmp_path, capsys):
    f = tmp_path / "notes.db"
    f.write_text("my notes\n")
    rc = main(["results", "sqlite:///" + str(f)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--storage" in err and "Traceback" not in err, err
    assert f.read_text() == "my notes\n" and os.listdir(tmp_path) == ["notes.db"]


# --- R7: 100 malformed inputs ------------------------------------------------------------------------------------
MARKER = f"/tmp/trainscout-r7-pwned-{os.getpid()}"
KNOBS = ["activation_checkpointing", "attention", "compile", "micro_batch_size", "precision", "tf32", "zero_stage",
         "fsdp", "offload_optimizer", "offload_params"]


def space_cases():
    """(id, space file content (str or bytes), field the message must name)."""
    c = [
        ("yaml-unclosed-list", "zero_stage: [0, 1", "--space"),
        ("yaml-unclosed-map", "zero_stage: {a: 1", "--space"),
        ("yaml-double-colon", "zero_stage: a: b", "--space"),
        ("yaml-tab-indent", "zero_stage:\n\t- 1\n", "--space"),
        ("yaml-unterminated-quote", "precision: 'fp32\n", "--space"),
        ("yaml-extra-bracket", "zero_stage: [1, 2]]\n", "--space"),
        ("yaml-undefined-alias", "zero_stage: *nowhere\n", "--space"),
        ("yaml-bad-directive", "%YAML 9.9\n---\nzero_stage: 1\n", "--space"),
        ("yaml-two-documents", "zero_stage: 1\n---\nzero_stage: 2\n", "--space"),
        ("yaml-unhashable-key", "? [a, b]\n: 1\n", "--space"),
        ("not-mapping-list", "- zero_stage\n- fsdp\n", "--space"),
        ("not-mapping-int", "42\n", "--space"),
        ("not-mapping-string", "'zero_stage'\n", "--space"),
        ("key-int", "1: 2\n", "--space"),
        ("key-null", "~: 2\n", "--space"),
        ("unknown-typo", "zero_stag: 1\n", "zero_stag"),
        ("unknown-upper", "ZERO_STAGE: 1\n", "ZERO_STAGE"),
        ("unknown-lr", "learning_rate: 0.001\n", "learning_rate"),
        ("unknown-nested", "deepspeed:\n  zero_stage: 2\n", "deepspeed"),
        ("zero-stage-4", "zero_stage: 4\n", "zero_stage"),
        ("zero-stage-neg", "zero_stage: -1\n", "zero_stage"),
        ("zero-stage-float", "zero_stage: 1.5\n", "zero_stage"),
        ("zero-stage-word", "zero_stage: two\n", "zero_stage"),
        ("zero-stage-list-4", "zero_stage: [0, 4]\n", "zero_stage"),
        ("mbs-0", "micro_batch_size: 0\n", "micro_batch_size"),
        ("mbs-neg", "micro_batch_size: -8\n", "micro_batch_size"),
        ("mbs-3", "micro_batch_size: 3\n", "micro_batch_size"),
        ("mbs-float", "micro_batch_size: 2.0\n", "micro_batch_size"),
        ("mbs-huge", "micro_batch_size: 99999999999999999999999\n", "micro_batch_size"),
        ("precision-fp64", "precision: fp64\n", "precision"),
        ("attention-flash9", "attention: flash9\n", "attention"),
        ("compile-maybe", "compile: maybe\n", "compile"),
        ("ckpt-too-deep", "activation_checkpointing: 99\n", "activation_checkpointing"),
        ("ckpt-zero", "activation_checkpointing: 0\n", "activation_checkpointing"),
        ("mbs-nan", "micro_batch_size: .nan\n", "micro_batch_size"),
        ("zero-stage-inf", "zero_stage: .inf\n", "zero_stage"),
        ("mbs-neg-inf", "micro_batch_size: -.inf\n", "micro_batch_size"),
        ("ckpt-nan", "activation_checkpointing: .nan\n", "activation_checkpointing"),
        ("list-with-nan", "zero_stage: [0, .nan]\n", "zero_stage"),
        ("empty-list", "zero_stage: []\n", "zero_stage"),
        ("duplicate-in-list", "zero_stage: [1, 1]\n", "zero_stage"),
        ("needs-zero3", "offload_params: true\n", "offload_params"),
        ("needs-zero", "offload_optimizer: true\n", "offload_optimizer"),
        ("fsdp-with-zero", "zero_stage: 2\nfsdp: full_shard\n", "fsdp"),
        ("payload-os-system", f"zero_stage: !!python/object/apply:os.system ['touch {MARKER}']\n", "--space"),
        ("payload-top-level", f"!!python/object/apply:os.system ['touch {MARKER}']\n", "--space"),
        ("payload-subprocess", f"x: !!python/object/apply:subprocess.check_call [['touch', '{MARKER}']]\n", "--space"),
        ("payload-new", f"x: !!python/object/new:os.system ['touch {MARKER}']\n", "--space"),
        ("payload-name", "x: !!python/name:os.system\n", "--space"),
        ("payload-module", "x: !!python/module:os\n", "--space"),
        ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                       "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n", "a"),
        ("deep-list", "zero_stage: " + "[" * 5000 + "]" * 5000 + "\n", "--space"),
        ("deep-map", "zero_stage: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "--space"),
        ("huge-10mb", "# " + "x" * (10 << 20) + "\n", "--space"),
        ("not-utf8", b"zero_stage: \xff\xfe\n", "--space"),
        ("nul-bytes", b"zero_stage: 1\x00\n", "--space"),
    ]
    for k in KNOBS:  # wrong types for every knob
        c.append((f"{k}-mapping", f"{k}: {{value: 1}}\n", k))
        c.append((f"{k}-null", f"{k}: null\n", k))
        c.append((f"{k}-date", f"{k}: 2001-12-14\n", k))
    return c


def flag_cases():
    """(id, argv after `trainscout`, field); DIR, STORE, SPACE are filled in by the test."""
    s = ["search", "--model", "tiny", "--device", "cpu", "--out", "OUT"]
    t = ["trial", "--model", "tiny", "--device", "cpu"]
    return [
        ("set-zero-stage-4", s + ["--trials", "2", "--set", "zero_stage=4"], "zero_stage"),
        ("set-mbs-0", s + ["--trials", "2", "--set", "micro_batch_size=0"], "micro_batch_size"),
        ("set-mbs-nan", s + ["--trials", "2", "--set", "micro_batch_size=nan"], "micro_batch_size"),
        ("set-no-equals", s + ["--trials", "2", "--set", "zero_stage"], "--set"),
        ("set-empty-value", s + ["--trials", "2", "--set", "precision="], "--set"),
        ("set-unknown", s + ["--trials", "2", "--set", "zero_stages=1"], "zero_stages"),
        ("set-twice", s + ["--trials", "2", "--set", "zero_stage=1", "--set", "zero_stage=2"], "--set"),
        ("trials-0", s + ["--trials", "0"], "--trials"),
        ("trials-neg", s + ["--trials", "-3"], "--trials"),
        ("trials-word", s + ["--trials", "many"], "--trials"),
        ("no-trials", s, "--trials"),
        ("time-budget-word", s + ["--time-budget", "soon"], "--time-budget"),
        ("time-budget-0", s + ["--time-budget", "0m"], "--time-budget"),
        ("steps-0", s + ["--trials", "2", "--steps", "0"], "--steps"),
        ("warmup-neg", s + ["--trials", "2", "--warmup", "-1"], "--warmup"),
        ("timeout-nan", s + ["--trials", "2", "--timeout", "nan"], "--timeout"),
        ("timeout-inf", s + ["--trials", "2", "--timeout", "inf"], "--timeout"),
        ("global-batch-0", s + ["--trials", "2", "--global-batch", "0"], "--global-batch"),
        ("seq-len-word", s + ["--trials", "2", "--seq-len", "long"], "--seq-len"),
        ("grad-clip-nan", s + ["--trials", "2", "--grad-clip", "nan"], "--grad-clip"),
        ("steps-and-tokens", s + ["--trials", "2", "--train-steps", "5", "--train-tokens", "5"], "--train-tokens"),
        ("gpus-per-trial-0", s + ["--trials", "2", "--gpus-per-trial", "0"], "--gpus-per-trial"),
        ("max-failures-neg", s + ["--trials", "2", "--max-failures", "-1"], "--max-failures"),
        ("seed-word", s + ["--trials", "2", "--seed", "x"], "--seed"),
        ("device-tpu", s + ["--trials", "2", "--device", "tpu"], "--device"),
        ("unknown-flag", s + ["--trials", "2", "--bogus"], "--bogus"),
        ("storage-no-dialect", s + ["--trials", "2", "--storage", "nosuchdb://x/y"], "--storage"),
        ("storage-not-url", s + ["--trials", "2", "--storage", "not a url"], "--storage"),
        ("storage-missing-dir", s + ["--trials", "2", "--storage", "sqlite:////nonexistent-dir/sub/results.db"],
         "--storage"),
        ("storage-no-driver", s + ["--trials", "2", "--storage", "postgresql://u:p@127.0.0.1:1/db"], "--storage"),
        ("storage-not-sqlite", s + ["--trials", "2", "--storage", "sqlite:///NOTDB"], "--storage"),
        ("model-unknown", s[:1] + ["--model", "gpt-7"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-near-miss", s[:1] + ["--model", "pythia-13m"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-missing-file", s[:1] + ["--model", "/nonexistent/config.json"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-bad-json", s[:1] + ["--model", "BADJSON"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-json-list", s[:1] + ["--model", "LISTJSON"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-no-type", s[:1] + ["--model", "NOTYPE"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-not-causal", s[:1] + ["--model", "VIT"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-deep-json", s[:1] + ["--model", "DEEPJSON"] + s[3:] + ["--trials", "2"], "--model"),
        ("model-directory", s[:1] + ["--model", "DIR/"] + s[3:] + ["--trials", "2"], "--model"),
        ("space-missing", s + ["--trials", "2", "--space", "/nonexistent/space.yaml"], "--space"),
        ("space-directory", s + ["--trials", "2", "--space", "DIR"], "--space"),
        ("resume-missing", ["search", "--resume", "/nonexistent/run"], "--resume"),
        ("resume-no-search", ["search", "--resume", "STOREDIR"], "--resume"),
        ("trial-zero-stage-4", t + ["--set", "zero_stage=4"], "zero_stage"),
        ("trial-fault-kind", t + ["--inject-fault", "meteor"], "--inject-fault"),
        ("trial-fault-rank", t + ["--inject-fault", "oom@x"], "--inject-fault"),
        ("trial-workers-0", t + ["--workers", "0"], "--workers"),
        ("trial-measure-accum-neg", t + ["--measure-accum", "-1"], "--measure-accum"),
        ("trial-cuda-without-gpu", t[:3] + ["--device", "cuda"], "--device"),
        ("trial-model-unknown", ["trial", "--model", "llama-9000"], "--model"),
        ("results-missing", ["results", "/nonexistent/run"], "DIR"),
        ("results-sort-unknown", ["results", "STOREDIR", "--sort", "speed"], "--sort"),
        ("results-format", ["results", "STOREDIR", "--format", "xml"], "--format"),
        ("import-missing", ["results", "STOREDIR", "--import", "/nonexistent/x.jsonl"], "--import"),
        ("import-garbage", ["results", "STOREDIR", "--import", "BADJSON"], "--import"),
        ("export-unwritable", ["results", "STOREDIR", "--export", "/nonexistent/dir/x.jsonl"], "--export"),
        ("export-neither", ["export", "STOREDIR", "--out", "OUT"], "--best"),
        ("export-no-key", ["export", "STOREDIR", "--trial", "ffff", "--out", "OUT"], "--trial"),
        ("export-empty-store", ["export", "STOREDIR", "--best", "--out", "OUT"], "--best"),
        ("unknown-command", ["frobnicate"], "COMMAND"),
        ("schedule-bad-number", ["ENV:x:oom"] + s + ["--trials", "2"], "TRAINSCOUT_FAULT_SCHEDULE"),
        ("schedule-bad-kind", ["ENV:3:meteor"] + s + ["--trials", "2"], "TRAINSCOUT_FAULT_SCHEDULE"),
    ]


CASES = [("space-" + i, ["SPACEFILE"], f, content) for i, content, f in space_cases()] + \
        [("flags-" + i, argv, f, None) for i, argv, f in flag_cases()]


def materialize(tmp_path, argv, content):
    """Fill the placeholders of a case with real files; returns (argv, environment overrides)."""
    files = {
        "BADJSON": ("bad.json", "{not json"), "LISTJSON": ("list.json", "[1, 2]"), "NOTYPE": ("nt.json", '{"a": 1}'),
        "VIT": ("vit.json", json.dumps({"model_type": "vit"})),
        "DEEPJSON": ("deep.json", '{"model_type": ' + "[" * 100000 + "]" * 100000 + "}"),
        "NOTDB": ("notes.db", "my notes\n"),
    }
    env = {}
    if argv and argv[0].startswith("ENV:"):
        env["TRAINSCOUT_FAULT_SCHEDULE"] = argv[0][4:]
        argv = argv[1:]
    out = []
    for a in argv:
        if a == "SPACEFILE":
            p = tmp_path / "space.yaml"
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
            out += ["search", "--model", "tiny", "--device", "cpu", "--trials", "2", "--space", str(p),
                    "--out", str(tmp_path / "out")]
            continue
        if a in files:
            name, text = files[a]
            (tmp_path / name).write_text(text)
            a = str(tmp_path / name)
        elif a.startswith("sqlite:///") and a[10:] in files:
            name, text = files[a[10:]]
            (tmp_path / name).write_text(text)
            a = "sqlite:///" + str(tmp_path / name)
        elif a in ("DIR", "DIR/"):
            (tmp_path / "adir").mkdir(exist_ok=True)
            a = str(tmp_path / "adir") + a[3:]
        elif a == "STOREDIR":
            Store(default_url(str(tmp_path / "store"))) if (tmp_path / "store").mkdir() is None else None
            a = str(tmp_path / "store")
        elif a == "OUT":
            a = str(tmp_path / "out")
        out.append(a)
    return out, env


def test_r7_there_are_at_least_100_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_r7_malformed_input_exits_2_with_one_line_naming_the_field(tmp_path, capsys, monkeypatch, case):
    _, argv, field, content = case
    argv, env = materialize(tmp_path, argv, content)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2, (rc, cap.out[-500:], err[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("trainscout: error: "), err[-2000:]
    assert field in err and "Traceback" not in err, err
    assert not os.path.exists(MARKER)  # no payload ran
    assert not (tmp_path / "out").exists()  # nothing written half-way


SUBPROCESS_CASES = ["space-payload-os-system", "space-huge-10mb", "space-yaml-unclosed-list",
                    "flags-storage-no-driver", "flags-model-unknown", "flags-trial-zero-stage-4"]


@pytest.fixture(scope="module")
def r7_real_commands(tmp_path_factory):
    """Every SUBPROCESS_CASES command started at once, each in a folder of its own (one after another, each mostly
    its interpreter's imports, they took 9 s on 2 cores): {name: Popen}; ended by their PIDs."""
    procs = {}
    for name in SUBPROCESS_CASES:
        _, argv, _, content = next(c for c in CASES if c[0] == name)
        argv, env = materialize(tmp_path_factory.mktemp("r7"), argv, content)
        procs[name] = subprocess.Popen([sys.executable, "-m", "trainscout.cli", *argv], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, **env))
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_r7_real_command_exits_2_without_traceback(r7_real_commands, name):
    field = next(c for c in CASES if c[0] == name)[2]
    p = r7_real_commands[name]
    stdout, stderr = p.communicate(timeout=120)
    err = stderr.strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and field in err and "Traceback" not in err, err
    assert stdout == "" and not os.path.exists(MARKER)


# --- R9: the store fails while a search runs (issue 30) -------------------------------------------------------------
def _mount_tmpfs(path, size: str) -> bool:
    """A real small filesystem for a real full disk (tmpfs; needs the right to mount, else the case is skipped)."""
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _fill(folder) -> None:
    """Write zeros into folder until the filesystem is full."""
    with open(folder / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass


# CI keeps one (a deleted store, the case that took everything down); the other two are the long variants (-m slow)
@pytest.mark.parametrize("fault", ["deleted", pytest.param("disk-full", marks=pytest.mark.slow),
                                   pytest.param("read-only", marks=pytest.mark.slow)])
def test_r9_a_store_that_fails_mid_search_stops_it_in_one_line_keeping_what_was_measured(tmp_path, fault, ray_local,
                                                                                         capsys):
    """results.db (with its -wal and -shm) deleted, its disk filled, or the files made immutable after the search's
    first trial: the search stops (it does not run its other trials into nowhere), prints no summary and no
    traceback, ends with one line saying what failed and what was kept, and exits 1. A deleted store is re-created
    from what the driver's connection still reads: every trial recorded before the deletion is in the new file. The
    search runs in this process on the session's Ray (its own interpreter, imports and Ray are not what this checks);
    the fault comes from another thread."""
    root = tmp_path
    if fault == "disk-full":
        root = tmp_path / "disk"
        if not _mount_tmpfs(root, "24m"):
            pytest.skip("no right to mount a tmpfs here: the full-disk case needs a real small filesystem")
    if fault == "read-only":
        probe = tmp_path / "probe"
        probe.touch()
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode:
            pytest.skip("chattr +i is not permitted here: the read-only case needs it")
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    try:
        _r9_search(root, fault, capsys)
    finally:
        if fault == "disk-full":
            subprocess.run(["umount", str(root)], capture_output=True)


def _r9_search(root, fault, capsys):
    out = root / "s9"
    db = out / "results.db"
    files = [db, out / "results.db-wal", out / "results.db-shm"]
    ended, at = threading.Event(), {}

    def fail_the_store():  # once the first trial is stored, while the search still runs
        while not ended.wait(0.5):
            before = stored_trials(out, "s9")
            if before:
                at.update(before=before, running=not ended.is_set())
                break
        else:
            return
        if fault == "deleted":
            for f in files:
                f.unlink(missing_ok=True)
        elif fault == "disk-full":
            _fill(root)
        else:
            at["chattr"] = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True).returncode
    faulting = threading.Thread(target=fail_the_store, daemon=True)
    faulting.start()
    try:
        rc = main(search_cli(out, "--trials", "8", "--seed", "1")[3:])
    finally:
        ended.set()
        faulting.join(timeout=60)
        if fault == "read-only":
            subprocess.run(["chattr", "-i", *map(str, files)], capture_output=True)
        if fault == "disk-full":
            (root / "filler").unlink(missing_ok=True)
    cap = capsys.readouterr()
    log = cap.out + cap.err
    assert at.get("before") and at["running"], log[-3000:]
    assert not at.get("chattr"), at
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc == 1, log[-3000:]
    assert "Traceback" not in log and "best, rank 1" not in log, log[-3000:]
    assert lines[-1].startswith("trainscout: error: the results store"), lines[-3:]
    before, after = at["before"], stored_trials(out, "s9")
    assert after is not None and before <= after < 8, (before, after)  # stopped, not run to the end
    if fault == "deleted":
        assert "rescued into" in lines[-1] and str(db) in lines[-1], lines[-1]
        assert f"its {after} trial" in lines[-1], lines[-1]
        study = optuna.load_study(study_name="s9", storage=default_url(str(out)))  # the study came back too
        assert len(study.trials) >= after
    else:
        assert f"the {after} trial" in lines[-1] and "kept in" in lines[-1], lines[-1]
