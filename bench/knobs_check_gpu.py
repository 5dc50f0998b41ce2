"""GPU correctness of the knobs that cannot run on the CPU (loss_kernel=fused_linear: liger-kernel's Triton kernels;
fp8: torchao float8 matmuls on Hopper): each applied through trainscout.runtime.prepare_model, as the trial engines
apply it, and compared with the same model without it on the same batch.

Usage: python bench/knobs_check_gpu.py   (one GPU; prints a table; exit 1 if a check fails)
- fused_linear vs the model's own loss, fp32 (no autocast): loss and every gradient (relative error).
- fp8 vs bf16 autocast: the first loss, and the loss after 30 AdamW steps on one batch (both must learn alike).
"""
import copy
import os
import sys

import torch

from trainscout.runtime import prepare_model
from trainscout.spaces import resolve
from trainscout.trial import hardware
from trainscout.trial.models import gpt_neox, build_model
from trainscout.trial.runner import context

LLAMA_SMALL = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 128256,
               "tie_word_embeddings": True, "max_position_embeddings": 2048}
MODELS = {"pythia-70m shape": gpt_neox(512, 6, 8), "llama 4-layer, 128k tied vocab": LLAMA_SMALL}
SEQ, BATCH = 512, 4


def plan(config, settings):
    hw = hardware.fingerprint("cuda", 1)
    return resolve(settings, context(config, BATCH, 1, hw))[1]


def loss_and_grads(model, batch, dtype=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def train(model, batch, steps, dtype):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
    return loss.item()


def main():
    rows, ok = [], True
    for name, config in MODELS.items():
        torch.manual_seed(0)
        base = build_model(config, "sdpa", SEQ).cuda()
        batch = torch.randint(0, config["vocab_size"], (BATCH, SEQ), device="cuda")
        # fused_linear, fp32: the same loss and gradients as the model's own loss
        ref_loss, ref_g = loss_and_grads(base, batch)
        fused = prepare_model(copy.deepcopy(base), plan(config, {"loss_kernel": "fused_linear", "precision": "fp32"}))
        loss, g = loss_and_grads(fused, batch)
        worst = max(rel(g[n], ref_g[n]) for n in ref_g)
        good = abs(loss - ref_loss) / ref_loss < 1e-4 and worst < 1e-3 and set(g) == set(ref_g)
        ok &= good
        rows.append((name, "fused_linear vs eager (fp32)", f"{ref_loss:.5f} / {loss:.5f}",
                     f"grad rel err max {worst:.2e}", good))
        # fp8 under bf16 autocast: first loss close, and 30 steps learn alike
        for recipe in ("tensorwise", "rowwise"):
            ref = copy.deepcopy(base)
            fp8 = prepare_model(copy.deepcopy(base), plan(config, {"fp8": recipe}))
            n8 = sum(type(m).__name__ == "Float8Linear" for m in fp8.modules())
            l0_ref, _ = loss_and_grads(ref, batch, torch.bfloat16)
            l0, _ = loss_and_grads(fp8, batch, torch.bfloat16)
            end_ref, end = train(ref, batch, 30, torch.bfloat16), train(fp8, batch, 30, torch.bfloat16)
            good = n8 > 0 and abs(l0 - l0_ref) / l0_ref < 0.02 and end < 0.5 * l0 and abs(end - end_ref) < 0.1 * l0
            ok &= good
            rows.append((name, f"fp8 {recipe} vs bf16 ({n8} Float8Linear)", f"{l0_ref:.4f} / {l0:.4f}",
                         f"after 30 steps {end_ref:.4f} / {end:.4f}", good))
    print(f"{'model':32} {'check':40} {'loss ref / knob':20} {'detail':34} ok")
    for r in rows:
        print(f"{r[0]:32} {r[1]:40} {r[2]:20} {r[3]:34} {'yes' if r[4] else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    sys.exit(main())
