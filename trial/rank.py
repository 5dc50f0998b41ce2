"""The processes of a warm worker group: one Rank actor per rank (torch.distributed set up once, a trial run and
the process reset after it), and the Progress handle a trial's rank 0 reports its steps through (trial.pool)."""
from __future__ import annotations

import os


class Rank:
    """One rank's process: torch.distributed set up once, then one trial after another (trial.worker)."""

    def where(self) -> tuple[str, list, str]:
        import ray
        return (ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()],
                ray.get_runtime_context().get_node_id())

    def cuda_missing(self, visible: list) -> str | None:
        """Why this rank, given GPUs by Ray, cannot use them (CUDA not available in its process, no device), or None:
        read with the group's CUDA_VISIBLE_DEVICES set first (as setup sets it), before any CUDA use. A node whose
        Ray declares a GPU it does not have (ray start --num-gpus 1 on a CPU box) would crash the trial in NCCL and
        store the crash as the configuration's outcome (docs/trial.md)."""
        if visible:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        try:
            import torch
            if not torch.cuda.is_available():
                return (f"torch.cuda.is_available() is False in its process (torch {torch.__version__}, "
                        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})")
            name = torch.cuda.get_device_name(0)
            return None if name else "torch.cuda.get_device_name(0) names no device"
        except Exception as e:  # noqa: BLE001 - a broken driver, no device: said, never run
            return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]

    def free_port(self) -> int:
        import socket
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def setup(self, rank: int, world: int, master: str, port: int, visible: list, local: int, local_world: int,
              backend: str, store: str | None) -> None:
        from datetime import timedelta

        import torch.distributed as dist
        if visible:  # the node's GPUs of this group, as Ray Train shares them: NCCL wants to see its peers
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        self.rank, self.world, self.local = rank, world, local
        # what torchrun (and Ray Train) set: DeepSpeed and others read them
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local), MASTER_ADDR=master,
                          MASTER_PORT=str(port), LOCAL_WORLD_SIZE=str(local_world))
        # one node: the rendezvous goes through a file (torch's TCPStore would listen on every interface)
        dist.init_process_group(backend, init_method=f"file://{store}" if store else f"tcp://{master}:{port}",
                                rank=rank, world_size=world, timeout=timedelta(seconds=600))

    def preload(self, model_config: dict) -> None:
        """Import what a trial of this model runs (the worker, transformers' modelling code) and build the model
        once on the meta device: a group warmed before its first trial (Pool.warm) has done it meanwhile."""
        from . import worker
        from trainscout.predictor.model_tree import parameters
        parameters(model_config)
        worker.collect()

    def run(self, spec) -> dict:
        """A trial on this rank, then reset_process(); the result says how long this call took (span_s: the
        caller's wall less it is Ray's and the pool's hand-off) and the reset in it (reset_s)."""
        import time

        from .worker import reset_process, train_loop
        t0 = time.perf_counter()
        try:
            out = train_loop(spec, self.rank, self.world, self.local)
        finally:
            t_reset = time.perf_counter()
            reset_process()
        t_end = time.perf_counter()
        out["rank"].update(reset_s=t_end - t_reset, span_s=t_end - t0)
        return out


class Progress:
    """A trial's per-step reports, rank 0 -> the pool -> the trial's caller (runner._wait takes them)."""

    def __init__(self, handle, trial_id: str):
        self.handle, self.trial_id = handle, trial_id

    def put(self, item: dict) -> None:
        self.handle.report.remote(self.trial_id, item)

    def stopped(self) -> bool:
        """Whether the trial's caller asked it to stop at its next step boundary (Pool.stop)."""
        import ray
        return ray.get(self.handle.stopped.remote(self.trial_id))
