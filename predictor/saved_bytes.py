"""The bytes a training forward saves for backward, counted on the meta device (model_tree.saved's measurement, under
cuda_like.py's mode), and the GPT-NeoX formula's where the meta forward fails."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .cuda_like import cuda_like_mode, storage_id

# sequence lengths of the meta forwards (two rows each): two determine bytes per token and per token·position, as
# nothing else is saved on the meta device (parameters, buffers and weight copies are left out)
SEQS = (32, 64)  # multiples of 32: the memory-efficient kernel pads its logsumexp to them
BATCH = 2


@dataclass(frozen=True)
class Saved:
    """Bytes autograd saves for backward in one forward, per token (scale by micro-batch x sequence length)."""

    per_layer: float     # per token, a decoder layer (the mean of the layers)
    per_layer_s: float   # per token per sequence position, a decoder layer: eager attention's scores (fused: 0)
    outside: float       # per token, outside the decoder layers (token ids, final norm, the head's input)
    layer_input: float   # per token, a decoder layer's input: what a checkpointed layer keeps
    measured: bool       # False: the meta forward failed and these are the GPT-NeoX formula's values
    why: str = ""        # why the formula (or, compiled, the eager layer's bytes) was used
    # per token (and per token·position), a decoder layer: the outputs of the ops selective activation checkpointing
    # saves (spaces/knobs/activation_checkpointing.saved_ops: matrix products, attention kernels), what such a
    # checkpointed layer keeps besides its input
    policy: float = 0.0
    policy_s: float = 0.0

    def layer_bytes(self, b: int, s: int) -> float:
        """Bytes one decoder layer saves for a micro-batch of b sequences of s tokens."""
        return b * s * (self.per_layer + self.per_layer_s * s)


def formula_saved(config: dict, compute: str, why: str) -> Saved:
    """Korthikanti et al. 2022's count for a GPT layer with a fused attention kernel, in bytes per token:
    34·h mixed, 60·h in fp32 (every tensor in 4 bytes); the layer input in 4 bytes (fp32 residual) or 2."""
    from trainscout.trial.models import sizes
    h = sizes(config).hidden
    fp32 = compute == "fp32"
    # the products' outputs of a GPT layer: query/key/value 3h, attention h (and its logsumexp), output h, MLP 4h + h
    return Saved(per_layer=(60 if fp32 else 34) * h, per_layer_s=0.0, outside=0.0,
                 layer_input=(2 if compute == "16-bit" else 4) * h, measured=False, why=why,
                 policy=(4 if fp32 else 2) * 10 * h)


def count_saved(model, attention: str, compute: str, seqs=SEQS, batch: int = BATCH) -> Saved:
    """The bytes a training forward of this model (on the meta device) saves for backward, per token: one forward of
    batch rows for each sequence length in seqs under the CUDA-like mode, every saved storage counted once (by the
    decoder layer that saved it first), and a least-squares fit of bytes = b·s·(per_layer + per_layer_s·s). The same
    forward counts, per layer, the outputs of the ops selective checkpointing saves (Saved.policy, policy_s), as its
    policy sees them: at the aten level, after autocast's casts."""
    import torch

    from trainscout.spaces.layers import decoder_layers
    low = torch.bfloat16  # fp16 has the same sizes
    if compute == "16-bit":
        model.to(low)
    model.train()
    layers = decoder_layers(model)
    skip = {storage_id(t) for t in (*model.parameters(), *model.buffers())}
    state = {"layer": None, "inputs": []}
    hooks = [h for i, layer in enumerate(layers) for h in (
        layer.register_forward_pre_hook(functools.partial(_enter, state, i), with_kwargs=True),
        layer.register_forward_hook(lambda *_: state.__setitem__("layer", None)))]
    rows = []
    try:
        for s in seqs:
            mode = cuda_like_mode(low if compute == "autocast" else None, fused=attention == "sdpa")
            per = {}  # decoder layer (None: outside them) -> {storage id: bytes}
            state["inputs"], state["policy"] = [], 0

            def pack(t):
                sid = storage_id(t)
                if sid not in skip and sid not in mode.casts and not any(sid in d for d in per.values()):
                    per.setdefault(state["layer"], {})[sid] = t.untyped_storage().nbytes()
                return t

            ids = torch.zeros(batch, s, dtype=torch.long, device="meta")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode, _policy_outputs(state):
                out = model(input_ids=ids)  # as a trial calls it (labels aside: the loss is the logits term)
            del out
            inside = sum(sum(d.values()) for k, d in per.items() if k is not None) / len(layers)
            rows.append((s, inside, sum(per.get(None, {}).values()), max(state["inputs"], default=0) / (batch * s),
                         state["policy"] / len(layers)))
    finally:
        for h in hooks:
            h.remove()
    return _fitted(rows, seqs, batch)


def _policy_outputs(state: dict):
    """A TorchDispatchMode that adds to state["policy"] the bytes of the selective checkpointing policy's ops' outputs
    inside the decoder layers (state["layer"] set)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainscout.spaces.knobs.activation_checkpointing import saved_ops
    policy_ops = saved_ops()

    class PolicyOutputs(TorchDispatchMode):
        """Sums the bytes of the policy ops' outputs inside the decoder layers."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in policy_ops and state["layer"] is not None:
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, torch.Tensor):
                        state["policy"] += t.untyped_storage().nbytes()
            return out
    return PolicyOutputs()


def _fitted(rows: list[tuple], seqs, batch: int) -> Saved:
    """Saved from count_saved's rows (s, a layer's bytes, the bytes outside the layers, a layer's input bytes per
    token, a layer's policy outputs) by least squares over bytes = b·s·(alpha + beta·s)."""
    import numpy as np
    X = np.array([[batch * s, batch * s * s] for s, *_ in rows])
    alpha, beta = np.linalg.lstsq(X, np.array([r[1] for r in rows]), rcond=None)[0]
    out_alpha = np.linalg.lstsq(X, np.array([r[2] for r in rows]), rcond=None)[0][0]
    beta = beta if beta * max(seqs) > 1e-6 * abs(alpha) else 0.0  # fused kernels: exactly 0 but for rounding
    p_alpha, p_beta = np.linalg.lstsq(X, np.array([r[4] for r in rows]), rcond=None)[0]
    p_beta = p_beta if p_beta * max(seqs) > 1e-6 * abs(p_alpha) else 0.0
    return Saved(per_layer=float(alpha), per_layer_s=float(beta), outside=max(0.0, float(out_alpha)),
                 layer_input=rows[-1][3], measured=True, policy=float(p_alpha), policy_s=float(p_beta))


def _enter(state, i, module, args, kwargs):
    state["layer"] = i
    x = args[0] if args else kwargs.get("hidden_states")
    if x is not None:
        state["inputs"].append(x.element_size() * x.numel())
