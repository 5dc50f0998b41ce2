"""Searches and trials attached by address to a real multi-node Ray cluster on 127.0.0.1 (tests/raycluster.py:
Ray's own multi-node test cluster, a head without CPUs, two CPU nodes, a node with a mock of a GPU): two searches
at once both measuring, the hardware read on the nodes that run trials (a CPU-only head drives a GPU search),
a trial split over two nodes and its record saying so, a trial the cluster has no room for marked unscheduled,
and a cluster that refuses the driver's token said in one line."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from trainscout.store import Store, default_url

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(900)
# no inductor or DeepSpeed compiles: torchao's low-bit and bf16 AdamW compile their step, per parameter shape, in
# every rank process (a search here may draw them; the CPU demo fixes both knobs too)
FAST = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
        "--set", "attention=sdpa", "--set", "micro_batch_size=2", "--set", "optimizer_state=fp32",
        "--set", "precision=bf16-mixed"]


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "trainscout.cli", *map(str, args)]


def search(address, out, ranks, *extra) -> list[str]:
    return cli("search", "--model", "tiny", "--device", "cpu", "--gpus-per-trial", ranks, "--steps", "2",
               "--warmup", "1", *FAST, "--address", address, "--out", out, *extra)


def run(cmd, **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_trial_split_over_two_nodes_says_so_and_one_without_room_is_unscheduled(ray_cluster, tmp_path,
                                                                                 token_head_starting):
    """Other jobs hold 1.5 of each CPU node's 2 CPUs: a 2-rank trial (half a CPU a rank) fits only split over both
    nodes; one that must stay on one node (--one-node, a search's default) never gets its resources. (The token
    head of test_a_cluster_that_refuses_the_driver_is_said_in_one_line starts meanwhile: token_head_starting.)"""
    from trainscout.analysis.table import load_resolved
    from trainscout.trial.records import Record
    addr, send = ray_cluster["address"], ray_cluster["send"]
    for node in ray_cluster["cpu_nodes"]:
        assert send(f"block {node} 1.5") == "blocked"
    try:
        t0 = time.time()
        # at once: a trial that may be split, and one that must stay on one node (it waits out its limit)
        split = run(cli("trial", "--model", "tiny", "--device", "cpu", "--workers", "2", "--steps", "2", "--warmup",
                        "1", "--address", addr, "--no-one-node", "--json", *FAST))
        one = run(cli("trial", "--model", "tiny", "--device", "cpu", "--workers", "2", "--steps", "2", "--warmup", "1",
                      "--address", addr, "--timeout", "10", "--json", *FAST))
        split_out, split_err = split.communicate(timeout=600)
        # then a search whose trial cannot be placed on one node (its Tune actor takes a quarter CPU of one)
        s = run(search(addr, tmp_path / "starved", 2, "--trials", "1", "--timeout", "5"))  # never placeable: its
        # placement wait is waited out whole (10 s before)
        one_out, one_err = one.communicate(timeout=600)
        s_out, s_err = s.communicate(timeout=600)
        print(f"unscheduled and split trials: {time.time() - t0:.1f} s")
    finally:
        assert send("unblock") == "unblocked"
    # the single trial: unscheduled, not a timeout that reads "workers killed"; exit 1
    assert one.returncode == 1, one_err[-2000:]
    r = json.loads(one_out)
    assert r["status"] == "unscheduled" and "no room" in r["error"] and "killed" not in r["error"], r
    # the search: its trial row unscheduled with why, the sampler told nothing (FAIL), the summary says so, exit 1
    assert s.returncode == 1, s_err[-3000:]
    assert "1 trial was unscheduled" in s_out and "--resume" in s_out and "unscheduled" in s_err
    store = Store(default_url(str(tmp_path / "starved")))
    [t] = store.trials("starved")
    assert t["status"] == "unscheduled" and "no room" in t["error"] and not store.measurements()
    import optuna
    [ot] = optuna.load_study(study_name="starved", storage=default_url(str(tmp_path / "starved"))).trials
    assert ot.state == optuna.trial.TrialState.FAIL and ot.user_attrs["status"] == "unscheduled"
    # the split trial: measured over both CPU nodes, and its record says so
    assert split.returncode == 0, split_err[-3000:]
    rec = Record.from_dict(json.loads(split_out))
    assert rec.ok and rec.placement == {"nodes": 2, "ranks_per_node": [1, 1], "split": True}, rec.placement
    out = tmp_path / "split"
    out.mkdir()
    Store(default_url(str(out))).add_measurement("k" * 32, rec)
    assert load_resolved(str(out))["placement"].tolist() == ["2 nodes (1+1)"]  # results marks it
    shown = subprocess.run(cli("results", out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "2 nodes (1+1)" in shown.stdout, shown.stdout


def test_a_gpu_search_is_sized_by_the_gpu_nodes_not_the_cpu_head(ray_cluster):
    """A mock of a GPU (no GPU runs here): the cluster's GPU node advertises 2 `GPU` resources and its processes
    TRAINSCOUT_MOCK_GPU. The driver (this box, no CUDA) takes the kind, memory and count from that node; before,
    --device cuda was refused ("no CUDA GPU is visible") on a head without a GPU."""
    script = textwrap.dedent("""
        import json, sys
        from trainscout.search.service import SearchArgs, validate
        from trainscout.spaces import ConfigError
        args = SearchArgs(model="tiny", out=sys.argv[2], device="cuda", gpus_per_trial=2, trials=1, address=sys.argv[1])
        space, base, hw = validate(args)
        print(json.dumps(hw))
        for ranks, one_node in ((4, True), (3, False)):
            try:
                validate(SearchArgs(model="tiny", out=sys.argv[2], device="cuda", gpus_per_trial=ranks, trials=1,
                                    address=sys.argv[1], one_node=one_node))
            except ConfigError as e:
                print(json.dumps([e.field, str(e)]))
    """)
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run([sys.executable, "-c", script, ray_cluster["address"], os.path.join(d, "s")], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    hw, four, three = (json.loads(line) for line in res.stdout.strip().splitlines()[-3:])
    assert hw["device"] == "cuda" and hw["gpu"].startswith("Mock H200") and hw["gpu_memory_gib"] == 139.8
    assert hw["gpu_count"] == 2 and hw["nodes"] == 1 and hw["capability"] == "9.0"
    assert four[0] == "--gpus-per-trial" and "on one node" in four[1] and "at most 2" in four[1]
    assert three[0] == "--gpus-per-trial" and "the cluster has 2" in three[1]


def test_nodes_of_different_kinds_are_an_error_naming_them():
    """The kind check on facts as node_facts reads them (one of them a mock of a second GPU kind)."""
    from trainscout.search.cluster import hardware_of
    from trainscout.spaces import ConfigError
    base = {"device": "cuda", "cpu": "x86_64", "cpu_count": 2, "cuda": "12.8", "capability": "9.0",
            "memory_bytes": 2**40}
    facts = [dict(base, gpu="NVIDIA H200", gpu_memory_gib=139.8, node_id="a" * 56, address="10.0.0.2",
                  resources={"GPU": 8.0, "CPU": 64.0}),
             dict(base, gpu="NVIDIA H100 80GB HBM3", gpu_memory_gib=79.1, node_id="b" * 56, address="10.0.0.3",
                  resources={"GPU": 8.0, "CPU": 64.0})]
    with pytest.raises(ConfigError) as e:
        hardware_of(facts, "cuda", 8, True, "10.0.0.1:6379")
    assert "8 x NVIDIA H200 (139.8 GiB) on 10.0.0.2 (aaaaaaaa)" in str(e.value)
    assert "8 x NVIDIA H100 80GB HBM3 (79.1 GiB) on 10.0.0.3 (bbbbbbbb)" in str(e.value)
    hw = hardware_of(facts[:1] * 2, "cuda", 8, True, "10.0.0.1:6379")
    assert hw["gpu_count"] == 8 and hw["nodes"] == 2  # one node's GPUs: a trial packs on one node
    assert hardware_of(facts[:1] * 2, "cuda", 16, False, "x")["gpu_count"] == 16  # split: the cluster's


@pytest.fixture(scope="module")
def token_head_starting():
    """A head started by hand as the README says (loopback, its own temp dir) with token authentication on, its
    token given: `ray start` launched when this module's first test starts (6 s of start-up, done while that test's
    trials wait on the cluster; token_head waits for it); its processes stopped by their PIDs (`ray stop` would kill
    every Ray process of the machine)."""
    import psutil
    temp = tempfile.mkdtemp(prefix="ts-head-", dir="/tmp")
    port = _free_port()
    token = "the-head-" + os.urandom(8).hex()
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
               RAY_USAGE_STATS_ENABLED="0")
    started = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head",
                                "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir", temp,
                                "--include-dashboard", "false", "--num-cpus", "1"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        yield {"address": f"127.0.0.1:{port}", "token": token, "started": started}
    finally:
        if started.poll() is None:
            started.communicate(timeout=300)
        mine = [p for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])]
        for p in list(mine):  # and its workers
            try:
                mine += [c for c in p.children(recursive=True) if c not in mine]
            except psutil.NoSuchProcess:
                pass
        for sig, grace in (("terminate", 1), ("kill", 5)):  # the GCS server ignores SIGTERM: 1 s for the rest
            for p in mine:  # (5 s before, waited out by the GCS server each time)
                try:
                    getattr(p, sig)()
                except psutil.NoSuchProcess:
                    pass
            deadline = time.time() + grace  # ended: gone, or a zombie its parent (not this process) has yet to reap
            while mine and time.time() < deadline:
                mine = [p for p in mine if _running(p)]
                time.sleep(0.1)
        import shutil
        shutil.rmtree(temp, ignore_errors=True)


def _running(p) -> bool:
    import psutil
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def token_head(token_head_starting):
    started = token_head_starting["started"]
    out, err = started.communicate(timeout=300)
    assert started.returncode == 0, err[-2000:]
    return {k: token_head_starting[k] for k in ("address", "token")}


def test_a_cluster_that_refuses_the_driver_is_said_in_one_line(token_head, tmp_path):
    """A driver with another token: one line naming what to set, exit 2, nothing written (before: a traceback
    after 32 s, and a 0-trial search left that blocked a rerun)."""
    out = tmp_path / "s"
    t0 = time.time()
    res = subprocess.run(search(token_head["address"], out, 1, "--trials", "1"), cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, RAY_AUTH_MODE="token",
                                                          RAY_AUTH_TOKEN="not-the-head-s"))
    took = time.time() - t0
    assert res.returncode == 2, res.stderr[-2000:]
    [line] = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "refused this driver (Ray token authentication)" in line and "ray get-auth-token" in line, line
    assert not out.exists() and took < 60, took  # nothing written, no 32 s of retries
    res = subprocess.run(search(token_head["address"], out, 1, "--trials", "1"), cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                      if not k.startswith("RAY_AUTH")}
                         | {"HOME": str(tmp_path)})  # no token at all, token mode not set
    [line] = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "set RAY_AUTH_MODE=token" in line, res.stderr[-2000:]


@pytest.mark.slow
def test_a_trial_attaches_to_a_token_cluster_with_its_token(token_head):
    ok = subprocess.run(cli("trial", "--model", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0",
                            "--address", token_head["address"], "--json", *FAST), cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, RAY_AUTH_MODE="token",
                                                         RAY_AUTH_TOKEN=token_head["token"]))
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] == "ok", ok.stderr[-2000:]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
