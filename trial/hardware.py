"""What a measurement was taken on: the hardware fingerprint and the library versions."""
from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version

LIBRARIES = ("torch", "transformers", "deepspeed", "ray", "optuna", "trainscout")


def versions() -> dict[str, str | None]:
    """Versions of Python, of the LIBRARIES a result depends on and of the optional packages knobs name
    (Runtime.packages: torchao, liger_kernel, ...: a contribution's knobs are checked against them, store/contrib.py);
    None for one not installed."""
    from trainscout.spaces import all_knobs
    out = {"python": platform.python_version()}
    for lib in (*LIBRARIES, *sorted({p for k in all_knobs() for p in k.runtime.packages} - set(LIBRARIES))):
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = None
    return out


def fingerprint(device: str, world_size: int) -> dict:
    """The box a trial ran on, as stored with every result (GPU name and count, or CPU model and cores)."""
    import torch
    hw = {"device": device, "world_size": world_size, "cpu": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count()}
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        hw.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count(),
                  cuda=torch.version.cuda, capability=f"{p.major}.{p.minor}")
    return hw


def installed_optional() -> frozenset:
    """The optional packages knobs name (Runtime.packages) that are importable here."""
    from trainscout.runtime import installed_packages
    return installed_packages()


MOCK_GPU_ENV = "TRAINSCOUT_MOCK_GPU"  # tests only: a mock of a GPU on a Ray node ("NAME,MEMORY_GIB,CAPABILITY")
_READ = ("import json, torch; from trainscout.trial.hardware import fingerprint; "
         "print(json.dumps(fingerprint('cuda' if torch.cuda.is_available() else 'cpu', 1)))")


def node_facts(gpus: bool = True) -> dict:
    """The fingerprint of the node this runs on (a Ray task placed there by search.cluster): its GPU kind, memory
    and capability (or its CPU), host name and memory. Read in a child process without CUDA_VISIBLE_DEVICES, which
    Ray narrows to a task's own GPUs (none for this task), with the same fingerprint() a local search takes, so a
    measurement's key is the same whichever way it was reached. TRAINSCOUT_MOCK_GPU (tests: a mock of a GPU, where
    none can run) stands in for the GPU."""
    import json
    import socket
    import subprocess
    import sys

    import psutil
    mock = os.environ.get(MOCK_GPU_ENV)
    if mock and gpus:
        name, mem, cap = mock.split(",")
        hw = {"device": "cuda", "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
              "gpu": name, "gpu_memory_gib": float(mem), "cuda": "mock", "capability": cap}
    elif not gpus:
        hw = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}
    else:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        out = subprocess.run([sys.executable, "-c", _READ], env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"reading the node's hardware failed: {(out.stderr or out.stdout).strip()[-500:]}")
        hw = json.loads(out.stdout.strip().splitlines()[-1])
    hw.pop("world_size", None)
    hw.pop("gpu_count", None)  # what trials may use of it is the node's Ray GPU resource (search.cluster)
    return dict(hw, host=socket.gethostname(), memory_bytes=psutil.virtual_memory().total)
