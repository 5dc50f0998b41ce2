"""Where a transformers model keeps its decoder layers: what the knobs' model transforms wrap and compile."""
from __future__ import annotations


def _unwrapped(module):
    """A layer without trainscout's wrappers (activation checkpointing, per-layer compile)."""
    for attr in ("_checkpoint_wrapped_module", "_orig_mod"):
        while hasattr(module, attr):
            module = getattr(module, attr)
    return module


def decoder_layers(model):
    """The ModuleList holding the model's decoder layers (the classes transformers marks as not splittable)."""
    from torch import nn
    names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and type(_unwrapped(module[0])).__name__ in names:
            return module
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no ModuleList of {sorted(names)})")
