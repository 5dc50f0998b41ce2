import os

import pytest

# Compiled extensions (DeepSpeed ops, inductor kernels) are cached inside the checkout, ignored by git.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_ROOT, ".cache", "torch_extensions"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_ROOT, ".cache", "inductor"))
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def ray_worker_pids() -> list[int]:
    """PIDs of rank processes (trial.pool) still alive (used to prove none outlives a failed trial)."""
    import psutil
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        name = p.info["name"] or ""
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray::Rank" in name or "ray::Rank" in cmd:
            out.append(p.pid)
    return out


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session (as the CLI starts it: 127.0.0.1, no dashboard)."""
    import ray

    from trainscout.trial.runner import ensure_ray
    ensure_ray()
    yield ray
    ray.shutdown()


@pytest.fixture
def worker_pids():
    return ray_worker_pids
