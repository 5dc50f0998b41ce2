"""What a measurement was taken on: the hardware fingerprint and the library versions."""
from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version

LIBRARIES = ("torch", "transformers", "deepspeed", "ray", "optuna", "trainscout")


def versions() -> dict[str, str | None]:
    """Versions of Python, of the LIBRARIES a result depends on and of the optional packages knobs name
    (Knob.packages: torchao, liger_kernel, ...: a contribution's knobs are checked against them, store/contrib.py);
    None for one not installed."""
    from trainscout.spaces import all_knobs
    out = {"python": platform.python_version()}
    for lib in (*LIBRARIES, *sorted({p for k in all_knobs() for p in k.packages} - set(LIBRARIES))):
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
    """The optional packages knobs name (Knob.packages) that are importable here."""
    from trainscout.runtime import installed_packages
    return installed_packages()
