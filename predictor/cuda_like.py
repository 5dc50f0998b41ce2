"""A TorchFunctionMode that does on the meta device what a CUDA GPU does, for saved_bytes.py, partitioned.py and
flops.py.

The meta device runs no kernels, so two things a CUDA GPU does are done here by hand, in a TorchFunctionMode:
- autocast (torch.autocast has no meta backend): the linears and matmuls run in 16 bits; layer norm, softmax, pow,
  rsqrt, exp, sum and the losses in fp32; the rest (RMSNorm's F.rms_norm, SiLU, GELU) in its inputs' dtype;
  weights are cast once per forward;
- SDPA's fused kernels: on meta, F.scaled_dot_product_attention takes its math path (it saves the s x s scores);
  an H200 runs cuDNN attention on 16-bit inputs and the memory-efficient kernel on fp32 ones (see _sdpa).
Checked against a GPU's saved bytes: docs/predictor.md.
"""


def storage_id(t) -> int:
    """The identity of a tensor's storage (meta storages have no data pointer to compare)."""
    return t.untyped_storage()._cdata


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


def cuda_like_mode(low, fused):
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
                self.casts.add(storage_id(self._weights[id(x)][1]))
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
    """F.scaled_dot_product_attention as an H200 runs it (docs/predictor.md): 16-bit inputs go
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
