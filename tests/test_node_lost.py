"""A worker node lost without a word: its raylet SIGKILLed while a search's trial runs there (a real multi-node Ray
cluster on 127.0.0.1, tests/raycluster.py; a real `trainscout search` on the CPU tiny model, Ray Tune, Optuna, gloo).
The GCS learns of such a death only from its health checks, seconds later; before it does, the calls to the node's
actors fail with `ActorUnavailableError ... Socket closed`, which says nothing of a node. The trial is `node_lost` all
the same, naming the node, asked of Ray (the actor's node, whether it is alive and its raylet answers), not read from
the text: never `crash`, counted toward --trials, nor measured as the configuration's."""
import json
import os
import sys
import time

import pytest

from trainscout.store import Store, default_url

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cluster_share import rows, search, start  # one search command for the cluster tests

pytestmark = pytest.mark.timeout(600)


def started(out) -> bool:
    """Whether a rank of the search started a trial (its log, opened first)."""
    return bool(list(out.glob("trials/*/logs/rank0.log")))


def test_a_trial_whose_nodes_raylet_is_sigkilled_is_node_lost_naming_it(ray_cluster, tmp_path):
    """Both CPU nodes held by another job, a new node of 2 CPUs takes the search's first trial (its Tune actor and its
    rank; one trial at a time); that node's raylet is SIGKILLed once its rank started the trial (with
    the worker processes it started: they would run on for seconds), and the other nodes
    freed. While the GCS still lists the node alive, trial.pool.lost_nodes names it. The trial ends node_lost, its one
    line naming the node; nothing stored for it, not counted: --trials 1 measures one on the other nodes, exit 0."""
    send = ray_cluster["send"]
    out = tmp_path / "sigkill"
    node = send("add 2")
    killed = False
    try:
        for n in ray_cluster["cpu_nodes"]:
            assert send(f"block {n} 2") == "blocked"
        p = start(search(ray_cluster["address"], out, "--trials", 1, "--max-concurrent", 1))
        assert send(f"ranks {node} 120") == "busy", p.communicate(timeout=60)
        deadline = time.time() + 120  # its rank started the trial: the log it opens first
        while not started(out) and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert started(out), p.communicate(timeout=60)
        answer = send(f"sigkill {node}")
        assert answer.startswith("killed "), answer
        killed, t_kill = True, time.time()
        seen = json.loads(send(f"lost {node}"))
        assert send("unblock") == "unblocked"
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if not killed:
            send(f"kill {node}")
        send("unblock")
    print(f"a node's raylet SIGKILLed mid-trial: the GCS listed it alive just after: {seen['alive_in_gcs']}; the "
          f"search ended {time.time() - t_kill:.1f} s after the kill")
    assert seen["lost"] == [f"127.0.0.1 (id {node[:8]})"], seen
    assert p.returncode == 0, f"exit {p.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    trials = rows(out)
    got = [(t["status"], t["error"]) for t in trials]
    lost = [t for t in trials if t["status"] == "node_lost"]
    assert lost and not [t for t in trials if t["status"] == "crash"], got
    for t in lost:  # one line naming the node, and no measurement behind it
        assert f"lost with its node 127.0.0.1 (id {node[:8]})" in t["error"] and "\n" not in t["error"], t["error"]
        assert t["key"] is None
    from trainscout.search.trainable import counted
    assert counted(trials) == 1 and len(trials) == 1 + len(lost) and trials[-1]["status"] == "ok", got
    assert f"(id {node[:8]})" in stdout and "node_lost" in stdout, stdout[-3000:]  # the live table's row
    stored = Store(default_url(str(out))).measurements()
    assert [m.key for m in stored] == [trials[-1]["key"]], [(m.status, m.error) for m in stored]


@pytest.mark.parametrize("end", ["node_lost", "actor_error", "ok"])
def test_a_trial_lost_with_its_node_sets_no_bar(end):
    """ASHA (make_scheduler's) forgets the rung values of a trial lost with its node (node_lost), or whose own actor
    failed (Tune's on_trial_error): its steps ran on a node that was going. The control: an ok trial's stop the
    slower one at the rung."""
    from ray.tune.experiment import Trial

    from trainscout.search.searcher import make_scheduler
    from trainscout.search.trainable import METRIC
    asha = make_scheduler(6)
    fast, slow = Trial("x", stub=True, trial_id="fast"), Trial("x", stub=True, trial_id="slow")
    for t in (fast, slow):
        asha.on_trial_add(None, t)
    for it in (1, 2, 3):
        asha.on_trial_result(None, fast, {"training_iteration": it, METRIC: 100.0})
    if end == "actor_error":
        asha.on_trial_error(None, fast)
    else:
        asha.on_trial_complete(None, fast, {"training_iteration": 7, METRIC: 0.0 if end == "node_lost" else 100.0,
                                            "status": end})
    got = [asha.on_trial_result(None, slow, {"training_iteration": it, METRIC: 60.0}) for it in (1, 2, 3)]
    assert got == (["CONTINUE", "STOP", "CONTINUE"] if end == "ok" else ["CONTINUE"] * 3), got


def test_an_actors_failure_names_its_actors_and_nodes():
    """The ids an actor's failure names, for Ray to say whether their nodes are gone; none in any other error."""
    from trainscout.trial.status import actor_failure
    actor, node = "60faff82198177b51fd28b8102000000", "ab" * 28
    assert actor_failure(f"ray.exceptions.ActorUnavailableError: The actor {actor} is unavailable: The actor is "
                         "temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14.") == ([actor], [])
    assert actor_failure(f"ActorDiedError: The actor died unexpectedly before finishing this task.\n\tactor_id: {actor}"
                         f"\n\tnode_id: {node}") == ([actor], [node])
    assert actor_failure(f"ValueError: bad value {actor}") == ([], [])
