"""Warm worker groups: a trial's ranks are Ray actors (one process per rank, one placement group per group, so a
group's ranks are scheduled together) with torch.distributed initialised once, kept between trials and handed to
the next trial that needs the same group: same rank count, device and environment.

Ray Train starts a controller and a fresh process per rank for every fit() and has no way to keep them, and that
start-up was most of a trial: on the 2-core CPU box 17-20 s of a tiny trial's wall, of which the steps took 0.1 s
(docs/BENCHMARKS.md). What a knob does to a process is reset or redone by the next trial: process-stage knobs
set their flags every trial (tf32, sdpa_backend), torch.compile's in-memory caches are reset (a reused layer class
would otherwise hit dynamo's recompile limit and fall back to eager), the device's memory is freed and its peaks
reset, and the host's peak RSS is reset (/proc/self/clear_refs). A group is never reused after a failure, a
timeout or a cancel (its processes are killed), and knobs that set environment variables (plan.env) get a group
of their own. TRAINSCOUT_FRESH_WORKERS=1 (or execute(reuse=False)) runs a trial in a group of its own.

The pool is one named actor per Ray job, created by the driver (a search's trials find it by name) on the driver's
node (named_actor), so that a worker node leaving the cluster takes only the trials that ran there (it landed on any
node, whose end crashed every remaining trial); its groups are its children, so they end with the driver. A trial
whose group's node left the cluster is `node_lost`, naming the node (trial.status): dead in the GCS's table, or its
raylet not answering (lost_nodes: a node lost without a word is alive in that table until the GCS's health checks run
out); idle groups there are dropped.

Placement: a group's ranks are packed on one node (placement group STRICT_PACK; one_node=False: PACK, which may
split them over nodes, as inter-node links then slow the trial). Each trial's record says where its ranks ran. A
group the cluster could not place within the placement wait's own limit (--timeout; the trial's time limit starts
when its ranks are placed) is `unscheduled`, not a timeout: nothing of the trial ran.

Shared (a cluster others use: --address), an idle group is given back while anything else there waits for resources
(trial.share.others_wait): idle groups kept their CPUs while another search's trials waited out their limits.
"""
from __future__ import annotations

import asyncio
import os
import time

from .rank import Rank
from .share import NAME, dead_nodes, others_wait

STOP_GRACE_S = 60.0  # a trial asked to stop (Pool.stop) and still running this long after has its group killed
RELEASE_POLL_S = 1.0  # shared: how often an idle group looks whether anything else in the cluster waits


def fresh_requested() -> bool:
    """Whether TRAINSCOUT_FRESH_WORKERS asks for a worker group of its own per trial (set, and not "0")."""
    return os.environ.get("TRAINSCOUT_FRESH_WORKERS", "") not in ("", "0")


_held = {}  # name -> the handle of a named actor this process created: Ray ends the actor with its owner's handle


def named_actor(cls, name: str, *args, **options):
    """The Ray job's actor of this name: found, or created (with args) and held by this process, on its node (not
    soft: no other node's end takes it along). Found first, so that a handle this process holds is never replaced
    (the first owned the actor; dropping it ended the actor: a second search in one process found it dead)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    try:
        return ray.get_actor(name)
    except ValueError:
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        handle = ray.remote(cls).options(name=name, get_if_exists=True, scheduling_strategy=here,
                                         **options).remote(*args)
        _held[name] = handle
        return handle


def pool(shared: bool = False):
    """The job's pool actor (the driver's, if it asks first; the trials of a search find the driver's). shared: the
    cluster is one others use (its creator's say): idle groups are given back while anything else waits."""
    return named_actor(Pool, NAME, shared, num_cpus=0, max_concurrency=1000)


def rank_bundle(cuda: bool) -> dict:
    """What one rank of a group holds: a GPU and a CPU, or half a CPU on a CPU-only run."""
    return {"CPU": 1, "GPU": 1} if cuda else {"CPU": 0.5}


def declared_gpus(node_id: str) -> float:
    """The GPUs a Ray node declares (its GPU resource)."""
    import ray
    return next((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("NodeID") == node_id), 0.0)


def no_cuda_line(address: str, node_id: str, gpus: float, why: str) -> str:
    """The refusal of a trial on a node that declares GPUs without CUDA (its status: unscheduled, with this)."""
    return (f"node {address} (id {node_id[:8]}) declares {gpus:g} GPU{'' if gpus == 1 else 's'} but CUDA is not "
            f"available there: {why}: nothing ran; start that node's Ray without --num-gpus, or install a CUDA build "
            "of torch there")


PROBE_S = 2.0  # how long a node's raylet has to accept a connection, each of PROBE_TRIES times, before it is gone
PROBE_TRIES = 3


def _answers(address: str, port: int) -> bool:
    """Whether a node's raylet accepts a TCP connection (PROBE_TRIES tries): a raylet killed without a word to the GCS
    (SIGKILL, its host gone) stays alive in the GCS's table until its health checks run out, tens of seconds."""
    import socket
    for attempt in range(PROBE_TRIES):
        try:
            socket.create_connection((address, port), timeout=PROBE_S).close()
            return True
        except OSError:
            if attempt + 1 < PROBE_TRIES:
                time.sleep(0.3)
    return False


def lost_nodes(node_ids) -> list[str]:
    """Of node_ids, those gone from the cluster, each as "ADDRESS (id XXXXXXXX)": dead in the GCS's node table, or
    alive there while their raylet accepts no connection. Blocking (a probe may take seconds): off an event loop."""
    import ray
    table = {n["NodeID"]: n for n in ray.nodes()}
    gone = []
    for n in dict.fromkeys(node_ids):
        info = table.get(n) or {}
        port = info.get("NodeManagerPort")
        if not info.get("Alive") or (port and not _answers(info.get("NodeManagerAddress"), port)):
            gone.append(f"{info.get('NodeManagerAddress', '?')} (id {n[:8]})")
    return gone


def lost_in(error: str) -> str | None:
    """The nodes gone from the cluster (lost_nodes) of the actors an error names (an actor's failure: unavailable,
    died), asked of Ray's actor table, and of the nodes it names; None where it names none, or they are alive."""
    from .status import actor_failure
    actors, nodes = actor_failure(error or "")
    if not actors and not nodes:
        return None
    from ray._private.state import state
    for actor in actors:
        try:
            node = (state.actor_table(actor).get("Address") or {}).get("NodeID")
        except Exception:  # noqa: BLE001 - an id Ray does not know (another cluster's, a typo): the others decide
            continue
        if node and node.strip("0"):
            nodes.append(node)
    try:
        return ", ".join(lost_nodes(nodes)) or None
    except Exception:  # noqa: BLE001 - the GCS unreachable for a moment: the error stands as the trial's own
        return None


class Unscheduled(Exception):
    """The cluster did not give a group's placement group in time: why, with what it had free."""


def placement_of(node_ids: list[str]) -> dict:
    """Where a group's ranks run, in rank order: {"nodes": n, "ranks_per_node": [..], "split": n > 1}."""
    order = list(dict.fromkeys(node_ids))
    return {"nodes": len(order), "ranks_per_node": [node_ids.count(n) for n in order], "split": len(order) > 1}


class _Group:
    def __init__(self, key, pg, actors):
        self.key, self.pg, self.actors, self.trials, self.owner = key, pg, actors, 0, None
        self.placement: dict | None = None
        self.nodes, self.placed_at = [], None  # each rank's Ray node; when it was placed (the event loop's clock)

    def kill(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group
        for a in self.actors:
            ray.kill(a, no_restart=True)
        try:
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001 - already gone with the job
            pass


class Pool:
    """Groups by key (rank count, device, environment); idle ones wait for the next trial of their key."""

    def __init__(self, shared: bool = False):
        self.shared, self.released = shared, 0  # a cluster others use; idle groups given back for others
        self._poll: asyncio.Task | None = None
        self.idle: list[_Group] = []
        self.busy: dict[str, _Group] = {}
        self.reports: dict[str, list] = {}
        self.stopping: set[str] = set()
        self.warming: dict[tuple, asyncio.Future] = {}  # groups Pool.warm is starting, by key

    @staticmethod
    def _key(world: int, device: str, env: dict, one_node: bool) -> tuple:
        return world, device, tuple(sorted(env.items())), one_node

    async def warm(self, world: int, device: str, env: dict, one_node: bool, model_config: dict,
                   wait_s: float) -> None:
        """Start a group before its first trial asks for it (a search's driver, while Tune starts its trial actor):
        the ranks' processes, torch.distributed and the model's imports (Rank.preload) are then ready, or under
        way, when the trial comes (run takes the group as it is started). A group that cannot start is left to
        the trial (which says why)."""
        key = self._key(world, device, env, one_node)
        if key in self.warming or any(g.key == key for g in self.idle):
            return
        # kept, another kind of idle group and this one could leave no room for the trial's own Tune actor
        self._free_idle_except(key)
        task = asyncio.ensure_future(self._start(key, world, device == "cuda", env, one_node, wait_s,
                                                 model_config))
        self.warming[key] = task
        try:
            group = await asyncio.shield(task)
        except BaseException:  # noqa: BLE001 - the trial starts its own group and reports its error
            self.warming.pop(key, None)
            return
        if self.warming.pop(key, None) is task:  # not taken by a trial meanwhile: idle until one asks
            self._idle_back(group)

    async def _warmed(self, key, deadline: float):
        """The group Pool.warm is starting for key, taken by the calling trial (None: none, or it failed); a
        group that comes up after the trial gave up is killed."""
        task = self.warming.pop(key, None)
        if task is None:
            return None
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(0.1, deadline - loop.time()))
        except (asyncio.TimeoutError, asyncio.CancelledError):  # nobody else takes it: killed when it is up
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is not None or t.result().kill())
            raise
        except Exception:  # noqa: BLE001 - it could not start: the trial starts its own and reports its error
            return None

    def _drop_warming(self, key) -> None:
        """Stop starting groups of keys other than key (None: all): they hold (or wait for) resources this trial's
        group needs."""
        for k in [k for k in self.warming if k != key]:
            self.warming.pop(k).cancel()

    async def _start(self, key, world: int, cuda: bool, env: dict, one_node: bool, wait_s: float,
                     model_config: dict | None = None, limit: float | None = None) -> _Group:
        """A new group: placed within wait_s (else Unscheduled), then set up (_setup) within limit (the trial's time
        limit, which starts at its placement; None: wait_s), else asyncio.TimeoutError."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        bundle = rank_bundle(cuda)
        pg = placement_group([bundle] * world, strategy="STRICT_PACK" if one_node else "PACK")
        try:
            await asyncio.wait_for(_value(pg.ready()), max(0.1, wait_s))
        except asyncio.CancelledError:  # Pool.warm's group given up (a trial needs another kind)
            remove_placement_group(pg)
            raise
        except asyncio.TimeoutError:
            remove_placement_group(pg)
            free = ray.available_resources()
            have = ", ".join(f"{k} {free.get(k, 0):g}" for k in bundle)
            raise Unscheduled(f"the cluster gave no room for its {world} ranks "
                              f"({', '.join(f'{k} {v:g}' for k, v in bundle.items())} "
                              f"each{', on one node' if one_node else ''}) within {wait_s:.0f} s (free now: {have}): "
                              "other searches or jobs hold the resources; give --max-concurrent a smaller number, or "
                              "run it when the cluster has room") from None
        cls = ray.remote(Rank)
        actors = [cls.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_restarts=0,
                              runtime_env={"env_vars": env},
                              scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                              ).remote() for i in range(world)]
        group = _Group(key, pg, actors)
        group.placed_at = asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(self._setup(group, world, cuda, model_config), max(0.1, limit or wait_s))
        except BaseException:
            group.kill()
            raise
        return group

    @staticmethod
    async def _setup(group: _Group, world: int, cuda: bool, model_config: dict | None) -> None:
        """A placed group's ranks: where they run, torch.distributed set up, the model's imports (Rank.preload)."""
        actors = group.actors
        where = await asyncio.gather(*[a.where.remote() for a in actors])
        port = await actors[0].free_port.remote()
        nodes = {}  # by Ray node: several nodes may share a host (and its address)
        for _, gpus, node in where:
            nodes.setdefault(node, []).extend(gpus)
        group.placement = placement_of([node for _, _, node in where])
        group.nodes = [node for _, _, node in where]
        store = None
        if len({ip for ip, _, _ in where}) == 1:  # one host: through a file (TCPStore binds every interface)
            import tempfile
            import uuid
            store = os.path.join(tempfile.gettempdir(), f"trainscout-rendezvous-{uuid.uuid4().hex}")
        if cuda:  # each rank's GPU checked in its own process before anything is placed on it
            missing = await asyncio.gather(*[a.cuda_missing.remote(sorted(nodes[node], key=int))
                                             for a, (_, _, node) in zip(actors, where)])
            for why, (ip, _, node) in zip(missing, where):
                if why is not None:
                    raise Unscheduled(no_cuda_line(ip, node, declared_gpus(node), why))
        setups = []
        for i, (_, gpus, node) in enumerate(where):
            visible = sorted(nodes[node], key=int) if cuda else []
            same = [j for j, w in enumerate(where) if w[2] == node]  # this node's ranks, in rank order
            local = visible.index(gpus[0]) if cuda and gpus else same.index(i)
            setups.append(actors[i].setup.remote(i, world, where[0][0], port, visible, local, len(same),
                                                 "nccl" if cuda else "gloo", store))
        await asyncio.gather(*setups)
        if model_config is not None:
            await asyncio.gather(*[a.preload.remote(model_config) for a in actors])

    async def run(self, trial_id: str, spec, env: dict, timeout: float, reuse: bool, owner: str | None = None,
                  one_node: bool = True) -> dict:
        """{"ok": {"n_params", "ranks"}, "reused": n, "placement": {...}} | {"error": str} | {"timeout": True} |
        {"unscheduled": why} | {"node_lost": why}. Two limits of `timeout` s: the placement wait's (unscheduled past
        it) and the trial's, from its ranks' placement (a new group's start-up included; a warm group's: from here)."""
        key = self._key(spec.world_size, spec.device, env, one_node)
        self._drop_warming(key if reuse else None)  # a group of its own: none being warmed is for it either
        got = await self._group_for(key, spec, env, timeout, reuse, one_node)
        if isinstance(got, dict):  # no group to run it in: the trial's outcome
            return got
        group, deadline = got
        self.busy[trial_id], group.owner = group, owner
        return await self._run_ranks(trial_id, group, spec, deadline, reuse)

    async def _group_for(self, key, spec, env: dict, timeout: float, reuse: bool, one_node: bool):
        """(the group to run spec's trial in, the trial's deadline on the loop's clock): an idle or warmed group of
        key, else a new one; or, where none could be had, the trial's outcome (run's dict)."""
        from .status import Status, classify, node_lost_line
        loop = asyncio.get_running_loop()
        placed_by = loop.time() + timeout  # the placement wait's own limit
        await self._leaving(key, spec.world_size, spec.device == "cuda", min(placed_by, loop.time() + STOP_GRACE_S))
        self._free_idle_except(key)  # another kind of group holds resources
        group = self._take_idle(key) if reuse else None
        try:
            if group is None and reuse:
                group = await self._warmed(key, placed_by)
            if group is None:
                self._make_room(spec.world_size, spec.device == "cuda")
                group = await self._start(key, spec.world_size, spec.device == "cuda", env, one_node,
                                          placed_by - loop.time() - 0.5, limit=timeout)
                return group, group.placed_at + timeout
            return group, loop.time() + timeout
        except Unscheduled as e:
            return {"unscheduled": str(e)}
        except asyncio.TimeoutError:
            return {"timeout": True}
        except Exception as e:  # noqa: BLE001 - the group could not start (a GPU, a port, its node gone): the trial's error
            if classify(str(e)) == Status.NODE_LOST:
                return {"node_lost": node_lost_line(str(e))}
            if (where := await loop.run_in_executor(None, lost_in, str(e))) is not None:  # before the GCS knows
                return {"node_lost": node_lost_line(str(e), where)}
            return {"error": f"{type(e).__name__}: {e}"}

    async def _run_ranks(self, trial_id: str, group: _Group, spec, deadline: float, reuse: bool) -> dict:
        """The trial run on its group's ranks by the deadline (run's dict); the group kept for the next trial where
        it ended healthy and may be reused, else killed."""
        from .status import Status, classify, node_lost_line
        loop = asyncio.get_running_loop()
        futures = [asyncio.ensure_future(_value(a.run.remote(spec))) for a in group.actors]
        healthy = False
        try:
            done, pending = await asyncio.wait(futures, timeout=max(0.0, deadline - loop.time()),
                                               return_when=asyncio.FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if trial_id not in self.busy:  # cancel() killed the group: the error is the kill, not the trial's
                return {"cancelled": True}
            if failed or pending:  # a node of the group left the cluster: its trial was lost with it (asked of the
                # GCS and of the nodes' raylets: one SIGKILLed is alive in the GCS's table for tens of seconds more)
                lost = await loop.run_in_executor(None, lost_nodes, group.nodes)
                if lost or (failed and classify(str(failed[0].exception())) == Status.NODE_LOST):
                    return {"node_lost": node_lost_line(str(failed[0].exception()) if failed else "",
                                                        ", ".join(lost) or None)}
            if failed:  # one rank's error (its peers may wait in a collective for it)
                e = failed[0].exception()
                return {"error": f"{type(e).__name__}: {e}"}
            if pending:
                return {"timeout": True}
            outs = [f.result() for f in futures]
            healthy = True
            if trial_id in self.stopping:  # left at a step boundary (stop): the group is clean for the next trial
                return {"cancelled": True}
            return {"ok": {"n_params": outs[0]["n_params"], "ranks": [o["rank"] for o in outs]}, "reused": group.trials,
                    "placement": group.placement}
        finally:
            self.stopping.discard(trial_id)
            for f in futures:
                f.cancel()
            if self.busy.pop(trial_id, None) is not None:
                group.trials += 1
                if healthy and reuse:
                    self._idle_back(group)
                else:
                    group.kill()

    def _free_idle_except(self, key) -> None:
        """Kill the idle groups of every key but this one (their resources go back to the cluster)."""
        for g in [g for g in self.idle if g.key != key]:
            self.idle.remove(g)
            g.kill()

    def _take_idle(self, key):  # an idle group of key for a trial; those on a node that left are dropped
        for g in [g for g in self.idle if g.key == key]:
            self.idle.remove(g)
            if not dead_nodes(g.nodes):
                return g
            g.kill()

    def _own_pgs(self) -> set[str]:  # a group's placement group on a lost node waits to be rescheduled
        return {g.pg.id.hex() for g in [*self.idle, *self.busy.values()]}

    def _idle_back(self, group: _Group) -> None:
        """A group whose trial ended well: idle for the next trial of its key; shared: given back at once while
        anything else waits (trial.share.others_wait), and looked at every RELEASE_POLL_S while idle."""
        self.idle.append(group)
        if self.shared:
            self._release()
            if self.idle and (self._poll is None or self._poll.done()):
                self._poll = asyncio.ensure_future(self._poll_idle())

    def _release(self) -> None:
        """Give every idle group back while anything else waits; drop those on a node that left the cluster."""
        try:
            waited = others_wait(self._own_pgs())
            gone = [g for g in self.idle if dead_nodes(g.nodes)]
        except Exception:  # noqa: BLE001 - the GCS unreachable for a moment: look again later
            return
        for g in list(self.idle) if waited else gone:
            self.idle.remove(g)
            self.released += waited
            g.kill()

    async def _poll_idle(self) -> None:
        while self.idle:
            await asyncio.sleep(RELEASE_POLL_S)
            self._release()

    async def _leaving(self, key, world: int, cuda: bool, until: float) -> None:
        """Wait while a trial asked to stop (Pool.stop) is still running its last step, where its group is of this
        key (it will serve this trial) or holds what a new group needs (one GPU box): a group started meanwhile
        would wait for those resources, and the stopped group, idle once its step ends, would hold them."""
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            leaving = [g for t, g in self.busy.items() if t in self.stopping]
            if not leaving or (all(g.key != key for g in leaving) and self._room(world, cuda)):
                return
            await asyncio.sleep(0.1)

    @staticmethod
    def _room(world: int, cuda: bool) -> bool:
        import ray
        free = ray.available_resources()
        return all(free.get(k, 0) >= v * world for k, v in rank_bundle(cuda).items())

    def _make_room(self, world: int, cuda: bool) -> None:
        """Kill idle groups, oldest first, while the cluster lacks what a new group needs (one GPU box: the idle
        group holds the GPU a fresh one needs)."""
        while self.idle and not self._room(world, cuda):
            self.idle.pop(0).kill()

    def cancel(self, trial_id: str | None = None, owner: str | None = None) -> int:
        """Kill the group of a running trial, or of the trials a caller started (a search's trial that ASHA
        stopped: its actor is gone, and owner names it); returns how many."""
        ids = [t for t, g in self.busy.items() if t == trial_id or (owner is not None and g.owner == owner)]
        for t in ids:
            self.busy.pop(t).kill()
        return len(ids)

    def stop(self, owner: str | None = None, trial_id: str | None = None) -> int:
        """Ask the running trials a caller started (a search's trial that ASHA stopped), or one trial, to leave at
        their next step boundary: the ranks end their trial as after its last step and the group is kept for the
        next trial (a killed group costs the next trial a fresh start: ~20 s on the H200). A trial still running
        STOP_GRACE_S later has its group killed. Returns how many."""
        ids = [t for t, g in self.busy.items() if t == trial_id or (owner is not None and g.owner == owner)]
        loop = asyncio.get_running_loop()
        for t in ids:
            self.stopping.add(t)
            loop.call_later(STOP_GRACE_S, self.cancel, t)
        return len(ids)

    def stopped(self, trial_id: str) -> bool:
        return trial_id in self.stopping

    def report(self, trial_id: str, item: dict) -> None:
        self.reports.setdefault(trial_id, []).append(item)

    def take(self, trial_id: str) -> list:
        """The reports since the last take."""
        return self.reports.pop(trial_id, [])


async def _value(ref):
    return await ref
