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

- part D, the loss kernels' memory traffic (eager, compiled, fused_linear) over the head's GEMMs alone: the bytes per
  token and vocabulary entry that loss_kernel's `logits_bytes` declares (printed, not records).

Usage: python bench/atlas_gaps_gpu.py [--parts ABCD] [--out FILE.jsonl] [--iters 20] [--b-micro 16]
       [--c-models pythia-160m,pythia-1b]
Smoke run on the CPU: python bench/atlas_gaps_gpu.py --device cpu --parts ACD --tokens 256 --iters 2 --steps 2
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VOCABS = {2048: (49152, 49155, 49156, 49160, 49216, 100352), 4096: (50304, 50257, 32000, 32001)}


def _timed(torch, fn, iters: int, device: str) -> float:
    """Median milliseconds of fn() over iters calls, after 3 warm-up calls (CUDA events on the GPU)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


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
    return _timed(torch, once, iters, device)


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


LOSS_SHAPES = ((768, 50304), (2048, 50304), (2048, 128256))  # (hidden, vocab): Pythia-160M's and 1B's head, Llama-3's


def part_d(args) -> None:
    """The loss kernels' memory traffic: the head's three GEMMs alone (backward from a fixed 16-bit gradient) against
    the head with transformers' causal-LM loss (ForCausalLMLoss, what a trial's model calls) run eager, compiled by
    torch.compile (loss_kernel=compiled) and liger's fused linear cross-entropy (fused_linear, where installed); the
    time over the GEMMs' at the GPU's memory bandwidth (steptime.GPU_HBM_TBPS), per token and vocabulary entry:
    the bytes loss_kernel's `logits_bytes` declares."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from trainscout.predictor import steptime
    dev = args.device
    tbps = steptime._lookup(steptime.GPU_HBM_TBPS, torch.cuda.get_device_name() if dev == "cuda" else None,
                            steptime.DEFAULT_TBPS)
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        LigerFusedLinearCrossEntropyLoss = None
    compiled = torch.compile(ForCausalLMLoss)
    print(f"\n### D. the loss kernels' traffic, {args.tokens} tokens, bf16 ({dev}, {tbps} TB/s)\n")
    print("| hidden | vocab | kernel | ms (median) | ms over the GEMMs | bytes per token and vocabulary entry |")
    print("|---|---|---|---|---|---|")
    for hidden, vocab in LOSS_SHAPES:
        if dev != "cuda":
            hidden, vocab = hidden // 8, vocab // 64
        g = torch.Generator(device=dev).manual_seed(0)
        dt = torch.bfloat16
        x = torch.randn(1, args.tokens, hidden, device=dev, dtype=dt, generator=g, requires_grad=True)
        w = (torch.randn(vocab, hidden, device=dev, dtype=dt, generator=g) * hidden ** -0.5).requires_grad_()
        y = torch.randint(0, vocab, (1, args.tokens), device=dev, generator=g)
        grad = torch.randn(1, args.tokens, vocab, device=dev, dtype=dt, generator=g) * 1e-4

        def clear():
            x.grad = w.grad = None

        def gemms():
            (x @ w.t()).backward(grad)
            clear()

        def hf(loss_fn):
            def run():
                loss_fn(x @ w.t(), y, vocab).backward()
                clear()
            return run

        def fused():
            LigerFusedLinearCrossEntropyLoss()(w, x[0, :-1], y[0, 1:]).backward()
            clear()
        cases = [("gemms", gemms), ("eager", hf(ForCausalLMLoss)), ("compiled", hf(compiled))]
        if LigerFusedLinearCrossEntropyLoss is not None and dev == "cuda":
            cases.append(("fused_linear", fused))
        base = None
        for name, fn in cases:
            try:
                ms = _timed(torch, fn, args.iters, dev)
            except Exception as e:  # noqa: BLE001 - a kernel this box cannot run: say so, go on
                print(f"| {hidden} | {vocab} | {name} | {type(e).__name__}: {str(e)[:120]} | | |")
                continue
            base = ms if name == "gemms" else base
            over = ms - base
            per = over * 1e-3 * tbps * 1e12 / (args.tokens * vocab)
            print(f"| {hidden} | {vocab} | {name} | {ms:.3f} | {over:.3f} | {per:.1f} |" if name != "gemms" else
                  f"| {hidden} | {vocab} | {name} | {ms:.3f} | - | - |")
            sys.stdout.flush()
        x = w = y = grad = None  # their memory back before the next shape (not del: the closures above read them)
        if dev == "cuda":
            torch.cuda.empty_cache()


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
        {"A": part_a, "B": part_b, "C": part_c, "D": part_d}[p](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
