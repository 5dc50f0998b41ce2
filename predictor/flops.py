"""FLOPs per trained token, counted from the model's own modules, under one named convention (CONVENTION).

The convention (torchtitan's and Megatron's, the one every public MFU figure we compare against uses):
- Matrix products only, forward + backward = 3 x the forward (a product's backward computes the gradients of its
  input and of its weight, each as large as the forward). Elementwise work, norms and softmax are not counted.
- Weights: every parameter of two or more dimensions costs 2 FLOPs per element per token in the forward, read from
  the model built on the meta device (predictor/model_tree.py), so GQA's narrower key/value projections, SwiGLU's third
  matrix and any family's layout count as they are. The input embedding (a lookup, no product) and position tables
  count nothing. The output head is counted once, tied to the embedding or not.
- Mixture of experts: an expert's weights count for the share of tokens routed to it, top_k / num_experts (every
  token runs top_k experts); the router and shared experts count in full. A token's cost is its active parameters.
- Attention scores and values: 12 x (query heads x head_dim) x s per token and layer (2 products of s x s x H·dh in
  the forward, x 3), as torchtitan counts it: causal masking does not halve it (the PaLM/Megatron convention);
  grouped-query attention changes nothing here (its smaller projections are in the weights); a sliding window is
  counted over the whole sequence, as an SDPA or eager kernel with a mask computes it (a windowed flash kernel
  skips keys: its MFU then reads as with dense attention).
- Model FLOPs (MFU) leave out recomputation; hardware FLOPs (HFU) add what activation checkpointing recomputes of
  each checkpointed layer: its forward, less what torch's non-reentrant checkpoint does not run again. That
  checkpoint stops its recompute early, once every tensor the backward needs is back, so a layer's last products
  whose outputs nothing saves (a dense layer's MLP down projection: docs/predictor.md says how much) are not
  recomputed. What it skips is measured once per model and kind of layer on the meta device: FlopCounterMode
  over a forward and backward with one layer checkpointed as the activation_checkpointing knob wraps it, early stop
  off minus on (`recompute_skipped`). Where that trace fails (transformers' MoE experts on the meta device), each
  checkpointed layer's whole forward is counted, with a warning (on the CPU a MoE layer was recomputed whole).
  Neither counts the flash kernel's backward recomputation nor what inductor's partitioner recomputes.

Checked against torch.utils.flop_counter.FlopCounterMode over a real forward + backward (tests/test_flops.py: tied,
untied, GQA, MoE, sliding window; eager attention and experts, as FlopCounterMode has no formula for the CPU SDPA
kernel nor for transformers' grouped expert fallback). Records stored under an older count are recounted on read
(recount): nothing stored is rewritten; the stored figures stay beside, as *_dense_v0.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from trainscout.trial.records import TOKENS_PER_S

from .model_tree import memo

CONVENTION = "matmul-v1"
OLD = "dense-6N"  # what records before CONVENTION hold: 6·(every parameter, embeddings included) + 12·L·d·s


@dataclass(frozen=True)
class Count:
    """A model's matrix-product FLOPs per token, by where they come from."""

    layer_weights: tuple[float, ...]  # per decoder layer: active matmul parameters (x 2 = forward FLOPs per token)
    outside: float                    # active matmul parameters outside the layers: the head (once), projections
    attention_width: tuple[float, ...]  # per decoder layer: query heads x head_dim (0: no attention; MLA: the mean
    #                                     of its query-key and value head widths)
    total_params: int                 # every parameter once (what the dense count multiplied by 6)
    note: str = ""                    # what the count could not read (e.g. an MoE top_k), shown with the record
    key: str = field(default="", compare=False, repr=False)  # the config it counts (recompute_skipped reads it)

    @property
    def active_params(self) -> float:
        """Parameters a token's forward multiplies by: the matmul weights, experts at their routed share."""
        return sum(self.layer_weights) + self.outside

    def layer_forward(self, i: int, seq_len: int) -> float:
        """Forward FLOPs per token of decoder layer i."""
        return 2.0 * self.layer_weights[i] + 4.0 * self.attention_width[i] * seq_len

    def per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, forward and backward (MFU's numerator)."""
        return 6.0 * self.active_params + 12.0 * sum(self.attention_width) * seq_len

    def hardware_per_token(self, seq_len: int, checkpoint_every: int = 0, selective: bool = False) -> float:
        """per_token plus what activation checkpointing recomputes (every n-th layer from the first): each such
        layer's forward less the products torch's checkpoint does not run again (recompute_skipped). selective
        (activation_checkpointing=selective, every layer): the products its policy does not save
        (recompute_selective: none of a transformers decoder layer's, whose products all are saved ops)."""
        if not checkpoint_every:
            return self.per_token(seq_len)
        if selective:
            again = recompute_selective(self.key) if self.key else (0.0,) * len(self.layer_weights)
            return self.per_token(seq_len) + sum(again)
        skipped = recompute_skipped(self.key) if self.key else (0.0,) * len(self.layer_weights)
        again = sum(max(0.0, self.layer_forward(i, seq_len) - skipped[i])
                    for i in range(0, len(self.layer_weights), checkpoint_every))
        return self.per_token(seq_len) + again


def count(config: dict) -> Count:
    """The Count of the model a config dict builds (on the meta device; cached per config)."""
    return _count(json.dumps(config, sort_keys=True, default=repr))


@memo("count")
def _count(key: str) -> Count:
    from torch import nn

    from trainscout.spaces.layers import decoder_layers

    from .model_tree import meta_model
    from trainscout.trial.models import hf_config, sizes
    config = json.loads(key)
    model = meta_model(key, "eager", seq_len=1)
    hf, z = hf_config(config), sizes(config)
    layers = decoder_layers(model)
    k = z.experts_per_token
    notes = []

    def weights(module) -> float:
        total = 0.0
        for path, sub in module.named_modules():
            if isinstance(sub, nn.Embedding):
                continue  # a lookup
            for name, p in sub.named_parameters(recurse=False):
                if p.dim() < 2:
                    continue  # norm scales and biases: no product
                total += p.numel() * _routed_share(sub, path, p, k, z.experts, notes)
        return total

    per_layer = tuple(weights(layer) for layer in layers)
    inside = {id(m) for layer in layers for m in layer.modules()}
    outside = 0.0
    for path, sub in model.named_modules():
        if id(sub) in inside or isinstance(sub, nn.Embedding):
            continue
        outside += sum(p.numel() for _, p in sub.named_parameters(recurse=False) if p.dim() >= 2)
    # a tied head: its module's weight is counted above, the embedding module's is not (the same tensor, once)
    width = (z.heads or 0) * (getattr(hf, "head_dim", None) or (z.hidden // z.heads if z.heads else 0))
    qk, v = getattr(hf, "qk_head_dim", None), getattr(hf, "v_head_dim", None)
    if qk and v:  # multi-head latent attention (DeepSeek-V2/V3): scores over qk_head_dim, values over v_head_dim
        width = (z.heads or 0) * (qk + v) / 2  # (its config's head_dim is the rope part alone)
    kinds = getattr(hf, "layer_types", None)
    attends = [("attention" in t and "linear" not in t) if isinstance(t, str) else True
               for t in (kinds or ["attention"] * len(layers))][:len(layers)]
    attends += [True] * (len(layers) - len(attends))
    note = "; ".join(sorted(set(notes)))
    if note:
        print(f"trainscout: warning: FLOP count of the {config.get('model_type')} model: {note}", file=sys.stderr)
    return Count(layer_weights=per_layer, outside=outside, attention_width=tuple(width if a else 0 for a in attends),
                 total_params=sum(p.numel() for p in model.parameters()), note=note, key=key)


SKIP_SEQ = 16  # tokens of the meta-device trace that measures what the recompute skips (weights' products: per token)


@memo("recompute_skipped")
def recompute_skipped(key: str) -> tuple[float, ...]:
    """Per decoder layer, the forward FLOPs per token that torch's non-reentrant checkpoint (as the
    activation_checkpointing knob wraps a layer) does not recompute: FlopCounterMode over a meta-device forward and
    backward with that layer checkpointed, early stop off minus on; one layer of each kind (its class and parameter
    shapes) is traced. Where the trace fails: zeros (the whole forward counted), with a warning naming why."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.checkpoint import set_checkpoint_early_stop
    from torch.utils.flop_counter import FlopCounterMode

    from trainscout.spaces.layers import decoder_layers

    from .cuda_like import cuda_like_mode
    from .model_tree import meta_model
    model = meta_model(key, "eager", seq_len=SKIP_SEQ).to(torch.bfloat16)  # 16-bit: the meta grouped GEMM takes no fp32
    model.train()
    layers = decoder_layers(model)

    def kind(layer) -> tuple:
        return type(layer).__name__, tuple((n, tuple(p.shape)) for n, p in layer.named_parameters())
    first: dict[tuple, int] = {}
    for i, layer in enumerate(layers):
        first.setdefault(kind(layer), i)
    ids = torch.zeros(1, SKIP_SEQ, dtype=torch.long, device="meta")

    def traced(i: int, early: bool) -> int:
        inner = layers[i]
        layers[i] = checkpoint_wrapper(inner, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        try:
            with set_checkpoint_early_stop(early), FlopCounterMode(display=False) as counter, \
                    cuda_like_mode(None, fused=False):
                model(input_ids=ids).logits.float().sum().backward()
        finally:
            layers[i] = inner
            model.zero_grad(set_to_none=True)
        return counter.get_total_flops()
    try:
        skip = {k: max(0.0, (traced(i, False) - traced(i, True)) / SKIP_SEQ) for k, i in first.items()}
    except Exception as e:  # noqa: BLE001 - the count stays usable: the whole forward, said aloud
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(f"trainscout: warning: FLOP count of the {json.loads(key).get('model_type')} model: what activation "
              f"checkpointing skips of its recompute could not be traced on the meta device ({why}): HFU counts "
              "each checkpointed layer's whole forward", file=sys.stderr)
        return (0.0,) * len(layers)
    return tuple(skip[kind(layer)] for layer in layers)


@memo("recompute_selective")
def recompute_selective(key: str) -> tuple[float, ...]:
    """Per decoder layer, the forward FLOPs per token selective checkpointing recomputes: FlopCounterMode over a
    meta-device forward and backward with that layer checkpointed under the knob's op policy, less the same without
    checkpointing (one layer of each kind traced, as recompute_skipped). Matrix products and attention are what the
    policy saves, so this is the products it does not know (0 for every transformers layer traced so far). Where the
    trace fails: each layer's whole forward less nothing saved, i.e. full checkpointing's count, with a warning."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.flop_counter import FlopCounterMode

    from trainscout.spaces.knobs.activation_checkpointing import selective_context
    from trainscout.spaces.layers import decoder_layers

    from .cuda_like import cuda_like_mode
    from .model_tree import meta_model
    model = meta_model(key, "eager", seq_len=SKIP_SEQ).to(torch.bfloat16)
    model.train()
    layers = decoder_layers(model)
    first: dict[tuple, int] = {}
    for i, layer in enumerate(layers):
        first.setdefault((type(layer).__name__, tuple((n, tuple(p.shape)) for n, p in layer.named_parameters())), i)
    ids = torch.zeros(1, SKIP_SEQ, dtype=torch.long, device="meta")

    def traced(i: int | None) -> int:
        inner = layers[i] if i is not None else None
        if i is not None:
            layers[i] = checkpoint_wrapper(inner, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                           context_fn=selective_context)
        try:
            with FlopCounterMode(display=False) as counter, cuda_like_mode(None, fused=False):
                model(input_ids=ids).logits.float().sum().backward()
        finally:
            if i is not None:
                layers[i] = inner
            model.zero_grad(set_to_none=True)
        return counter.get_total_flops()
    try:
        plain = traced(None)
        again = {k: max(0.0, (traced(i) - plain) / SKIP_SEQ) for k, i in first.items()}
    except Exception as e:  # noqa: BLE001 - the count stays usable: full checkpointing's, said aloud
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        print(f"trainscout: warning: FLOP count of the {json.loads(key).get('model_type')} model: what selective "
              f"checkpointing recomputes could not be traced on the meta device ({why}): HFU counts each layer's "
              "forward less what full checkpointing skips", file=sys.stderr)
        c, skipped = _count(key), recompute_skipped(key)
        return tuple(max(0.0, c.layer_forward(i, SKIP_SEQ) - skipped[i]) for i in range(len(layers)))
    return tuple(again[(type(layer).__name__, tuple((n, tuple(p.shape)) for n, p in layer.named_parameters()))]
                 for layer in layers)


def _routed_share(module, path: str, p, k: int | None, experts: int | None, notes: list) -> float:
    """The share of tokens a weight multiplies: top_k / num_experts for routed experts (stacked as one 3-D tensor
    per projection, transformers 5.x, or a ModuleList of expert MLPs), 1 for everything else."""
    n = getattr(module, "num_experts", None)
    stacked = p.dim() == 3 and isinstance(n, int) and p.shape[0] == n
    listed = ".experts." in f".{path}." and "shared" not in path
    if not (stacked or listed):
        return 1.0
    if not stacked:
        n = experts
    if not k or not n:
        notes.append("experts found but no top_k / expert count in the config: every expert counted")
        return 1.0
    return k / n


def metrics(config: dict, seq_len: int, tokens_per_s: float, peak_tflops: float | None, n_gpus: int,
            checkpoint_every: int = 0, selective: bool = False) -> dict:
    """The FLOP metrics of a measurement: flops_per_token (model), hardware_flops_per_token (with recomputation;
    selective: activation_checkpointing=selective's), active_params, mfu, hfu and the convention they are counted
    under."""
    from trainscout.trial.metrics import mfu
    c = count(config)
    model, hardware = c.per_token(seq_len), c.hardware_per_token(seq_len, checkpoint_every, selective)
    out = {"flops_convention": CONVENTION, "flops_per_token": model, "hardware_flops_per_token": hardware,
           "active_params": c.active_params, "mfu": mfu(tokens_per_s, model, peak_tflops, n_gpus),
           "hfu": mfu(tokens_per_s, hardware, peak_tflops, n_gpus)}
    if c.note:
        out["flops_note"] = c.note
    return out


def recount(record):
    """A stored record with its FLOP metrics under CONVENTION (the record as it is when it already is, or failed).
    The figures it was stored with stay beside as flops_per_token_dense_v0 and mfu_dense_v0. A record whose model
    cannot be built here keeps its figures, marked flops_convention OLD with the reason (flops_note)."""
    m = record.metrics
    if not record.ok or not m or m.get("flops_convention") == CONVENTION or not m.get(TOKENS_PER_S) or \
            not (record.recipe or {}).get("seq_len"):
        return record  # nothing to count FLOPs against (no throughput or no sequence length: a stub)
    old = {f"{k}_dense_v0": m[k] for k in ("flops_per_token", "mfu") if k in m}
    try:
        from trainscout.trial.models import stored_model
        config = record.model_config or stored_model(record.model, None).config
        seq = (record.recipe or {})["seq_len"]
        fresh = metrics(config, seq, m[TOKENS_PER_S], m.get("peak_tflops"), record.world_size or 1,
                        record.plan.checkpoint_every if record.plan else 0, selective(record.plan))
    except Exception as e:  # noqa: BLE001 - a model type this transformers does not know, a record without its recipe
        why = f"not recounted: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return record.replace(metrics={**m, "flops_convention": OLD, "flops_note": why})
    return record.replace(metrics={**m, **old, **fresh})


def selective(plan) -> bool:
    """Whether a plan checkpoints selectively (activation_checkpointing=selective: its own setting in plan.knobs)."""
    from trainscout.spaces.knobs.activation_checkpointing import SELECTIVE
    return plan is not None and (plan.knobs or {}).get("activation_checkpointing") == SELECTIVE
