"""loss_kernel=fused_linear: refused where liger-kernel's Triton kernels cannot run or would compute the wrong loss
(with the fix); the forward it installs gives the model's own loss and gradients, with and without HF Trainer's
num_items_in_batch; the memory model drops the logits. liger's kernel needs a GPU (Triton), so on the CPU the forward
is checked with PyTorch's linear + cross-entropy in liger's place (named here as the stand-in it is); the GPU check
with liger itself is bench/knobs_check_gpu.py (docs/BENCHMARKS.md)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from trainscout.spaces import ConfigError, Context, resolve
from trainscout.spaces.knobs.loss_kernel import _fused_linear_forward
from trainscout.predictor import memory
from trainscout.trial.models import TINY_RECIPE, build_model, resolve_model
from trainscout.trial.records import Record

H200 = Context(device="cuda", capability="9.0", installed=frozenset({"liger_kernel"}), num_layers=2, global_batch=4,
               world_size=2)


@pytest.mark.parametrize("ctx, settings, fix", [
    (Context(device="cpu", num_layers=2, global_batch=4), {}, "needs a CUDA GPU and pip install liger-kernel"),
    (Context(device="cuda", capability="9.0", num_layers=2, global_batch=4), {}, "pip install liger-kernel"),
    (H200, {"pipeline_stages": 2}, "set loss_kernel=compiled or pipeline_stages=1"),
    (H200, {"zero_stage": 3}, "set zero_stage=2 or loss_kernel=compiled"),
    (Context(device="cuda", installed=frozenset({"liger_kernel"}), num_layers=2, global_batch=4,
             model_config={"final_logit_softcapping": 30.0}), {}, "final_logit_softcapping"),
])
def test_fused_linear_is_refused_where_it_cannot_run(ctx, settings, fix):
    with pytest.raises(ConfigError, match="loss_kernel") as e:
        resolve({"loss_kernel": "fused_linear", "micro_batch_size": 1, **settings}, ctx)
    assert fix in str(e.value)


class TorchLinearCrossEntropy:
    """Stand-in for liger's LigerFusedLinearCrossEntropyLoss on the CPU (same call: weight, hidden, target, bias)."""

    def __init__(self, reduction):
        self.reduction = reduction

    def __call__(self, weight, hidden, target, bias=None):
        return F.cross_entropy(F.linear(hidden, weight, bias).float(), target, reduction=self.reduction)


@pytest.mark.parametrize("model_name", ["tiny", "llama"])
def test_fused_forward_gives_the_models_own_loss_and_gradients(model_name, tmp_path):
    torch.manual_seed(0)
    config = resolve_model("tiny").config if model_name == "tiny" else {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True}
    ref = build_model(config, "sdpa", 32)
    fused = copy.deepcopy(ref)
    fused.forward = _fused_linear_forward(fused, fused=TorchLinearCrossEntropy)
    batch = torch.randint(0, 512, (2, 32))
    labels = batch.clone()
    labels[:, :5] = -100  # ignored positions, as a padded batch has them
    for kw in ({}, {"num_items_in_batch": torch.tensor(40)}):  # HF Trainer passes the count over the accumulation
        losses = []
        for model in (ref, fused):
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=batch, labels=labels, **kw).loss
            loss.backward()
            losses.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        assert losses[1][0] == pytest.approx(losses[0][0], rel=1e-5)
        for n, g in losses[0][1].items():
            torch.testing.assert_close(losses[1][1][n], g, rtol=1e-4, atol=1e-6)
    # without labels the logits come back, as from the model's own forward
    torch.testing.assert_close(fused(input_ids=batch).logits, ref(input_ids=batch).logits)


def test_memory_model_drops_the_logits_with_fused_linear():
    llama = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "vocab_size": 128256,
             "intermediate_size": 8192, "tie_word_embeddings": True}
    ctx = Context(device="cuda", capability="9.0", installed=frozenset({"liger_kernel"}), num_layers=16,
                  global_batch=16, model_config=llama)
    terms = {}
    for kernel in ("eager", "compiled", "fused_linear"):
        cfg, plan = resolve({"loss_kernel": kernel, "micro_batch_size": 16}, ctx)
        rec = Record.from_dict({"model": "llama", "config": cfg, "status": "ok", "model_config": llama, "world_size": 1,
                                "plan": plan.to_dict(), "recipe": dict(TINY_RECIPE.to_dict(), seq_len=2048)})
        terms[kernel] = memory.components(rec)["logits"]
    b, s, V = 16, 2048, 128256
    assert terms["eager"] == 12 * b * s * V and terms["compiled"] == 4 * b * s * V
    assert terms["fused_linear"] < 0.05 * terms["eager"]  # one chunk of logits (fp32 + bf16) and the head's fp32 grad
