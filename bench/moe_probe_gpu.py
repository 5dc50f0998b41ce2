"""Facts of the GPU machine's stack that issue 27 builds on, in one run (one H200):
A. transformers / torch / torchao versions, the experts kernels transformers has and picks by default;
B. a small qwen3_moe (4 layers, 32 experts, top-4) under each experts kernel, fp32 weights + bf16 autocast (plain
   PyTorch) and bf16 weights (FSDP2's / DeepSpeed's compute): does it run, step time, peak memory;
C. torchao's float8 grouped GEMM on the experts (prototype moe_training, rowwise): does it intercept transformers'
   grouped_mm call, and its step time;
D. FLOPs per token: torch's FlopCounterMode over a real forward + backward on the GPU against predictor/flops.py, for
   Pythia-1B (untied), the Llama-1B shape (tied, GQA, 128k vocabulary) and the MoE;
E. the quality gate's one step (trial/quality.py) for fp8 tensorwise and rowwise against bf16, Pythia-1B and the
   Llama shape.
Usage: python bench/moe_probe_gpu.py OUT_DIR [SECTIONS]   (e.g. DEC: each section in a process of its own, as a
failed CUDA kernel poisons the process: the first run's C did, and D and E never ran)
"""
import json
import os
import sys
import time
import traceback

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
MOE = dict(model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
           num_key_value_heads=4, head_dim=64, intermediate_size=2048, moe_intermediate_size=512, num_experts=32,
           num_experts_per_tok=4, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
rows = {}


def log(section, key, value):
    rows.setdefault(section, {})[key] = value
    print(f"[{section}] {key}: {value}", flush=True)


def build(cfg, attn="sdpa", **kw):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), attn_implementation=attn, **kw)
    m.config.use_cache = False
    m.train()
    return m


def step_time(model, ids, autocast: bool, n=5):
    times = []
    for i in range(n + 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def section_a():
    import transformers
    log("A", "torch", torch.__version__)
    log("A", "transformers", transformers.__version__)
    try:
        import torchao
        log("A", "torchao", torchao.__version__)
    except ImportError as e:
        log("A", "torchao", f"missing: {e}")
    log("A", "F.grouped_mm", hasattr(torch.nn.functional, "grouped_mm"))
    log("A", "torch._grouped_mm", hasattr(torch, "_grouped_mm"))
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        log("A", "experts kernels", sorted(ALL_EXPERTS_FUNCTIONS.keys()))
    except Exception as e:  # noqa: BLE001 - a transformers without them: said, and on
        log("A", "experts kernels", f"{type(e).__name__}: {e}")
    m = build(dict(MOE, num_hidden_layers=1))
    log("A", "default experts_implementation", getattr(m.config, "_experts_implementation", None))
    log("A", "set_experts_implementation", hasattr(m, "set_experts_implementation"))
    del m


def section_b():
    ids = torch.randint(0, MOE["vocab_size"], (4, 1024), device="cuda")
    for impl in ("eager", "grouped_mm", "batched_mm"):
        for weights in ("fp32+autocast", "bf16"):
            try:
                m = build(MOE, experts_implementation=impl)
                if weights == "bf16":
                    m.to(torch.bfloat16)
                torch.cuda.reset_peak_memory_stats()
                s = step_time(m, ids, autocast=weights != "bf16")
                log("B", f"{impl} {weights}", f"{s * 1e3:.1f} ms/step, peak "
                                              f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
            except Exception as e:  # noqa: BLE001 - a case that fails is logged, the next runs
                log("B", f"{impl} {weights}", f"FAILS {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            finally:
                m = None
                torch.cuda.empty_cache()


def section_c():
    ids = torch.randint(0, MOE["vocab_size"], (4, 1024), device="cuda")
    try:
        from torchao.prototype.moe_training import tensor as moe_tensor
        from torchao.prototype.moe_training.config import Float8TrainingOpConfig
        from torchao.quantization import quantize_
    except Exception as e:  # noqa: BLE001 - a torchao without the MoE prototype
        log("C", "import", f"{type(e).__name__}: {e}")
        return
    calls = [0]
    orig = moe_tensor._quantize_then_scaled_grouped_mm

    def counted(*a, **k):
        calls[0] += 1
        return orig(*a, **k)
    moe_tensor._quantize_then_scaled_grouped_mm = counted
    for weights in ("bf16", "fp32+autocast"):
        try:
            m = build(MOE, experts_implementation="grouped_mm")
            if weights == "bf16":
                m.to(torch.bfloat16)
            # token groups padded to multiples of 16: unpadded, the grouped GEMM's alignment assert fired
            quantize_(m, Float8TrainingOpConfig(float8_linear_recipe="rowwise", pad_token_groups_for_grouped_mm=True),
                      filter_fn=lambda mod, fqn: fqn.endswith("mlp.experts"))
            calls[0] = 0
            s = step_time(m, ids, autocast=weights != "bf16")
            log("C", f"fp8 rowwise experts {weights}", f"{s * 1e3:.1f} ms/step, fp8 grouped GEMM calls {calls[0]}")
        except Exception as e:  # noqa: BLE001 - a case that fails is logged, the next runs
            log("C", f"fp8 rowwise experts {weights}", f"FAILS {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            traceback.print_exc()
        finally:
            m = None
            torch.cuda.empty_cache()


def section_d():
    from torch.utils.flop_counter import FlopCounterMode

    from trainscout.predictor import flops
    from trainscout.trial.models import resolve_model
    llama = json.load(open(os.path.join(os.path.dirname(__file__), "models", "llama-1b.json")))
    for name, cfg, s, kw in (("pythia-1b", resolve_model("pythia-1b").config, 2048, {}),
                             ("llama-1b shape", llama, 2048, {}),
                             ("qwen3_moe probe", MOE, 1024, {"experts_implementation": "eager"})):
        for attn in ("sdpa", "eager"):
            try:
                m = build(cfg, attn=attn, **kw)
                ids = torch.randint(0, cfg["vocab_size"], (1, s), device="cuda")
                with FlopCounterMode(display=False) as fc:
                    with torch.autocast("cuda", torch.bfloat16):
                        loss = m(input_ids=ids, labels=ids).loss
                    loss.backward()
                theirs = fc.get_total_flops() / s
                ours = flops.count(cfg).per_token(s)
                log("D", f"{name} {attn}", f"FlopCounterMode {theirs / 1e9:.4f} GFLOP/token, trainscout "
                                           f"{ours / 1e9:.4f}, ratio {ours / theirs:.4f}")
            except Exception as e:  # noqa: BLE001 - a case that fails is logged, the next runs
                log("D", f"{name} {attn}", f"FAILS {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            finally:
                m = None
                torch.cuda.empty_cache()


def section_e():
    from trainscout.trial import prepare, quality
    llama = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "llama-1b.json")
    for model in ("pythia-1b", llama):
        for fp8 in ("tensorwise", "rowwise"):
            try:
                spec = prepare(model, {"fp8": fp8, "micro_batch_size": 1}, device="cuda", seq_len=2048,
                               global_batch=8)
                q = quality.one_step(spec, torch.device("cuda"))
                log("E", f"{os.path.basename(model)} fp8={fp8}",
                    f"{q['gate']}: linear outputs {q['op_sqnr_db']} dB (worst {q['worst_op']}), all gradients "
                    f"{q['grad_sqnr_db']} dB (worst {q['worst_grad_sqnr_db']} dB {q['worst_tensor']}), loss "
                    f"{q['loss']:.4f} vs {q['reference_loss']:.4f}, {q['seconds']:.1f} s")
            except Exception as e:  # noqa: BLE001 - a case that fails is logged, the next runs
                log("E", f"{os.path.basename(model)} fp8={fp8}", f"FAILS {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc()
            torch.cuda.empty_cache()


chosen = sys.argv[2] if len(sys.argv) > 2 else "ABCDE"
for f in [globals()[f"section_{c.lower()}"] for c in chosen]:
    t0 = time.time()
    try:
        f()
    except Exception:  # noqa: BLE001 - a part that fails leaves the others to run
        traceback.print_exc()
    print(f"-- {f.__name__} {time.time() - t0:.1f} s", flush=True)
with open(os.path.join(OUT, f"moe_probe_{chosen}.json"), "w") as fh:
    json.dump(rows, fh, indent=1)
