"""A cluster that other searches and jobs use: how many searches are attached (their pools), which nodes left it,
and whether anything waits for its resources (trial.pool gives idle groups back then; search.cluster sizes a
search's share by the searches attached)."""
from __future__ import annotations

NAME = "trainscout-worker-pool"  # the named actor of each Ray job's worker pool (trial.pool.NAME)


def attached() -> int:
    """How many searches (and single trials) are attached to the cluster now: the pools of its Ray jobs (one per
    driver, this one's included once it has asked for its pool)."""
    import ray
    return sum(1 for a in ray.util.list_named_actors(all_namespaces=True) if a.get("name") == NAME)


def dead_nodes(node_ids) -> list[str]:
    """Of node_ids, those no longer alive in the cluster, each as "ADDRESS (id XXXXXXXX)"."""
    import ray
    alive = {n["NodeID"]: n for n in ray.nodes()}
    return [f"{(alive.get(n) or {}).get('NodeManagerAddress', '?')} (id {n[:8]})" for n in dict.fromkeys(node_ids)
            if not (alive.get(n) or {}).get("Alive")]


def others_wait(own_pgs: set[str] = frozenset()) -> bool:
    """Whether anything in the cluster waits for resources that a node of it could give (Ray's pending demand, as the
    autoscaler reads it from the GCS: placement groups other than own_pgs, by hex id, and tasks or actors; the
    placement-group table where that answer is not available). Left out: a request no node could ever hold
    (infeasible: giving groups back would not help it) and one waiting inside a placement group (for its own group's
    bundle: `*_group_*` resources)."""
    import ray
    totals = [n["Resources"] for n in ray.nodes() if n.get("Alive")]

    def could_run(bundle: dict) -> bool:
        return not any("_group_" in k for k in bundle) and any(all(t.get(k, 0) >= v for k, v in bundle.items())
                                                             for t in totals)
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status
        demand = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
        waiting = [*demand.ray_task_actor_demand, *(d for d in demand.placement_group_demand if d.pg_id not in own_pgs)]
        return any(could_run(r.bundle) for d in waiting for r in d.bundles_by_count)
    except Exception:  # noqa: BLE001 - an older or trimmed Ray: its placement groups alone
        from ray._private.state import state
        return any(pg["state"] in ("PENDING", "RESCHEDULING") and pid not in own_pgs
                   and any(could_run(b) for b in pg["bundles"].values())
                   for pid, pg in state.placement_group_table().items())
