"""What a model holds, read from its module tree built on the meta device (no memory is allocated, no weights made).

`parameters(config)` counts the built model's parameters: all of them, the largest decoder layer's, the
embedding's, the LM head's own (none when tied to the embedding) and the linears' (what autocast copies to 16 bits).
Building on the meta device takes a fraction of a second (docs/predictor.md); it is done once per config and
process.

`saved(config, attention, compute)` runs a training forward of the whole model on the meta device and sums the
bytes autograd saves for backward (distinct storages, through torch.autograd.graph.saved_tensors_hooks), per
decoder layer and outside the layers, at two sequence lengths: that gives the bytes per token and the bytes per
token per sequence position (eager attention's s x s scores), which scale to any micro-batch and sequence length.
Parameters, buffers and autocast's copies of the weights are left out: the memory model counts them as weights.

The meta device runs no kernels, so what a CUDA GPU does (autocast, SDPA's fused kernels) is done by hand there
(predictor/cuda_like.py); the saved bytes are counted by predictor/saved_bytes.py.

`saved(..., compiled=scope)` traces a decoder layer's forward and backward with AOTAutograd on the meta device and
counts what inductor's min-cut partitioner hands from one to the other (predictor/partitioned.py).
"""
from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, replace

from .partitioned import partitioned
from .saved_bytes import BATCH, SEQS, Saved, count_saved, formula_saved

__all__ = ["BATCH", "SEQS", "FACTS", "Params", "Saved", "config_key", "count_saved", "known", "learn", "memo",
           "meta_model", "parameters", "saved"]


@dataclass(frozen=True)
class Params:
    """A model's parameter counts, read from its modules."""

    N: int          # every parameter once (a tied head shares the embedding's)
    layers: int     # decoder layers
    per_layer: int  # the largest decoder layer's parameters
    embed: int      # the input embedding's
    head: int       # the LM head's own (0 when it is tied to the embedding)
    tied: bool      # the head's weight is the embedding's
    cast: int       # parameters of the linears (the head's too, tied or not): what autocast copies to 16 bits


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=repr)


# What the meta-device model told (Params, Saved, flops.Count), by (kind, config key, arguments): worked out once per
# process, or handed over by whoever worked it out (a search's driver to its trial actors, through `known` and
# `learn`: an actor then neither imports transformers' models nor builds one to predict a trial's memory, seconds
# of each actor's first trial). Only the meta device is read, so the same torch and transformers give the same
# facts in every process.
FACTS: dict[tuple, object] = {}


def memo(kind: str):
    """Cache a function of strings in FACTS under kind (functools.lru_cache, but its entries can be handed on)."""
    def wrap(fn):
        @functools.wraps(fn)
        def cached(*args):
            at = (kind, *args)
            if at not in FACTS:
                FACTS[at] = fn(*args)
            return FACTS[at]
        return cached
    return wrap


def known() -> dict[tuple, object]:
    """Every fact this process has worked out (frozen dataclasses of numbers: Params, Saved, flops.Count, and the
    model configs' Sizes and attentions, spaces.model_config.known)."""
    from trainscout.spaces import model_config
    return {**model_config.known(), **FACTS}


def learn(facts: dict[tuple, object] | None) -> None:
    """Take the facts another process worked out (`known` there); what this process worked out itself stays."""
    from trainscout.spaces import model_config
    model_config.learn(facts or {})
    for at, value in (facts or {}).items():
        if at[0] not in model_config.KINDS:
            FACTS.setdefault(at, value)


def meta_model(key: str, attn_implementation: str, seq_len: int = max(SEQS)):
    import torch

    from trainscout.trial.models import build_model
    config = json.loads(key)
    with torch.device("meta"):
        # fp32 weights, as a trial's master weights under every precision; count_saved casts them for 16-bit compute
        model = build_model(config, attn_implementation, seq_len, "float32")
    model.config.use_cache = False  # as a trial (trial/worker.py) and the HF hook (runtime/hf.py) run it
    return model


@memo("parameters")
def _parameters(key: str) -> Params:
    from torch import nn

    from trainscout.spaces.layers import decoder_layers
    model = meta_model(key, "eager", seq_len=1)  # every model has eager attention; a position table keeps its length
    layers = decoder_layers(model)
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    head_w = getattr(head, "weight", None)
    tied = head_w is embed
    own = sum(p.numel() for p in head.parameters()) if head is not None and not tied else 0
    linear = {id(p): p.numel() for m in model.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"
              for p in m.parameters(recurse=False)}
    return Params(N=sum(p.numel() for p in model.parameters()), layers=len(layers),
                  per_layer=max(sum(p.numel() for p in layer.parameters()) for layer in layers),
                  embed=embed.numel(), head=own, tied=tied, cast=sum(linear.values()))


def parameters(config: dict) -> Params:
    """The parameter counts of the model a config builds (built once per config on the meta device, cached)."""
    return _parameters(config_key(config))


def saved(config: dict, attention: str = "sdpa", compute: str = "autocast", compiled: str | None = None) -> Saved:
    """The bytes one forward saves for backward, per token, measured on the meta device (cached per argument).

    attention: the model's attn_implementation (sdpa; flash_attention_2 is measured as SDPA's flash kernel, which
    saves the same tensors; eager). compute: "autocast" (fp32 weights under 16-bit autocast: plain PyTorch, DDP,
    pipeline stages), "16-bit" (16-bit weights, no autocast: FSDP2's param_dtype, DeepSpeed's bf16 model) or "fp32".
    compiled: None, or the compile scope ("layers", "model"): inductor's partitioner (min-cut rematerialisation)
    recomputes cheap ops in backward instead of saving them, so a compiled layer's bytes are those its partitioned
    forward graph hands to its backward (predictor/partitioned.py); per-layer compile compiles every layer, as the model
    runs without a cache (use_cache=False, as in a trial: with a cache, dynamo guards on each layer's index and
    past its recompile limit of 8 the remaining layers would run eager).
    Where the meta forward fails for an architecture, the GPT-NeoX formula's bytes come back with measured=False and
    the reason; where only the compile trace fails, the eager layer's bytes with the reason; a warning names either
    on stderr once."""
    attention = "sdpa" if attention == "flash_attention_2" else attention
    eager = _saved(config_key(config), attention, compute)
    if not compiled or not eager.measured:
        return eager
    return _compiled(config_key(config), attention, compute)


_warned: set = set()  # the configs (and the compiled ones) a warning has named


@memo("saved")
def _saved(key: str, attention: str, compute: str) -> Saved:
    try:
        return _measure(key, attention, compute)
    except Exception as e:  # noqa: BLE001 - an architecture whose forward needs real data (a .item(), a data-dependent shape)
        why = f"the meta-device forward failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        config = json.loads(key)
        if key not in _warned:
            _warned.add(key)
            print(f"trainscout: warning: memory model of the {config.get('model_type')} model: {why}; "
                  "its activations are estimated with the GPT-NeoX formula", file=sys.stderr)
        return formula_saved(config, compute, why)


@memo("compiled")
def _compiled(key: str, attention: str, compute: str) -> Saved:
    eager = _saved(key, attention, compute)
    try:
        per_layer, per_layer_s = partitioned(meta_model(key, attention), attention, compute)
    except Exception as e:  # noqa: BLE001 - a layer the partitioner's tracer cannot take
        why = (f"torch.compile's partition could not be traced ({type(e).__name__}: "
               f"{str(e).splitlines()[0] if str(e) else ''})")
        if (key, "compiled") not in _warned:
            _warned.add((key, "compiled"))
            print(f"trainscout: warning: memory model of the {json.loads(key).get('model_type')} model: {why}; "
                  "its compiled layers are estimated with the eager layer's bytes", file=sys.stderr)
        return replace(eager, why=why)
    return replace(eager, per_layer=per_layer, per_layer_s=per_layer_s)


def _measure(key: str, attention: str, compute: str) -> Saved:
    return count_saved(meta_model(key, attention), attention, compute)
