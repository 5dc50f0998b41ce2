"""Issue 50: data-loss and hang classes.

1. A kill by the host's memory monitor (Ray's, RAY_memory_usage_threshold) is `host_oom`, never the configuration's
   `oom`: not served from the store, not counted toward --trials; a search it hits ends in one line, exit 1, no Optuna
   trial left RUNNING. The env var is set only in a subprocess's environment, never in this session's Ray.
2. `--address` where something that is not Ray accepts connections is refused within 5 s.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from trainscout.spaces import ConfigError
from trainscout.store import open_store
from trainscout.trial import reach
from trainscout.trial.records import Record
from trainscout.trial.status import DETERMINISTIC, Status, classify, host_oom_line, served

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ray's message for a worker its memory monitor killed (ray.exceptions.OutOfMemoryError), as seen on an H100
RAY_OOM = ("OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. Memory on the node "
           "(IP: 10.0.0.5, ID: 3d6114d4) was 120.50GB used / 125.00GB limit (0.964000)")


def low_memory_env() -> dict:
    """A subprocess environment whose Ray kills workers at 5 % of the host's memory (always over it)."""
    return dict(os.environ, RAY_memory_usage_threshold="0.05", RAY_AUTH_MODE="disabled")


# --- 1. host_oom --------------------------------------------------------------------------------------------------
def test_host_oom_is_its_own_status_never_served():
    assert classify(RAY_OOM) == Status.HOST_OOM
    assert classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == Status.OOM
    assert Status.HOST_OOM not in DETERMINISTIC
    line = host_oom_line(RAY_OOM)
    assert "\n" not in line and "memory monitor" in line and "120.50GB used / 125.00GB limit" in line
    assert served("oom", "torch.OutOfMemoryError: CUDA out of memory") and served("ok", None)
    assert not served("oom", RAY_OOM)  # stored as oom before host_oom existed: measured again
    assert not served("host_oom", host_oom_line(RAY_OOM))


def test_a_stored_host_kill_oom_gives_way_to_the_next_measurement(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    old = Record(trial_id="a1", model="tiny", config={}, status=Status.OOM, error=RAY_OOM, metrics=None)
    assert store.add_measurement("k", old) == "first"
    new = Record(trial_id="a2", model="tiny", config={}, status=Status.OK, metrics={"tokens_per_s": 5.0})
    assert store.add_measurement("k", new) == "replaced"
    assert store.get("k").status == Status.OK
    real = Record(trial_id="b1", model="tiny", config={}, status=Status.OOM, error="CUDA out of memory", metrics=None)
    store.add_measurement("k2", real)
    assert store.add_measurement("k2", new.replace(trial_id="b2")) == "sample"  # a real oom stays the measurement


def test_counted_leaves_host_oom_out():
    from trainscout.search.trainable import counted
    rows = [{"status": s} for s in ("ok", "oom", "host_oom", "invalid", "host_oom", "crash")]
    assert counted(rows) == 3


# --- 2. --address where something that is not Ray listens -----------------------------------------------------------
def _listener(answer: bytes | None):
    """A TCP listener on 127.0.0.1 that accepts and says nothing (None) or sends `answer`; its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            held.append(c)
            if answer:
                c.sendall(answer)
    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize("answer", [None, b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n",
                                    b"\x00\x00\x00\x07\x00\x00\x00\x00\x01garbage"])
def test_address_that_is_not_ray_is_refused_within_5_s(answer):
    srv, port = _listener(answer)
    try:
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="not a Ray cluster's head"):
            reach.check_address(f"127.0.0.1:{port}", "--address")
        assert time.perf_counter() - t0 < 5
    finally:
        srv.close()


def test_cli_address_that_is_not_ray_exits_2_in_seconds():
    srv, port = _listener(None)
    try:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "trainscout.cli", "trial", "--model", "tiny", "--device", "cpu",
                            "--address", f"127.0.0.1:{port}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        wall = time.perf_counter() - t0
    finally:
        srv.close()
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a Ray cluster's head" in r.stderr, r.stderr
    assert wall < 15, wall  # the check itself: < 5 s (above); the rest is the interpreter's and torch's start
    print(f"--address refused in {wall:.1f} s (CLI wall)")


def test_a_real_ray_head_passes_the_check():
    """Ray's GCS answers the HTTP/2 preface (a Ray of its own in a subprocess, never this session's)."""
    code = ("import ray, time\nfrom trainscout.trial import reach\n"
            "ray.init(address='local', include_dashboard=False, _node_ip_address='127.0.0.1')\n"
            "t = time.perf_counter(); reach.check_address(ray.get_runtime_context().gcs_address, '--address')\n"
            "print('ok', time.perf_counter() - t); ray.shutdown()\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


# --- 3. imports are streamed ----------------------------------------------------------------------------------------
MEASURE = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
r = subprocess.run([sys.executable, "-m", "trainscout.cli", "results", sys.argv[1], "--import", sys.argv[2]],
                   capture_output=True, text=True)
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(r.returncode, round(wall, 2), round(rss, 1))
print(r.stderr.strip())
"""


def _gzip_of(path, line: bytes, n: int) -> None:
    import gzip
    block = line * 100_000
    with gzip.open(path, "wb", compresslevel=9) as f:
        for _ in range(n // 100_000):
            f.write(block)


def test_import_of_ten_million_empty_lines_is_refused_fast_in_little_memory(tmp_path):
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_of(bomb, b"{}\n", 10_000_000)
    r = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "out"), str(bomb)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    code, wall, rss = r.stdout.splitlines()[0].split()
    err = r.stdout.splitlines()[1:]
    print(f"import of {bomb.stat().st_size / 1024:.0f} KB gzip of 10M '{{}}' lines: exit {code}, {wall} s, "
          f"peak RSS {rss} MB")
    assert int(code) == 2 and len(err) == 1 and "line 1 " in err[0], r.stdout
    assert float(wall) < 10 and float(rss) < 500


def test_import_limits_rows_line_length_and_bytes(tmp_path, monkeypatch):
    from trainscout.store import contrib
    blank = tmp_path / "blank.jsonl.gz"
    _gzip_of(blank, b"\n", 200_000)
    with pytest.raises(ConfigError, match="more than 100,000 lines"):
        contrib.read_rows(str(blank))
    long = tmp_path / "long.jsonl"
    long.write_bytes(b'{"a": "' + b"x" * (2 << 20) + b'"}\n')
    with pytest.raises(ConfigError, match="line 1 is longer than 1 MiB"):
        contrib.read_rows(str(long))
    monkeypatch.setattr(contrib, "MAX_BYTES", 1000)
    many = tmp_path / "many.jsonl"
    many.write_text(("\n" + " " * 99) * 20)
    with pytest.raises(ConfigError, match="more than 0 MiB"):
        contrib.read_rows(str(many))
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 30)
    with pytest.raises(ConfigError, match="cannot read"):
        contrib.read_rows(str(bad))


# --- 4. input holes: one line, exit 2 ---------------------------------------------------------------------------------
def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    err = [ln for ln in err if ln.startswith("trainscout:")]
    assert len(err) == 1, err
    return err[0]


def test_lookup_of_an_unknown_gpu_is_refused_not_predicted_as_an_h100(capsys):
    from trainscout.cli.main import main
    assert main(["lookup", "--model", "pythia-160m", "--gpu", "T4", "--gpu-memory", "16GiB"]) == 2
    err = one_error(capsys)
    assert "--gpu T4" in err and "not known" in err and "H200" in err


def test_top_k_above_the_experts_is_refused_up_front(tmp_path, capsys):
    from trainscout.cli.main import main
    cfg = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "num_local_experts": 4,
           "num_experts_per_tok": 8, "max_position_embeddings": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["estimate", "--model", str(path)]) == 2
    err = one_error(capsys)
    assert "num_experts_per_tok=8 is more than num_local_experts=4" in err
    path.write_text(json.dumps(dict(cfg, num_experts_per_tok=2)))
    assert main(["estimate", "--model", str(path)]) == 0


def test_estimate_calibrate_matches_by_gpu_kind_and_says_when_nothing_matches(h200_grid, capsys):
    from trainscout.cli.main import main
    assert main(["estimate", "--model", "pythia-160m", "--calibrate", str(h200_grid), "--gpu", "H200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["calibration"] and out["calibration"]["n"] >= 3  # "H200" is the store's "NVIDIA H200"
    assert main(["estimate", "--model", "pythia-160m", "--calibrate", str(h200_grid), "--gpu", "A100"]) == 2
    err = one_error(capsys)
    assert "--calibrate" in err and "0 measured GPU peak(s) of A100" in err and "NVIDIA H200" in err


def test_verify_quality_too_short_to_verify(h200_grid, capsys):
    from trainscout.cli.main import main
    assert main(["verify", str(h200_grid), "--quality", "2"]) == 2
    err = one_error(capsys)
    assert "too short to verify" in err and "--quality 21 or more" in err


def test_printed_storage_urls_are_masked(postgres, tmp_path):
    from trainscout.store.secrets import mask_urls
    assert mask_urls("x postgresql+psycopg://u:s3cret@h:5/d y") == "x postgresql+psycopg://u:***@h:5/d y"
    postgres.create_database("issue50_empty")
    url = postgres.url("issue50_empty", password=True)
    r = subprocess.run([sys.executable, "-m", "trainscout.cli", "report", url, "--out", str(tmp_path / "rep")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "holds no trials or measurements" in r.stderr, r.stderr
    assert postgres.password not in r.stdout + r.stderr and ":***@" in r.stderr


def test_export_over_an_earlier_export_is_refused(h200_grid, tmp_path, capsys):
    from trainscout.cli.main import main
    out = tmp_path / "exp"
    assert main(["export", str(h200_grid), "--best", "--format", "command", "--out", str(out)]) == 0
    before = (out / "trainscout.json").read_bytes()
    capsys.readouterr()
    assert main(["export", str(h200_grid), "--best", "--format", "command", "--out", str(out)]) == 2
    assert "holds an export already" in one_error(capsys)
    assert (out / "trainscout.json").read_bytes() == before


# --- 5. a stale JIT-build lock (a rank killed while building DeepSpeed's op) is named in the trial's error ------------
def test_stale_build_locks_are_old_and_held_by_no_process(tmp_path):
    from trainscout.trial.runner import stale_build_locks
    old, young, held = (tmp_path / n / "lock" for n in ("cpu_adam", "fused_adam", "deepspeed_shm_comm"))
    for p in (old, young, held):
        p.parent.mkdir()
        p.touch()
    past = time.time() - 1200
    for p in (old, held):
        os.utime(p, (past, past))
    fd = os.open(held, os.O_RDONLY)  # a live builder keeps its lock open (torch's FileBaton)
    try:
        found = stale_build_locks(str(tmp_path))
    finally:
        os.close(fd)
    assert [p for p, _ in found] == [os.path.realpath(old)] and found[0][1] >= 1199


def test_a_zero_trial_removes_a_stale_build_lock_and_runs(tmp_path, ray_local, monkeypatch, capsys,
                                                          memory_monitor_runs):
    """The trial command in this process on the session's Ray (a subprocess's own interpreter and Ray cost 10-20 s
    of the suite's 2 cores): its ranks get the TORCH_EXTENSIONS_DIR a command started with it would give them
    (runner.USER_CACHES, read at import), a copy of the checkout's built ops (no build in the test) with a lock no
    process holds, 20 minutes old. Its rank removes it before DeepSpeed loads the op (trial.engines.deepspeed
    .clear_stale_build_locks) and the trial is measured, where DeepSpeed's build would wait on it to the trial's time
    limit. Section 1's memory-monitor runs (memory_monitor_runs) run meanwhile."""
    import shutil

    from trainscout.cli.main import main
    from trainscout.trial import runner
    op = "deepspeed_shm_comm"  # what DeepSpeed builds first on the CPU
    built = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", ""), op)
    if os.path.isdir(built):
        shutil.copytree(built, tmp_path / "ext" / op, ignore=shutil.ignore_patterns("lock"))
    lock = tmp_path / "ext" / op / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    past = time.time() - 1200
    os.utime(lock, (past, past))
    monkeypatch.setitem(runner.USER_CACHES, "TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    # ranks of their own, ended after it: an idle group of this environment held a CPU of the session's Ray, and a
    # later in-process search's Tune trial actor waited for it forever
    monkeypatch.setenv("TRAINSCOUT_FRESH_WORKERS", "1")
    rc = main(["trial", "--model", "tiny", "--device", "cpu", "--workers", "2", "--set", "zero_stage=2", "--set",
               "compile=false", "--steps", "1", "--warmup", "0", "--timeout", "240", "--json"])
    out = capsys.readouterr().out
    rec = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and rec["status"] == "ok", rec["error"]
    assert not lock.exists() or time.time() - lock.stat().st_mtime < 600  # gone (or a build's own, made since)


# --- 1 (the real runs). Both commands start in memory_monitor_runs, which section 5's trial asks for: they run while
# its ranks wait out their 30 s limit on the stale lock (its CPU mostly idle; one after another, after it, they took
# 17 s of this file's 70 on 2 cores)
@pytest.fixture(scope="module")
def memory_monitor_runs(tmp_path_factory):
    """A trial and a search, each a subprocess whose Ray's memory monitor kills its workers (low_memory_env), started
    at once, their output into files (no pipe to fill while nothing reads it): {"trial": Popen, "search": (Popen, out
    folder), "t0": when they started}; read(Popen) -> (stdout, stderr) once it ended; ended by their PIDs."""
    root = tmp_path_factory.mktemp("monitor")
    out = root / "s"

    def start(*args):
        name = args[0]
        return subprocess.Popen([sys.executable, "-m", "trainscout.cli", *args], cwd=ROOT, env=low_memory_env(),
                                stdout=open(root / f"{name}.out", "w"), stderr=open(root / f"{name}.err", "w"))
    runs = {"t0": time.perf_counter(),
            "trial": start("trial", "--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--json"),
            "search": (start("search", "--model", "tiny", "--device", "cpu", "--gpus-per-trial", "2", "--steps", "2",
                             "--warmup", "0", "--timeout", "25", "--trials", "3", "--out", str(out), "--set",
                             "compile=false", "--set", "zero_stage=0"), out)}
    def read(p, timeout):
        p.wait(timeout=timeout)
        name = p.args[3]
        return (root / f"{name}.out").read_text(), (root / f"{name}.err").read_text()
    runs["read"] = read
    yield runs
    for p in (runs["trial"], runs["search"][0]):
        if p.poll() is None:
            p.kill()
            p.wait()


def test_trial_killed_by_the_memory_monitor_is_host_oom(memory_monitor_runs):
    p = memory_monitor_runs["trial"]
    stdout, stderr = memory_monitor_runs["read"](p, 240)
    rec = json.loads(stdout.strip().splitlines()[-1])
    assert p.returncode == 1, stderr[-2000:]
    assert rec["status"] == "host_oom", rec["error"]
    assert "memory monitor" in rec["error"] and "\n" not in rec["error"]
    print(f"trial host_oom within {time.perf_counter() - memory_monitor_runs['t0']:.1f} s")


def test_search_whose_actors_the_memory_monitor_kills_ends_in_one_line(memory_monitor_runs):
    import optuna
    p, out = memory_monitor_runs["search"]
    stdout, stderr = memory_monitor_runs["read"](p, 280)
    err = [ln for ln in stderr.splitlines() if ln.startswith("trainscout:")]
    assert p.returncode == 1, stderr[-3000:]
    assert len(err) == 1 and "memory monitor" in err[0] and "--resume" in err[0], stderr[-3000:]
    assert "Traceback" not in stderr
    store = open_store(f"sqlite:///{out}/results.db")
    rows = store.trials(store.searches()[-1])
    assert rows and all(t["status"] == "host_oom" for t in rows), rows
    assert store.measurements() == []  # nothing stored as the configuration's outcome
    for s in optuna.study.get_all_study_summaries(f"sqlite:///{out}/results.db"):
        study = optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{out}/results.db")
        assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)
