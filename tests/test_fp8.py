"""The fp8 knob: refused where FP8 tensor cores or torchao are missing (with the fix), and its transform, run for
real through torchao on the CPU (torch's CPU _scaled_mm), swaps the decoder's linears for Float8Linear before the
layers are checkpointed, keeps the head in high precision, and trains like bf16."""
import copy

import pytest
import torch

from trainscout.runtime import prepare_model
from trainscout.spaces import ConfigError, Context, resolve
from trainscout.trial.models import build_model, resolve_model

torchao = pytest.importorskip("torchao")  # the test extra installs it (pyproject [test])
H200 = Context(device="cuda", capability="9.0", installed=frozenset({"torchao"}), num_layers=2, global_batch=4)


@pytest.mark.parametrize("ctx, settings, fix", [
    (Context(device="cpu", num_layers=2, global_batch=4), {}, "set fp8=off"),
    (Context(device="cuda", capability="8.0", installed=frozenset({"torchao"}), num_layers=2, global_batch=4), {},
     "compute capability 8.9"),
    (Context(device="cuda", capability="9.0", num_layers=2, global_batch=4), {}, "pip install torchao"),
    (H200, {"precision": "fp16-mixed"}, "set precision=bf16-mixed"),
    (H200, {"zero_stage": 1}, "set zero_stage=0 or fp8=off"),
])
def test_fp8_is_refused_where_it_cannot_run(ctx, settings, fix):
    with pytest.raises(ConfigError, match="fp8") as e:
        resolve({"fp8": "tensorwise", **settings}, ctx)
    assert fix in str(e.value)


def _plan(**settings):
    return resolve({"micro_batch_size": 4, **settings}, H200)[1]


def test_fp8_swaps_the_decoder_linears_before_checkpointing_and_keeps_the_head():
    model = build_model(resolve_model("tiny").config, "sdpa", 64)
    plan = _plan(fp8="rowwise", activation_checkpointing="full")
    assert plan.knobs == {"fp8": "rowwise"}
    prepare_model(model, plan)
    layers = model.gpt_neox.layers
    assert all(type(layer).__name__ == "CheckpointWrapper" for layer in layers)
    inner = [m for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    assert inner and all(type(m).__name__ == "Float8Linear" for m in inner)
    assert type(model.get_output_embeddings()).__name__ == "Linear"  # the head stays high precision
    off = build_model(resolve_model("tiny").config, "sdpa", 64)
    prepare_model(off, _plan())
    assert not any(type(m).__name__ == "Float8Linear" for m in off.modules())


def test_fp8_trains_like_bf16():
    torch.manual_seed(0)
    base = build_model(resolve_model("tiny").config, "sdpa", 64)
    # one sequence of 32 tokens, 10 steps: the CPU's _scaled_mm is a reference kernel, its time grows with the tokens
    batch = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(1))
    losses = {}
    for name, plan in (("bf16", _plan()), ("fp8", _plan(fp8="tensorwise"))):
        model = prepare_model(copy.deepcopy(base), plan)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        run = []
        for _ in range(10):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            run.append(loss.item())
        losses[name] = run
    assert losses["fp8"][0] == pytest.approx(losses["bf16"][0], rel=0.02)  # the same model, FP8 matmuls
    assert losses["fp8"][-1] < 0.8 * losses["fp8"][0]  # it learns
    assert losses["fp8"][-1] == pytest.approx(losses["bf16"][-1], rel=0.1)  # as bf16 does
