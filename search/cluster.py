"""A search on a Ray cluster: the hardware of the nodes that will run its trials, read on those nodes, and how many
trials it runs at once.

The driver's host used to decide the hardware: `--device cuda` was refused on a head without a GPU ("no CUDA GPU
is visible") although the workers had GPUs, so the cloud template's CPU head could not run a GPU search. Attached
to a cluster (--address or RAY_ADDRESS), a search now reads each node that could run its trials with a small Ray
task placed on it (trial.hardware.node_facts): device, GPU kind, memory and capability, and takes the GPU count
per node from the node's Ray resources (what trials can be given). Nodes of different kinds are an error that
names them: a search measures one kind of node (one measurement key, one memory model); run one search per kind.

Concurrency: a search that started its own Ray owns it and sizes itself to all of it, as before. Attached to a
cluster others may use, it takes a fair share when it starts: what the cluster has free, and no more than its
total divided among the searches attached (their worker pools, this one's included: trial.share.attached), at
least one trial; or --max-concurrent. Each took all that was free (two started together: 5 at once each on a
4-CPU cluster, both waiting on the other's idle groups). Each Tune trial holds TRIAL_CPU, not a whole CPU: on a
4-CPU cluster two searches' Tune actors held every CPU and all their trials timed out waiting for their ranks.
"""
from __future__ import annotations

import math

from trainscout.spaces import ConfigError

TRIAL_CPU = 0.25  # a search's Tune trial actor: it prepares the trial and waits for the ranks, which hold the rest
RANK_CPU = 0.5  # a CPU trial's rank (trial.pool.rank_bundle); a GPU rank holds 1 CPU and 1 GPU
PROBE_S = 120.0  # a node whose probe has not answered by then (its raylet gone, its workers not starting) is named


def _nodes() -> list[dict]:
    import ray
    return [n for n in ray.nodes() if n.get("Alive")]


def _name(n: dict) -> str:
    """A node as the errors name it: its address and the start of its Ray node id (one host may run several)."""
    return f"{n.get('NodeManagerAddress', n.get('address'))} ({n.get('NodeID', n.get('node_id', ''))[:8]})"


def probe(nodes: list[dict], gpus: bool) -> list[dict]:
    """node_facts() of each node, read on it (a task pinned to the node, holding no resources, so that a busy
    node answers too), with the node's id, address and Ray resources."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainscout.trial.hardware import node_facts
    task = ray.remote(node_facts)
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(gpus) for n in nodes]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)
    if pending:
        late = ", ".join(_name(n) for n, r in zip(nodes, refs) if r in pending)
        raise ConfigError("--address", f"node {late} did not say what hardware it has within {PROBE_S:.0f} s: "
                                       "check that its Ray node runs (ray status), or remove it from the cluster")
    return [dict(f, node_id=n["NodeID"], address=n["NodeManagerAddress"], resources=n["Resources"])
            for n, f in zip(nodes, ray.get(refs))]


def _kind(f: dict, cuda: bool) -> tuple:
    return (f.get("gpu"), f.get("gpu_memory_gib"), f.get("capability")) if cuda else (f.get("cpu"), f.get("cpu_count"))


def _describe(f: dict, cuda: bool) -> str:
    if cuda:
        return f"{int(f['resources'].get('GPU', 0))} x {f.get('gpu')} ({f.get('gpu_memory_gib')} GiB)"
    return f"{f.get('cpu')}, {f.get('cpu_count')} cores"


def hardware_of(facts: list[dict], device: str, ranks: int, one_node: bool, address: str) -> dict:
    """The search's hardware fingerprint from the facts of the nodes that would run its trials: as
    trial.hardware.fingerprint returns it, with gpu_count the GPUs a trial can be given (one node's, or the
    cluster's with one_node False), nodes, and host_memory_gib (the smallest). ConfigError when the nodes differ
    (naming them) or cannot hold a trial's ranks."""
    cuda = device == "cuda"
    kinds: dict[tuple, list[dict]] = {}
    for f in facts:
        kinds.setdefault(_kind(f, cuda), []).append(f)
    if len(kinds) > 1:
        groups = "; ".join(f"{_describe(fs[0], cuda)} on {', '.join(_name(f) for f in fs)}" for fs in kinds.values())
        raise ConfigError("--address", f"the nodes of the cluster at {address} that would run trials differ: {groups}: "
                                       "a search measures one kind of node: run one search per kind, each on a "
                                       "cluster (or Ray job) of that kind")
    per_node = [int(f["resources"].get("GPU", 0)) if cuda else int(f["resources"].get("CPU", 0) // RANK_CPU)
                for f in facts]
    unit = "GPUs" if cuda else "rank slots (half a CPU each)"
    flag = "--gpus-per-trial"
    if one_node and max(per_node) < ranks:
        raise ConfigError(flag, f"{flag} {ranks} needs {ranks} {unit} on one node (--one-node, the default) but the "
                                f"cluster's nodes have at most {max(per_node)}: use {flag} {max(per_node)} or fewer, "
                                "or --no-one-node to split a trial over nodes (its links then slow it: its record "
                                "says so)")
    if sum(per_node) < ranks:
        raise ConfigError(flag, f"{flag} {ranks} needs {ranks} {unit} but the cluster has {sum(per_node)}: use {flag} "
                                f"{sum(per_node)} or fewer")
    first = facts[0]
    hw = {k: first[k] for k in ("device", "cpu", "cpu_count", "gpu", "gpu_memory_gib", "cuda", "capability")
          if first.get(k) is not None}
    hw.update(device=device, world_size=ranks, nodes=len(facts),
              host_memory_gib=round(min(f["memory_bytes"] for f in facts) / 2**30, 1))
    if cuda:
        hw["gpu_count"] = max(per_node) if one_node else sum(per_node)
    return hw


def cluster_hardware(address: str, device: str, ranks: int, one_node: bool, flag: str = "--address") -> dict:
    """Attach to the cluster (trial.ray_cluster.ensure_ray) and read the hardware of the nodes that would run a search's
    trials: GPU nodes for cuda (auto: cuda where any node has a GPU), nodes with a CPU for a rank for cpu."""
    from trainscout.trial.ray_cluster import ensure_ray
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("--device", f"--device {device} is not allowed: use auto, cpu or cuda")
    ensure_ray(address if flag == "--address" else None)  # None: it reads RAY_ADDRESS itself, and names it
    nodes = _nodes()
    gpu_nodes = [n for n in nodes if n["Resources"].get("GPU", 0) >= 1]
    if device == "auto":
        device = "cuda" if gpu_nodes else "cpu"
    if device == "cuda" and not gpu_nodes:
        cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
        raise ConfigError("--device", f"--device cuda but no node of the cluster at {address} has a GPU ({len(nodes)} "
                                      f"nodes, {cpus:g} CPUs): use --device cpu, or add GPU nodes")
    trial_nodes = gpu_nodes if device == "cuda" else [n for n in nodes if n["Resources"].get("CPU", 0) >= RANK_CPU]
    if not trial_nodes:
        raise ConfigError(flag, f"{flag} {address}: no node of the cluster has a CPU for a trial's ranks: add one")
    facts = probe(trial_nodes, device == "cuda")
    if device == "cuda":
        check_cuda(facts)
    return hardware_of(facts, device, ranks, one_node, address)


def check_cuda(facts: list[dict]) -> None:
    """ConfigError naming the first node that declares a GPU (its Ray GPU resource) but whose probe found no CUDA
    there (torch.cuda.is_available() False: its facts are a CPU's). Such a node was accepted: its trials crashed in
    NCCL and their crash was stored as the configuration's outcome (issue 50, item 4)."""
    from trainscout.trial.pool import no_cuda_line
    for f in facts:
        if f.get("device") != "cuda" or not f.get("gpu"):
            raise ConfigError("--device", no_cuda_line(f["address"], f["node_id"], f["resources"].get("GPU", 0),
                                                       "torch.cuda.is_available() is False on it (read by a task "
                                                       "placed there)"))


def per_trial(cuda: bool, ranks: int) -> dict:
    """What one trial holds while it runs: its Tune actor and its ranks (trial.pool.rank_bundle)."""
    return {"CPU": TRIAL_CPU + ranks * (1 if cuda else RANK_CPU), **({"GPU": float(ranks)} if cuda else {})}


def _fit(resources: dict, need: dict) -> int:
    return min(int(math.floor(resources.get(k, 0) / v + 1e-9)) for k, v in need.items())


def concurrency(hw: dict, ranks: int, requested: int | None, attached: bool) -> tuple[int, str]:
    """How many trials run at once, and why (printed on the start line)."""
    import ray
    cuda = hw["device"] == "cuda"
    if requested:
        return requested, "--max-concurrent"
    total = ray.cluster_resources()
    if not attached:  # its own Ray: all of it (the Tune actor counted as a CPU, the ranks' threads need the rest)
        n = int(total.get("GPU", 0)) // ranks if cuda else int(total.get("CPU", 1)) // (1 + ranks)
        return max(1, n), "what this machine holds"
    from trainscout.trial.share import attached as searches
    need = per_trial(cuda, ranks)
    free = _fit(ray.available_resources(), need)
    k = max(1, searches())  # this search's pool counts (the driver asked for it before)
    share = _fit({r: v / k for r, v in total.items()}, need)
    n = max(1, min(share, free))
    why = "the cluster has no room free now: trials wait for it" if free < 1 else "what the cluster has free now"
    fair = f", within a fair share of its room among the {k} searches attached" if k > 1 else ""
    return n, f"{why}{fair}; others may use it: --max-concurrent N to choose"
