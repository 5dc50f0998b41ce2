"""What the atlas' leave-one-model-out lacks, measured on one GPU (issue 47):

- part A, the LM head at an unaligned vocabulary: the head's three GEMMs (logits = x W^T, its input gradient and its
  weight gradient) and the fp32 cross-entropy between them, bf16, at vocabularies aligned and not (Granite's 49,155
  against 49,152; GPT-2's 50,257 against 50,304), hidden 2048 and 4096, 16,384 tokens: the median of --iters
  CUDA-event-timed passes each, and each vocabulary's time per FLOP against the aligned one's;
- part B, the same at the model's level: Granite-1.6B (bench/models/granite-1.6b.json, vocabulary 49,155) against
  the same config.json at 49,152, one trial each (compile per layer, compiled loss, micro-batch --b-micro, bf16-mixed):
  printed only, not a record for the atlas (a sibling model that differs in its vocabulary alone would calibrate
  Granite's held-out rows);
- part C, ZeRO-3 on one GPU, which the atlas measured on one model (Pythia-410M): Pythia-160M and Pythia-1B at
  micro-batch 8, eager, ZeRO stage 0 against 3, one trial each, appended to --out as records (the atlas reads
  them: bench/build_atlas.py takes a .jsonl's "record" lines).

Usage: python bench/atlas_gaps_gpu.py [--parts ABC] [--out FILE.jsonl] [--iters 20] [--b-micro 16]
       [--c-models pythia-160m,pythia-1b]
Smoke run on the CPU: python bench/atlas_gaps_gpu.py --device cpu --parts AC --tokens 256 --iters 2 --steps 2
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VOCABS = {2048: (49152, 49155, 49156, 49160, 49216, 100352), 4096: (50304, 50257, 32000, 32001)}


def head_ms(torch, hidden: int, vocab: int, tokens: int, iters: int, device: str) -> float:
    """Median milliseconds of the head's forward and backward (logits, fp32 cross-entropy, both gradients)."""
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(tokens, hidden, device=device, dtype=dt, generator=g, requires_grad=True)
    w = (torch.randn(vocab, hidden, device=device, dtype=dt, generator=g) * hidden ** -0.5).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device, generator=g)

    def once():
        loss = torch.nn.functional.cross_entropy((x @ w.t()).float(), y)
        loss.backward()
        x.grad = w.grad = None
    for _ in range(3):
        once()
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            once()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            once()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def part_a(args) -> None:
    import torch
    print(f"\n### A. the LM head's GEMMs and loss, {args.tokens} tokens, bf16 ({args.device})\n")
    print("| hidden | vocab | vocab mod 8 / 64 | ms (median) | ms per GFLOP-equivalent | against the aligned |")
    print("|---|---|---|---|---|---|")
    for hidden, vocabs in VOCABS.items():
        base = None
        for v in vocabs:
            ms = head_ms(torch, hidden, v, args.tokens, args.iters, args.device)
            per = ms / (6 * args.tokens * hidden * v / 1e9)
            if v % 64 == 0 and base is None:
                base = per
            print(f"| {hidden} | {v} | {v % 8} / {v % 64} | {ms:.3f} | {per:.5f} | "
                  f"{per / base if base else float('nan'):.3f}x |")
            sys.stdout.flush()
        if args.device == "cuda":
            torch.cuda.empty_cache()


def trial(args, model: str, settings: dict):
    from trainscout.trial import execute, prepare
    spec = prepare(model, settings, device=args.device, workers=1, steps=args.steps, warmup=2,
                   measure_accum=2, global_batch=settings["micro_batch_size"] * 2)
    return execute(spec, timeout=args.timeout)


def row(label: str, rec) -> str:
    if not rec.ok:
        return f"| {label} | {rec.status}: {(rec.error or '')[:160]} | | |"
    m = rec.metrics
    return f"| {label} | {m['tokens_per_s']:,.0f} | {m['step_s']:.4f} | {m.get('peak_memory_gib') or 0:.1f} |"


def part_b(args) -> None:
    with open(os.path.join(HERE, "models", "granite-1.6b.json"), encoding="utf-8") as f:
        base = json.load(f)
    settings = {"compile": True, "compile_scope": "layers", "loss_kernel": "compiled", "micro_batch_size": args.b_micro,
                "precision": "bf16-mixed"}
    if args.device == "cpu":
        settings = {"micro_batch_size": 1}
    print(f"\n### B. Granite-1.6B at vocabulary 49,155 and 49,152 ({args.device}; not records)\n")
    print("| model | tokens/s | step s | peak GiB |")
    print("|---|---|---|---|")
    got = {}
    for vocab in (49155, 49152):
        with tempfile.NamedTemporaryFile("w", suffix=f"-granite-v{vocab}.json", delete=False) as f:
            json.dump(dict(base, vocab_size=vocab), f)
        rec = trial(args, f.name, settings)
        got[vocab] = rec.metrics.get("tokens_per_s") if rec.ok else None
        print(row(f"granite-1.6b vocab {vocab}", rec))
        sys.stdout.flush()
    if all(got.values()):
        print(f"\n49,152 against 49,155: {got[49152] / got[49155]:.3f}x the tokens/s")


def part_c(args) -> None:
    print(f"\n### C. ZeRO-3 on one GPU ({args.device}; records appended to {args.out})\n")
    print("| model | zero_stage | tokens/s | step s | peak GiB |")
    print("|---|---|---|---|---|")
    models = tuple(args.c_models.split(",")) if args.device == "cuda" else ("tiny",)
    for model in models:
        for stage in (0, 3):
            settings = {"micro_batch_size": 8 if args.device == "cuda" else 1, "compile": False, "zero_stage": stage,
                        "precision": "bf16-mixed"}
            rec = trial(args, model, settings)
            print(row(f"{model} | {stage}", rec))
            sys.stdout.flush()
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"settings": settings, "record": rec.to_dict()}, default=str) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="ABC")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", default=None)
    ap.add_argument("--b-micro", type=int, default=16, help="part B's micro-batch (an H100 ran out of memory at 16)")
    ap.add_argument("--c-models", default="pythia-160m,pythia-1b", help="part C's models, comma-separated")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch
        print(torch.cuda.get_device_name(), torch.__version__)
    for p in args.parts:
        {"A": part_a, "B": part_b, "C": part_c}[p](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
