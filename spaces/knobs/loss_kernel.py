from ..errors import ConfigError
from ..knob import Knob, register
from ..model_config import sizes
from ..roles import Costs, Export, Numerics, Runtime, Search

# config fields of models whose logits are more than the head's product: a fused linear cross-entropy would skip them
_LOGIT_EXTRAS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


class LossKernelRuntime(Runtime):
    def transform(self, model, plan):
        if plan.loss_kernel == "compiled":  # the HF model's loss; the pipeline engine calls the same function
            import torch
            model.loss_function = torch.compile(model.loss_function)
        elif plan.loss_kernel == "fused_linear":
            model.forward = _fused_linear_forward(model)
        return model


class LossKernelCosts(Costs):
    def head_s(self, value, spec, tokens, product_s, bytes_per_s):
        """Seconds of the head and its loss in one micro-batch where liger runs them (fused_linear; None: the
        step-time model's own, predictor/steptime.head_s): chunk by chunk (liger's chunk size), each chunk's three
        products at the GPU's peak (product_s a token) or, where longer, the weight they read twice and the weight's
        gradient they add into (16-bit weights read: 2 B each; the gradient accumulated in fp32 under fp32 masters,
        read and written: 8 B, else 4 B), then its logits' loss (logits_bytes); fp32 masters are cast to 16 bits once
        (4 B read, 2 written). At few tokens a chunk reads the whole weight for a few rows: memory-bound. Checked
        against a GPU: docs/knobs-why.md."""
        if value != "fused_linear":
            return None
        z = sizes(spec.model_config)
        chunk = _chunk(tokens, z.vocab, z.hidden)
        chunks = -(-tokens // chunk)
        w = z.vocab * z.hidden
        acc = 8 if spec.plan.master_dtype == "float32" else 4
        per = max(chunk * product_s, w * (2 * 2 + acc) / bytes_per_s) + \
            chunk * z.vocab * self.logits_bytes["fused_linear"] / bytes_per_s
        return chunks * per + (w * 6 / bytes_per_s if acc == 8 else 0.0)

    def memory(self, terms, plan, spec):
        b, s, V = plan.micro_batch_size, spec.recipe["seq_len"], sizes(spec.model_config).vocab
        if plan.loss_kernel == "compiled":  # no fp32 copy of the logits: 8·b·s·V bytes fewer (measured)
            terms.logits -= 8 * b * s * V
        elif plan.loss_kernel == "fused_linear":  # one chunk of logits (fp32 and 16-bit) and the head's fp32 grad
            h = sizes(spec.model_config).hidden
            chunk = _chunk(b * s, V, h)
            terms.logits = 6 * chunk * V + 4 * V * h


class LossKernelNumerics(Numerics):
    def why(self, value, cfg, ctx):
        # compiled: the same ops in fused kernels; fused_linear: the head and the loss in chunks, another summation
        return "liger's chunked fused linear cross-entropy" if value == "fused_linear" else None


@register
class LossKernel(Knob):
    """How the cross-entropy loss runs: eager (PyTorch ops, fp32 copy of the logits), compiled on its own by
    torch.compile, or fused_linear (liger-kernel: the head's matmul and the loss in chunks, no logits kept)."""

    name = "loss_kernel"
    default = "eager"
    choices = ("eager", "compiled", "fused_linear")
    runtime = LossKernelRuntime(stage="loss", packages=("liger_kernel",))
    # compiled along with the layers, which leave the loss out
    search = Search(start=(1, "compiled"), start_follows=True, demo="eager")
    export = Export(without_hook="eager", hook_rank=3)
    numerics = LossKernelNumerics()
    # Why: with compile_scope=layers the loss runs outside every compiled graph. Eager, it copies the logits to fp32
    # and reads them several times; torchtitan compiles its loss for the same reason. The model compiled whole
    # already fuses it (no change). fused_linear: the logits are most of the activation memory at a large
    # vocabulary; liger computes them chunk by chunk and never keeps them. The numbers: docs/knobs-why.md.

    # The bytes the head's logits move per token and vocabulary entry, at the GPU's memory bandwidth (the roofline's
    # unit, predictor/steptime.py; the model compiled whole counts as compiled): eager and compiled measured
    # (medians), fused_linear counted as each of its chunks' kernels reading its inputs and writing its outputs once
    costs = LossKernelCosts(logits_bytes={"eager": 52.0, "compiled": 9.4, "fused_linear": 10.0})

    def check(self, value, cfg, ctx):
        if value != "fused_linear":
            return
        if ctx.device != "cuda" or "liger_kernel" not in ctx.installed:
            raise ConfigError(self.name, "loss_kernel=fused_linear runs liger-kernel's Triton kernels: it needs a CUDA "
                                         "GPU and pip install liger-kernel; set loss_kernel=compiled or eager")
        if cfg["pipeline_stages"] > 1:
            raise ConfigError(self.name, "loss_kernel=fused_linear replaces the model's forward, which the pipeline's "
                                         "stages do not run: set loss_kernel=compiled or pipeline_stages=1")
        if cfg["zero_stage"] == 3:
            raise ConfigError(self.name, "loss_kernel=fused_linear reads the head's weight outside its forward, where "
                                         "ZeRO-3 has not gathered it: set zero_stage=2 or loss_kernel=compiled")
        extras = [k for k in _LOGIT_EXTRAS if ctx.model_config.get(k) not in (None, 1, 1.0)]
        if extras:
            raise ConfigError(self.name, f"loss_kernel=fused_linear computes plain head logits, but the model scales "
                                         f"them ({', '.join(extras)}): set loss_kernel=compiled")

    def apply(self, plan, value, cfg, ctx):
        plan.loss_kernel = value


def _chunk(tokens: int, vocab: int, hidden: int) -> int:
    """liger's chunk of tokens: the power of two at or over tokens / ceil(vocab / hidden), at most tokens."""
    return min(tokens, 2 ** max(0, (-(-tokens // -(-vocab // hidden)) - 1).bit_length()))


def _fused_linear_forward(model, fused=None):
    """The model's forward with the head and the loss fused (liger-kernel): the decoder's hidden states go to
    LigerFusedLinearCrossEntropyLoss with the head's weight, shifted as transformers' causal-LM loss shifts them.
    Without labels it returns the logits as before; with num_items_in_batch (HF Trainer's accumulation) it sums.
    `fused(reduction)` builds the loss (liger's by default; the CPU tests pass PyTorch's, as liger needs Triton)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    if fused is None:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss as fused
    decoder, head = model.base_model, model.get_output_embeddings()
    mean, total = fused(reduction="mean"), fused(reduction="sum")

    def forward(input_ids=None, labels=None, num_items_in_batch=None, **kwargs):
        kwargs.pop("logits_to_keep", None)
        hidden = decoder(input_ids=input_ids, **kwargs)[0]
        if labels is None:
            return CausalLMOutputWithPast(logits=head(hidden))
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        y = labels[:, 1:].reshape(-1).to(h.device)
        if num_items_in_batch is None:
            return CausalLMOutputWithPast(loss=mean(head.weight, h, y, head.bias))
        return CausalLMOutputWithPast(loss=total(head.weight, h, y, head.bias) / num_items_in_batch)
    return forward
