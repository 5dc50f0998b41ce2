"""Every config.json of bench/models/hub (real Hub files, as published) through trainscout, on the CPU.

For each file: resolve_model reads it (or refuses it with a one-line ConfigError: the reason is the row); the
estimate command's prediction at micro-batch 1 and the model's own recipe (one rank, a CUDA GPU assumed, no GPU
needed); the FLOPs/token of the real shape (predictor/flops.py, meta device); then a shrunk copy of the same
architecture (same model_type and flags: tie, sliding window, experts and top-k, rope scaling, qk-norm, MLA ranks;
2 layers, hidden 64, vocab 256) whose meta count is divided by torch's FlopCounterMode over a real forward +
backward, and which trains one optimizer step as the trial engines do under precision=bf16-mixed (build_model in
the plan's master dtype, float32; bf16 autocast; AdamW): its parameters, gradients and AdamW states' dtypes.

    python bench/hub_corpus.py            # the markdown table (docs/BENCHMARKS.md, "Real Hub config.json files")
    python bench/hub_corpus.py --json     # one JSON object per file

tests/test_hub_corpus.py runs the same checks over every file."""
from __future__ import annotations

import copy
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "bench", "models", "hub")
S = 64  # the shrunk copy's sequence length
HIDDEN, LAYERS, VOCAB, HEADS, HEAD_DIM, FFN, EXPERT_FFN = 64, 2, 256, 4, 16, 128, 32


def files() -> list[str]:
    return sorted(glob.glob(os.path.join(CORPUS, "*.json")))


def shrink(cfg: dict) -> dict:
    """The same architecture, small: 2 layers, hidden 64 (4 heads of 16, the file's query/key-value head ratio),
    vocab 256, small MLPs; experts' count and top-k, tie, sliding window (at S/4, so it masks), rope scaling (its
    per-dimension factor lists cut to the new rotary width), qk-norm and MLA's shape kept, scaled down."""
    c = copy.deepcopy(cfg)
    heads = c.get("num_attention_heads") or c.get("n_head")
    kv = c.get("num_key_value_heads") or heads
    c.update(hidden_size=HIDDEN, num_hidden_layers=LAYERS, vocab_size=VOCAB, num_attention_heads=HEADS)
    if "num_key_value_heads" in c:
        c["num_key_value_heads"] = max(1, HEADS * kv // heads)
    if "head_dim" in c:
        c["head_dim"] = HEAD_DIM
    c["intermediate_size"] = EXPERT_FFN if _experts_in_intermediate(c) else FFN
    for k in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if c.get(k):
            c[k] = EXPERT_FFN
    for k, v in (("kv_lora_rank", 32), ("q_lora_rank", 32), ("qk_nope_head_dim", 16), ("qk_rope_head_dim", 8),
                 ("v_head_dim", 16)):
        if c.get(k):
            c[k] = v
    if c.get("sliding_window"):
        c["sliding_window"] = S // 4
    rs = c.get("rope_scaling")
    if isinstance(rs, dict) and "long_factor" in rs:  # longrope: one factor per rotary frequency
        rotary = int((c.get("head_dim") or HIDDEN // HEADS) * c.get("partial_rotary_factor", 1.0))
        rs["long_factor"], rs["short_factor"] = rs["long_factor"][:rotary // 2], rs["short_factor"][:rotary // 2]
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(c.get(k), int) and not 0 <= c[k] < VOCAB:
            c[k] = 0
    if isinstance(c.get("eos_token_id"), list):
        c["eos_token_id"] = [e if e < VOCAB else 0 for e in c["eos_token_id"]]
    return c


def _experts_in_intermediate(c: dict) -> bool:
    """Mixtral and OLMoE size their experts by intermediate_size (no moe_intermediate_size)."""
    return c.get("model_type") in ("mixtral", "olmoe")


def _moe(c: dict) -> bool:
    return any(c.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))


def flop_counter_ratio(small: dict) -> tuple[float, float, float]:
    """(meta count, FlopCounterMode's count, ratio) per token of the shrunk copy: eager attention and experts, as
    tests/test_flops.py counts them (FlopCounterMode has no formula for the CPU SDPA kernel nor for transformers'
    grouped-experts fallback)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from trainscout.predictor import flops
    from trainscout.trial.models import build_model
    torch.manual_seed(0)
    model = build_model(small, "eager", S, "float32")
    if _moe(small) and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    model.config.use_cache = False
    ids = torch.randint(0, VOCAB, (1, S))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    theirs = counter.get_total_flops() / ids.numel()
    ours = flops.count(small).per_token(S)
    return ours, theirs, ours / theirs


def one_step_dtypes(small: dict) -> dict[str, set[str]]:
    """One optimizer step of the shrunk copy as a bf16-mixed trial takes it: weights built in the plan's master
    dtype (float32), forward + backward under bf16 autocast, AdamW. The dtypes of the parameters, of the gradients
    (read before zero_grad) and of AdamW's states."""
    import torch

    from trainscout.spaces import ConfigError
    from trainscout.trial.models import build_model
    torch.manual_seed(0)
    try:
        model = build_model(small, "sdpa", S, "float32")
    except ConfigError:  # a class without SDPA (Gemma-2): what the attention knob falls back to
        model = build_model(small, "eager", S, "float32")
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (2, S))
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {str(p.grad.dtype).replace("torch.", "") for p in model.parameters() if p.grad is not None}
    opt.step()
    out = {"params": {str(p.dtype).replace("torch.", "") for p in model.parameters()}, "grads": grads,
           "adamw": {str(v.dtype).replace("torch.", "") for s in opt.state.values() for k, v in s.items()
                     if torch.is_tensor(v) and k != "step"},
           "loss_finite": {str(bool(torch.isfinite(loss).item()))}}
    opt.zero_grad()
    return out


def estimate_gib(path: str) -> float:
    """What `trainscout estimate --model PATH --set micro_batch_size=1` predicts (cli/measure.py's cmd_estimate:
    trial.prepare with one CUDA rank, then memory.predict)."""
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    spec = prepare(path, {"micro_batch_size": 1}, workers=1, hw={"device": "cuda", "gpu_count": 1, "gpu": None})
    return memory.predict(spec) / memory.GiB


def run(path: str) -> dict:
    """Every check of one file, as a row (refused: the reason)."""
    from trainscout.spaces import ConfigError
    from trainscout.predictor import flops
    from trainscout.trial.models import resolve_model
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    row = {"model": os.path.splitext(os.path.basename(path))[0], "model_type": raw.get("model_type"),
           "torch_dtype": raw.get("torch_dtype") or raw.get("dtype")}
    t = time.perf_counter()
    try:
        spec = resolve_model(path)
    except ConfigError as e:
        row["refused"] = str(e).replace(ROOT + os.sep, "")
        return row
    c = flops.count(spec.config)
    row.update(moe=_moe(raw), params=c.total_params, active_params=c.active_params, seq_len=spec.recipe.seq_len,
               flops_per_token=c.per_token(spec.recipe.seq_len), estimate_gib=estimate_gib(path))
    small = shrink(raw)
    row["ours"], row["theirs"], row["flops_ratio"] = flop_counter_ratio(small)
    row["dtypes"] = one_step_dtypes(small)
    row["seconds"] = time.perf_counter() - t
    return row


def table(rows: list[dict]) -> str:
    out = ["| model | model_type | params | torch_dtype in file | estimate GiB (mbs 1) | FLOPs/token (seq) | "
           "shrunk meta / FlopCounterMode | dtypes after one step (params / grads / AdamW) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            out.append(f"| {r['model']} | {r['model_type']} | | {r['torch_dtype'] or '-'} | refused: "
                       f"{r['refused'].replace('|', '/')} | | | |")
            continue
        d = r["dtypes"]
        active = f" ({r['active_params'] / 1e9:.2f}B active)" if r["moe"] else ""
        out.append(f"| {r['model']} | {r['model_type']} | {r['params'] / 1e9:.2f}B{active} | {r['torch_dtype'] or '-'} "
                   f"| {r['estimate_gib']:.1f} | {r['flops_per_token'] / 1e9:.2f} G ({r['seq_len']}) | "
                   f"{r['flops_ratio']:.3f} | {'/'.join(sorted(d['params']))} / {'/'.join(sorted(d['grads']))} / "
                   f"{'/'.join(sorted(d['adamw']))} |")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = []
    for p in files():
        r = run(p)
        rows.append(r)
        if "--json" in argv:
            print(json.dumps(r, default=sorted), flush=True)
    if "--json" not in argv:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
