"""Issue 50, item 4: hardware is what it says. A Ray node that declares a GPU (ray start --num-gpus 1) without CUDA
was accepted: a --device cuda trial on it crashed in NCCL ("NCCL not built in"), and the crash was stored as the
configuration's outcome with no GPU name. Now the search's probe refuses such a node, naming it (exit 2), and a
rank given a GPU checks CUDA in its own process before anything runs on it (the trial: unscheduled, that line).
The session's real Ray cluster (tests/raycluster.py, every node on 127.0.0.1) with a CPU node that declares 1 GPU
added."""
import os
import subprocess
import sys

import pytest

from trainscout.trial import pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(300)

SCRIPT = """
import json, sys
import ray
from trainscout.spaces import ConfigError
from trainscout.search.cluster import cluster_hardware
from trainscout.trial.rank import Rank
out = {}
try:
    cluster_hardware(sys.argv[1], "cuda", 1, True)
except ConfigError as e:
    out["search"] = str(e)
a = ray.remote(Rank).options(num_cpus=1, num_gpus=1).remote()  # only the declaring node has a CPU beside a GPU
where = ray.get(a.where.remote())
out["rank"] = ray.get(a.cuda_missing.remote(where[1]))
out["gpus"] = where[1]
print("RESULT " + json.dumps(out), flush=True)
ray.shutdown()
"""


def test_a_node_that_declares_a_gpu_without_cuda_is_refused_naming_it(ray_cluster):
    """A CPU node that declares 1 GPU joins the session's cluster (whose GPU node has a mock of a GPU, which the
    check accepts), and a driver attached to it checks the search's probe and a rank placed on its GPU."""
    import json
    send = ray_cluster["send"]
    node = send("add 2 1")
    try:
        r = subprocess.run([sys.executable, "-c", SCRIPT, ray_cluster["address"]], cwd=ROOT, capture_output=True,
                           text=True, timeout=280)
    finally:
        assert send(f"kill {node}") == "killed"
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, (r.stdout + r.stderr)[-3000:]
    out = json.loads(line[len("RESULT "):])
    short = node[:8]
    # the search: refused before any trial, naming the node
    assert out["search"].startswith(f"--device: node 127.0.0.1 (id {short}) declares 1 GPU but CUDA is not "
                                    "available there: torch.cuda.is_available() is False"), out
    # the rank given that GPU by Ray: the check in its own process says why, and the trial's refusal names the node
    assert out["gpus"] and out["rank"].startswith("torch.cuda.is_available() is False in its process"), out
    line = pool.no_cuda_line("127.0.0.1", node, 1.0, out["rank"])
    assert line.startswith(f"node 127.0.0.1 (id {short}) declares 1 GPU but CUDA is not available there: ")


def test_a_refused_group_is_unscheduled_never_a_crash(tmp_path):
    """pool.Pool.run turns the refusal (Unscheduled) into {"unscheduled": line}; runner.execute stores it as
    status unscheduled (nothing ran: not the configuration's outcome, not served from the store)."""
    from trainscout.trial.status import NOT_MEASURED, Status
    assert Status.UNSCHEDULED in NOT_MEASURED
    assert issubclass(pool.Unscheduled, Exception)
