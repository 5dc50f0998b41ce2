"""A real multi-node Ray cluster for the tests, in a process of its own: Ray's own multi-node test cluster
(ray.cluster_utils.Cluster, several raylets on this host), every node bound to 127.0.0.1 (Ray's one-machine mode,
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0). Run as `python tests/raycluster.py`: it prints one JSON line (the GCS
address and the nodes), then serves commands on stdin, one per line:

    block NODE_ID CPUS    an actor of this process holding CPUS of that node (another job using the cluster)
    unblock               end every such actor
    add CPUS [GPUS]       a new CPU node (answer: its node id); GPUS: it also declares that many `GPU` resources
                          and has no mock of them (a node that declares GPUs it has not)
    kill NODE_ID          remove a node this process added (cluster.remove_node: its raylet and processes end, as
                          a node that fails or is preempted; answer: killed)
    sigkill NODE_ID       SIGKILL the raylet of a node this process added and the worker processes it started (its
                          children), by their PIDs: a node lost at once, without a word to the GCS (its workers would
                          otherwise run on for seconds; answer: killed N, the processes); its other processes
                          then end too (cluster.remove_node), which tells the GCS nothing
    lost NODE_ID          what the GCS's node table says of a node, and whether trial.pool.lost_nodes names it
                          (answer: JSON {"alive_in_gcs": bool, "lost": [...]})
    ranks NODE_ID SECONDS wait until a trial's rank (trial.pool.Rank actor) is alive on that node (answer: busy, or
                          none after SECONDS)
    where NAME            the nodes of the alive named actors NAME of every job (answer: JSON list of node ids)
    pending SECONDS       wait until a placement group waits for resources (answer: pending, or none after SECONDS)
    want CPUS SECONDS     a placement group of one bundle of CPUS (another job asking for room), removed after
                          (answer: placed S, the seconds it waited, or waiting after SECONDS)

and answers each with one line. End of stdin (or SIGTERM) shuts the cluster down with its own shutdown(), which
ends the processes it started (never Ray's `ray stop`, which kills every Ray process of the machine by name).

The nodes: a head with no CPU (a driver's node that runs no trial, as a cloud template's head), two CPU nodes
(2 CPUs each), and one node with a mock of a GPU: 2 `GPU` resources and TRAINSCOUT_MOCK_GPU in its processes'
environment (trial.hardware.node_facts reads it in place of a real GPU, which this box has not), no CPU.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

MOCK_GPU = "Mock H200 (a mock of a GPU),139.8,9.0"


def main() -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # stdout carries the answers only: what Ray prints there (a raylet's death) goes to stderr
    answer, sys.stdout = sys.stdout, sys.stderr
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    common = dict(node_ip_address="127.0.0.1", object_store_memory=80 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **common))

    def stop(*_):
        cluster.shutdown()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    cpu = [cluster.add_node(num_cpus=2, **common) for _ in range(2)]
    gpu = cluster.add_node(num_cpus=0, num_gpus=2, env_vars={"TRAINSCOUT_MOCK_GPU": MOCK_GPU}, **common)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    print(json.dumps({"address": cluster.address, "head": cluster.head_node.node_id,
                      "cpu_nodes": [n.node_id for n in cpu], "gpu_node": gpu.node_id,
                      "session_dir": cluster.head_node.get_session_dir_path()}), file=answer, flush=True)

    @ray.remote
    class Blocker:
        def ready(self):
            return True

    from ray._private.state import state
    added = {}

    def alive_actors():
        return [a for a in state.actor_table(None).values() if a["State"] == "ALIVE"]

    blockers = []
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["block"]:
            b = Blocker.options(num_cpus=float(words[2]), scheduling_strategy=NodeAffinitySchedulingStrategy(
                words[1], soft=False)).remote()
            ray.get(b.ready.remote(), timeout=60)
            blockers.append(b)
            print("blocked", file=answer, flush=True)
        elif words[:1] == ["unblock"]:
            held = len(blockers)
            before = ray.available_resources().get("CPU", 0)
            for b in blockers:
                ray.kill(b)
            blockers.clear()
            deadline = time.time() + 30  # the raylets free a killed actor's CPUs a moment later
            while held and ray.available_resources().get("CPU", 0) <= before and time.time() < deadline:
                time.sleep(0.2)
            print("unblocked", file=answer, flush=True)
        elif words[:1] == ["add"]:
            gpus = {"num_gpus": float(words[2])} if words[2:] else {}
            node = cluster.add_node(num_cpus=float(words[1]), **gpus, **common)
            cluster.wait_for_nodes()
            added[node.node_id] = node
            print(node.node_id, file=answer, flush=True)
        elif words[:1] == ["kill"]:
            cluster.remove_node(added.pop(words[1]))
            print("killed", file=answer, flush=True)
        elif words[:1] == ["sigkill"]:
            import psutil
            node = added.pop(words[1])
            raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
            doomed = [raylet, *raylet.children(recursive=True)]
            for proc in doomed:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            # its other processes (log monitor, ...) reaped, and the node out of the cluster's list: a later `add`
            # waits for the nodes listed to be alive
            cluster.remove_node(node, allow_graceful=False)
            print(f"killed {len(doomed)}", file=answer, flush=True)
        elif words[:1] == ["lost"]:
            from trainscout.trial.pool import lost_nodes
            alive = any(n["NodeID"] == words[1] and n["Alive"] for n in ray.nodes())
            print(json.dumps({"alive_in_gcs": alive, "lost": lost_nodes([words[1]])}), file=answer, flush=True)
        elif words[:1] == ["ranks"]:
            deadline = time.time() + float(words[2])
            while not any(a["ActorClassName"] == "Rank" and a["Address"]["NodeID"] == words[1] for a in alive_actors()):
                if time.time() > deadline:
                    break
                time.sleep(0.2)
            else:
                print("busy", file=answer, flush=True)
                continue
            print("none", file=answer, flush=True)
        elif words[:1] == ["pending"]:
            deadline = time.time() + float(words[1])
            while not any(pg["state"] == "PENDING" for pg in state.placement_group_table().values()):
                if time.time() > deadline:
                    print("none", file=answer, flush=True)
                    break
                time.sleep(0.2)
            else:
                print("pending", file=answer, flush=True)
        elif words[:1] == ["want"]:
            from ray.util.placement_group import placement_group, remove_placement_group
            t0 = time.time()
            pg = placement_group([{"CPU": float(words[1])}])
            ready, _ = ray.wait([pg.ready()], timeout=float(words[2]))
            print(f"placed {time.time() - t0:.1f}" if ready else "waiting", file=answer, flush=True)
            remove_placement_group(pg)
        elif words[:1] == ["where"]:
            print(json.dumps([a["Address"]["NodeID"] for a in alive_actors() if a["Name"] == words[1]]), file=answer,
                  flush=True)
    ray.shutdown()
    stop()


if __name__ == "__main__":
    main()
