"""Which scaled_dot_product_attention backends run grouped-query attention as transformers calls it on a GPU
(no mask, is_causal=True, enable_gqa=True: 32 query heads over 8 key/value heads, head dim 64, bf16), forward and
backward, eager and compiled. One line per case; the sdpa_backend knob's GQA check rests on this table.

    python bench/sdpa_gqa_gpu.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for mode in ("eager", "compiled"):
        for name, backend in BACKENDS.items():
            torch.compiler.reset()
            q = torch.randn(2, 32, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(2, 8, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
            fn = torch.compile(attend) if mode == "compiled" else attend
            try:
                with sdpa_kernel(backend):
                    fn(q, k, v).sum().backward()
                torch.cuda.synchronize()
                out = "ok"
            except Exception as e:  # noqa: BLE001 - the table is what runs and what does not
                out = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            print(f"{mode:9} {name:10} {out}", flush=True)


if __name__ == "__main__":
    main()
