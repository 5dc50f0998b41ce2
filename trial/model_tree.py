"""What a model holds, read from its module tree built on the meta device (no memory is allocated, no weights made).

`parameters(config)` counts the built model's parameters: all of them, the largest decoder layer's, the
embedding's, the LM head's own (none when tied to the embedding) and the linears' (what autocast copies to 16 bits).
Building costs 0.03-0.1 s on the meta device (Pythia-6.9B 0.09 s, Pythia-12B 0.12 s, the Llama-1B shape 0.08 s,
after transformers' import); it is done once per config and process.

`saved(config, attention, compute)` runs a training forward of the whole model on the meta device and sums the
bytes autograd saves for backward (distinct storages, through torch.autograd.graph.saved_tensors_hooks), per
decoder layer and outside the layers, at two sequence lengths: that gives the bytes per token and the bytes per
token per sequence position (eager attention's s x s scores), which scale to any micro-batch and sequence length.
Parameters, buffers and autocast's copies of the weights are left out: the memory model counts them as weights.

The meta device runs no kernels, so two things a CUDA GPU does are done here by hand, in a TorchFunctionMode:
- autocast (torch.autocast has no meta backend): the linears and matmuls run in 16 bits; layer norm, softmax, pow,
  rsqrt, exp, sum and the losses in fp32; the rest (RMSNorm's F.rms_norm, SiLU, GELU) in its inputs' dtype;
  weights are cast once per forward;
- SDPA's fused kernels: on meta, F.scaled_dot_product_attention takes its math path (it saves the s x s scores);
  an H200 runs cuDNN attention on 16-bit inputs and the memory-efficient kernel on fp32 ones (see _sdpa).
Checked on an H200 (torch 2.11, transformers 5.17; bench/data/gpu-2026-12-01-mem/): the saved bytes per layer of
tiny, Pythia-160M, Pythia-1B and the Llama-1B shape, under autocast, 16-bit weights and fp32, with SDPA and eager
attention, are the meta device's to 0.1 % (e.g. 34.09·h per token per layer for Pythia-160M under autocast,
63.07·h for the Llama shape, plus 72 and 192 bytes per token per position with eager attention).

`saved(..., compiled=scope)` traces a decoder layer's forward and backward with AOTAutograd on the meta device and
counts what inductor's min-cut partitioner hands from one to the other (see _partitioned for how it compares).
"""
from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, replace

# sequence lengths of the meta forwards (two rows each): two determine bytes per token and per token·position, as
# nothing else is saved on the meta device (parameters, buffers and weight copies are left out)
SEQS = (32, 64)  # multiples of 32: the memory-efficient kernel pads its logsumexp to them
BATCH = 2


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


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=repr)


# What the meta-device model told (Params, Saved, flops.Count), by (kind, config key, arguments): worked out once per
# process, or handed over by whoever worked it out (a search's driver to its trial actors, through `known` and
# `learn`: an actor then neither imports transformers' models nor builds one to predict a trial's memory, 3-4 s of
# each actor's first trial on 2 cores). Only the meta device is read, so the same torch and transformers give the
# same facts in every process.
_FACTS: dict[tuple, object] = {}


def memo(kind: str):
    """Cache a function of strings in _FACTS under kind (functools.lru_cache, but its entries can be handed on)."""
    def wrap(fn):
        @functools.wraps(fn)
        def cached(*args):
            at = (kind, *args)
            if at not in _FACTS:
                _FACTS[at] = fn(*args)
            return _FACTS[at]
        return cached
    return wrap


def known() -> dict[tuple, object]:
    """Every fact this process has worked out (frozen dataclasses of numbers: Params, Saved, flops.Count, and the
    model configs' Sizes and attentions, spaces.model_config.known)."""
    from trainscout.spaces import model_config
    return {**model_config.known(), **_FACTS}


def learn(facts: dict[tuple, object] | None) -> None:
    """Take the facts another process worked out (`known` there); what this process worked out itself stays."""
    from trainscout.spaces import model_config
    model_config.learn(facts or {})
    for at, value in (facts or {}).items():
        if at[0] not in model_config.KINDS:
            _FACTS.setdefault(at, value)


def _build(key: str, attn_implementation: str, seq_len: int = max(SEQS)):
    import torch

    from .models import build_model
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
    model = _build(key, "eager", seq_len=1)  # every model has eager attention; a position table keeps its length
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
    return _parameters(_key(config))


def saved(config: dict, attention: str = "sdpa", compute: str = "autocast", compiled: str | None = None) -> Saved:
    """The bytes one forward saves for backward, per token, measured on the meta device (cached per argument).

    attention: the model's attn_implementation (sdpa; flash_attention_2 is measured as SDPA's flash kernel, which
    saves the same tensors; eager). compute: "autocast" (fp32 weights under 16-bit autocast: plain PyTorch, DDP,
    pipeline stages), "16-bit" (16-bit weights, no autocast: FSDP2's param_dtype, DeepSpeed's bf16 model) or "fp32".
    compiled: None, or the compile scope ("layers", "model"): inductor's partitioner (min-cut rematerialisation)
    recomputes cheap ops in backward instead of saving them, so a compiled layer's bytes are those its partitioned
    forward graph hands to its backward (see _partitioned); per-layer compile compiles every layer, as the model
    runs without a cache (use_cache=False, as in a trial: with a cache, dynamo guards on each layer's index and
    past its recompile limit of 8 the remaining layers would run eager).
    Where the meta forward fails for an architecture, the GPT-NeoX formula's bytes come back with measured=False and
    the reason; where only the compile trace fails, the eager layer's bytes with the reason; a warning names either
    on stderr once."""
    attention = "sdpa" if attention == "flash_attention_2" else attention
    eager = _saved(_key(config), attention, compute)
    if not compiled or not eager.measured:
        return eager
    return _compiled(_key(config), attention, compute)


_warned: set = set()  # the configs (and the compiled ones) a warning has named


@memo("saved")
def _saved(key: str, attention: str, compute: str) -> Saved:
    try:
        return _measure(key, attention, compute)
    except Exception as e:  # an architecture whose forward needs real data (a .item(), a data-dependent shape)
        why = f"the meta-device forward failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        config = json.loads(key)
        if key not in _warned:
            _warned.add(key)
            print(f"trainscout: warning: memory model of the {config.get('model_type')} model: {why}; "
                  "its activations are estimated with the GPT-NeoX formula", file=sys.stderr)
        return _formula(config, compute, why)


@memo("compiled")
def _compiled(key: str, attention: str, compute: str) -> Saved:
    eager = _saved(key, attention, compute)
    try:
        per_layer, per_layer_s = _partitioned(key, attention, compute)
    except Exception as e:  # a layer the partitioner's tracer cannot take
        why = (f"torch.compile's partition could not be traced ({type(e).__name__}: "
               f"{str(e).splitlines()[0] if str(e) else ''})")
        if (key, "compiled") not in _warned:
            _warned.add((key, "compiled"))
            print(f"trainscout: warning: memory model of the {json.loads(key).get('model_type')} model: {why}; "
                  "its compiled layers are estimated with the eager layer's bytes", file=sys.stderr)
        return replace(eager, why=why)
    return replace(eager, per_layer=per_layer, per_layer_s=per_layer_s)


def _partitioned(key: str, attention: str, compute: str) -> tuple[float, float]:
    """Bytes per token (and per token·position) the first decoder layer's forward graph saves for its backward
    under torch.compile: the layer as the model calls it (its
    arguments caught on the meta device), traced by AOTAutograd with inductor's decompositions and min-cut
    partitioner; what the forward graph hands to the backward, less the parameters and what is computed from them
    alone (autocast's copies). On an H200 inductor's compiled Llama-1B-shape layers held 24.0·h bytes per token
    less than eager ones (this trace: 23.9·h); Pythia-160M's 0.1·h more (this trace: 4.1·h more, an
    over-estimate of 3 % of the layer's bytes)."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch.func import functional_call

    from trainscout.spaces.layers import decoder_layers
    model = _build(key, attention)
    low = torch.bfloat16
    if compute == "16-bit":
        model.to(low)
    model.train()
    layer = decoder_layers(model)[0]
    names, params = zip(*layer.named_parameters())
    rows = []
    for s in SEQS if attention == "eager" else SEQS[-1:]:  # fused attention: nothing grows with s², one length
        caught = {}

        def catch(module, args, kwargs):
            caught.update(args=args, kwargs=kwargs)
            raise _Caught

        hook = layer.register_forward_pre_hook(catch, with_kwargs=True)
        try:
            with _cuda_like(low if compute == "autocast" else None, fused=attention == "sdpa"):
                model(input_ids=torch.zeros(BATCH, s, dtype=torch.long, device="meta"))
        except _Caught:
            pass
        finally:
            hook.remove()
        leaves, tree = pytree.tree_flatten((caught["args"], caught["kwargs"]))
        where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

        def layer_fn(*flat):
            filled = list(leaves)
            for i, t in zip(where, flat[len(params):]):
                filled[i] = t
            args, kw = pytree.tree_unflatten(filled, tree)
            out = functional_call(layer, dict(zip(names, flat[:len(params)])), args, kw)
            return out[0] if isinstance(out, tuple) else out

        graphs = []
        traced = aot_function(layer_fn, fw_compiler=lambda gm, _: graphs.append(gm) or gm, bw_compiler=lambda gm, _: gm,
                              partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
        with _cuda_like(low if compute == "autocast" else None, fused=attention == "sdpa"):
            traced(*params, *(leaves[i] for i in where))
        rows.append((s, _graph_saved(graphs[0], len(params))))
    if len(rows) == 1:
        return rows[0][1] / (BATCH * rows[0][0]), 0.0
    X = np.array([[BATCH * s, BATCH * s * s] for s, _ in rows])
    alpha, beta = np.linalg.lstsq(X, np.array([r[1] for r in rows]), rcond=None)[0]
    return float(alpha), float(beta if beta * max(SEQS) > 1e-6 * abs(alpha) else 0.0)


class _Caught(Exception):
    """Raised by a forward pre-hook once it has the layer's arguments."""


def _graph_saved(gm, n_params: int) -> int:
    """Bytes of the distinct storages a partitioned forward graph outputs for its backward (its outputs after the
    layer's own), less the parameters and the tensors computed from parameters alone."""
    import torch
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    from_params = set(placeholders[:n_params])
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.all_input_nodes and all(i in from_params for i in n.all_input_nodes):
            from_params.add(n)
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    storages = {}
    for n in outputs[1:]:
        v = getattr(n, "meta", {}).get("val")
        if isinstance(v, torch.Tensor) and n not in from_params:
            storages.setdefault(_sid(v), v.untyped_storage().nbytes())
    return sum(storages.values())


def _formula(config: dict, compute: str, why: str) -> Saved:
    """Korthikanti et al. 2022's count for a GPT layer with a fused attention kernel, in bytes per token:
    34·h mixed, 60·h in fp32 (every tensor in 4 bytes); the layer input in 4 bytes (fp32 residual) or 2."""
    from .models import sizes
    h = sizes(config).hidden
    fp32 = compute == "fp32"
    # the products' outputs of a GPT layer: query/key/value 3h, attention h (and its logsumexp), output h, MLP 4h + h
    return Saved(per_layer=(60 if fp32 else 34) * h, per_layer_s=0.0, outside=0.0,
                 layer_input=(2 if compute == "16-bit" else 4) * h, measured=False, why=why,
                 policy=(4 if fp32 else 2) * 10 * h)


def _measure(key: str, attention: str, compute: str) -> Saved:
    return count_saved(_build(key, attention), attention, compute)


def count_saved(model, attention: str, compute: str, seqs=SEQS, batch: int = BATCH) -> Saved:
    """The bytes a training forward of this model (on the meta device) saves for backward, per token: one forward of
    batch rows for each sequence length in seqs under the CUDA-like mode, every saved storage counted once (by the
    decoder layer that saved it first), and a least-squares fit of bytes = b·s·(per_layer + per_layer_s·s). The same
    forward counts, per layer, the outputs of the ops selective checkpointing saves (Saved.policy, policy_s), as its
    policy sees them: at the aten level, after autocast's casts."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainscout.spaces.knobs.activation_checkpointing import saved_ops

    from trainscout.spaces.layers import decoder_layers
    low = torch.bfloat16  # fp16 has the same sizes
    if compute == "16-bit":
        model.to(low)
    model.train()
    layers = decoder_layers(model)
    skip = {_sid(t) for t in (*model.parameters(), *model.buffers())}
    state = {"layer": None, "inputs": []}
    hooks = [h for i, layer in enumerate(layers) for h in (
        layer.register_forward_pre_hook(functools.partial(_enter, state, i), with_kwargs=True),
        layer.register_forward_hook(lambda *_: state.__setitem__("layer", None)))]
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
    rows = []
    try:
        for s in seqs:
            mode = _cuda_like(low if compute == "autocast" else None, fused=attention == "sdpa")
            per = {}  # decoder layer (None: outside them) -> {storage id: bytes}
            state["inputs"], state["policy"] = [], 0

            def pack(t):
                sid = _sid(t)
                if sid not in skip and sid not in mode.casts and not any(sid in d for d in per.values()):
                    per.setdefault(state["layer"], {})[sid] = t.untyped_storage().nbytes()
                return t

            ids = torch.zeros(batch, s, dtype=torch.long, device="meta")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode, PolicyOutputs():
                out = model(input_ids=ids)  # as a trial calls it (labels aside: the loss is the logits term)
            del out
            inside = sum(sum(d.values()) for k, d in per.items() if k is not None) / len(layers)
            rows.append((s, inside, sum(per.get(None, {}).values()), max(state["inputs"], default=0) / (batch * s),
                         state["policy"] / len(layers)))
            del per
    finally:
        for h in hooks:
            h.remove()
    X = np.array([[batch * s, batch * s * s] for s, *_ in rows])
    alpha, beta = np.linalg.lstsq(X, np.array([r[1] for r in rows]), rcond=None)[0]
    out_alpha = np.linalg.lstsq(X, np.array([r[2] for r in rows]), rcond=None)[0][0]
    beta = beta if beta * max(seqs) > 1e-6 * abs(alpha) else 0.0  # fused kernels: exactly 0 but for rounding
    p_alpha, p_beta = np.linalg.lstsq(X, np.array([r[4] for r in rows]), rcond=None)[0]
    p_beta = p_beta if p_beta * max(seqs) > 1e-6 * abs(p_alpha) else 0.0
    return Saved(per_layer=float(alpha), per_layer_s=float(beta), outside=max(0.0, float(out_alpha)),
                 layer_input=rows[-1][3], measured=True, policy=float(p_alpha), policy_s=float(p_beta))


def _sid(t) -> int:
    """The identity of a tensor's storage (meta storages have no data pointer to compare)."""
    return t.untyped_storage()._cdata


def _enter(state, i, module, args, kwargs):
    state["layer"] = i
    x = args[0] if args else kwargs.get("hidden_states")
    if x is not None:
        state["inputs"].append(x.element_size() * x.numel())


# CUDA autocast's op lists, for the functions transformers' decoders call (torch.amp's reference, "CUDA Ops that can
# autocast to float16" / "to float32"); checked on an H200 against torch.autocast("cuda", torch.bfloat16)
def _op_lists():
    import torch
    import torch.nn.functional as F
    T = torch.Tensor
    low = {F.linear, torch.matmul, T.matmul, T.__matmul__, torch.mm, T.mm, torch.bmm, T.bmm, torch.baddbmm,
           T.baddbmm, torch.addmm, T.addmm, torch.addbmm, torch.addmv, torch.einsum, F.conv1d}
    fp32 = {F.layer_norm, torch.layer_norm, F.group_norm, F.softmax, torch.softmax, T.softmax, F.log_softmax,
            torch.log_softmax, T.log_softmax, F.cross_entropy, F.nll_loss, torch.pow, T.pow, T.__pow__, T.__rpow__,
            torch.rsqrt, T.rsqrt, torch.exp, T.exp, torch.log, T.log, torch.sum, T.sum, torch.cumsum, T.cumsum,
            torch.reciprocal, T.reciprocal, torch.norm, T.norm, F.normalize, F.softplus, torch.prod, T.prod}
    return low, fp32


def _cuda_like(low, fused):
    """A TorchFunctionMode that does on the meta device what a CUDA GPU does: autocast to low (None: no autocast)
    and, with fused, SDPA's flash or memory-efficient kernel instead of its math path. Its casts attribute holds
    the storages of the weights' 16-bit copies (autocast casts a weight once per forward)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    lows, fp32s = _op_lists()
    reduced = (torch.bfloat16, torch.float16)
    grouped = {f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f is not None}

    class CudaLike(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.casts, self._weights = set(), {}

        def cast(self, x, dtype):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == dtype:
                return x
            if not (x.is_leaf and x.requires_grad):
                return x.to(dtype)
            if id(x) not in self._weights:
                self._weights[id(x)] = (x, x.to(dtype))  # the weight stays referenced: its id is not reused
                self.casts.add(_sid(self._weights[id(x)][1]))
            return self._weights[id(x)][1]

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.all, torch.Tensor.all) and getattr(args[0], "is_meta", False):
                # a data-dependent check has no value on the meta device: take the answer a batch of whole, unpadded
                # sequences gives (transformers' packed-sequence check without a cache: "no packing")
                return torch.tensor(True)
            if fused and func is F.scaled_dot_product_attention:
                return _sdpa(self, low, *args, **kwargs)
            if func in grouped and getattr(args[0], "is_meta", False) and args[0].dtype not in reduced:
                if low is None:  # fp32 training: the meta kernel takes bf16 only
                    return _grouped_mm(*args[:2])
                # autocast: the experts knob's transform runs them on 16-bit copies of their weights (transformers
                # passes a transposed view of the parameter: its copy is a weight's, not an activation)
                x, w, *rest = args
                base = w._base if w._base is not None else w
                if base.is_leaf and base.requires_grad:
                    w = self.cast(base, low).as_strided(w.shape, w.stride(), w.storage_offset())
                else:
                    w = self.cast(w, low)
                args = (self.cast(x, low), w, *rest)
            if low is not None and func in lows:
                args, kwargs = _map(lambda x: self.cast(x, low), args, kwargs)
            elif low is not None and func in fp32s and kwargs.get("dtype") is None:
                args, kwargs = _map(lambda x: self.cast(x, torch.float32) if getattr(x, "dtype", None) in reduced
                                    else x, args, kwargs)
            return func(*args, **kwargs)

    return CudaLike()


def _grouped_mm(a, b):
    """A mixture of experts' grouped GEMM on the meta device in fp32, as a GPU runs transformers' experts over fp32
    weights without autocast (precision=fp32): the meta kernel takes bf16 only, so this stands in for it, saving its
    two operands for backward as the real op does (the weights are parameters: not counted)."""
    import torch

    class Grouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x.new_empty((*x.shape[:-1], w.shape[-1]))

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w)
    return Grouped.apply(a, b)


def _map(f, args, kwargs):
    return tuple(f(a) for a in args), {k: f(v) for k, v in kwargs.items()}


def _sdpa(mode, low, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention as an H200 runs it (torch 2.11, bench/data/gpu-2026-12-01-mem/): 16-bit inputs go
    to cuDNN attention, which saves q, k, v (GQA's fewer key/value heads as they are), the output, an fp32
    logsumexp per head and position and a mask if there is one (the flash and memory-efficient kernels' meta
    functions save the same); fp32 inputs to the memory-efficient kernel, or with GQA to the math path, which
    saves the s x s scores."""
    import torch
    import torch.nn.functional as F
    if low is not None:
        q, k, v = (mode.cast(x, low) for x in (q, k, v))
    gqa = k.shape[-3] != q.shape[-3]
    fused16 = q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] <= 256
    if fused16 and attn_mask is None:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                                 scale=scale)[0]
    if gqa and not fused16:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
    if gqa:
        k, v = (x.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for x in (k, v))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # the kernel takes an additive bias, as SDPA converts it
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~attn_mask, torch.finfo(q.dtype).min)
        attn_mask = attn_mask.expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal,
                                                                 scale=scale)[0]
