"""The one-step gate judged against the gradient's own noise (trial/quality.py, issue 59) and the FP8 recipes the
field uses as knobs (spaces/knobs/fp8_weight_grad.py, fp8_ends.py).

The gate's statistic is tested with a knob whose error is known: it adds to each gradient random noise of a set size
against that parameter's batch-to-batch spread of the reference's gradients at the gate's weights (measured here on
the gate's own batches), so every layer group's noise ratio must come out at that size. Ten times the spread fails,
just inside the line is marginal (never passed), well inside passes; a value that is not finite fails at once. The
FP8 recipes are tested without running an FP8 product: their rules, plans, which linears the conversion takes (real
torchao module swaps on a tiny 4-layer Llama), the memory model, the step-time model's casts and the keys."""
import math

import pytest
import torch

from trainscout.spaces import REGISTRY, ConfigError, Context, Knob, Plan, resolve
from trainscout.spaces.roles import Numerics, Runtime
from trainscout.trial import prepare, quality

CPU = torch.device("cpu")


class NoiseNumerics(Numerics):
    def why(self, value, cfg, ctx):
        return None if value == "off" else f"gradients plus noise ({value})"


class NoisyStep(Runtime):
    def wrap_step(self, step, plan, dims):
        value = plan.knobs.get(GradNoise.name)
        if not value:
            return step
        gen = torch.Generator().manual_seed(0)

        def noisy(model, batch, scale, **kw):
            loss = step(model, batch, scale, **kw)
            for n, p in model.named_parameters():
                if value == "nan":
                    p.grad.view(-1)[0] = math.nan
                    break
                z = torch.randn(p.grad.shape, generator=gen)
                p.grad.add_(z * (GradNoise.scales()[value] * GradNoise.spreads[n] / z.norm()))  # exactly that norm
            return loss
        return noisy


class GradNoise(Knob):
    """A test plugin knob: adds random noise to each gradient after the backward, `scale` times that parameter's
    batch-to-batch spread (set by the test), or a NaN into one gradient."""

    name = "test_grad_noise"
    default = "off"
    choices = ("off", "ten", "near", "small", "nan")
    spreads: dict = {}  # parameter -> the reference's spread at the gate's weights (the test measures it)
    runtime = NoisyStep()
    numerics = NoiseNumerics()

    @staticmethod
    def scales() -> dict:
        line = quality.LINES["layer_noise"]
        return {"ten": 10.0, "near": (1 + line.band) / 2 * line.limit, "small": line.band / 2 * line.limit}

    def apply(self, plan, value, cfg, ctx):
        if value != "off":
            plan.knobs[self.name] = value


@pytest.fixture(scope="module")
def noise():
    """The knob registered, with each parameter's spread: |g_a - g_b| / sqrt(2) of the reference's gradients on the
    gate's two batches (one batch's distance from their mean)."""
    REGISTRY[GradNoise.name] = GradNoise()
    try:
        spec = prepare("tiny", {GradNoise.name: "ten"}, device="cpu", steps=1, warmup=0)
        plan = Plan.from_dict(spec.quality["reference_plan"])
        batches = quality.gate_batches(spec, CPU)
        assert len(batches) == 2 == quality.GATE_BATCHES
        a, b = [grads for _, grads, _, _ in quality.gate_steps(spec, plan, batches, CPU, reference_dtype=False)]
        GradNoise.spreads = {n: float((a[n] - b[n]).norm()) / math.sqrt(2) for n in a}
        yield GradNoise.name
    finally:
        del REGISTRY[GradNoise.name]


def gate(knob: str, value: str) -> dict:
    spec = prepare("tiny", {knob: value}, device="cpu", steps=1, warmup=0)
    return quality.one_step(spec, CPU)


def test_noise_ten_times_the_batch_to_batch_spread_fails_and_is_measured_as_such(noise):
    q = gate(noise, "ten")
    assert q["gate"] == quality.FAILED, q
    ratios = {n: g["ratio"] for n, g in q["groups"].items()}
    assert len(ratios) >= 4 and all(r == pytest.approx(10.0, rel=1e-3) for r in ratios.values()), ratios
    assert "'s gradient deviates from the reference's by 10x the reference's own spread" in q["why"], q["why"]
    assert q["why"].endswith(f"per layer it must be at most {quality.LINES['layer_noise'].limit:g})"), q["why"]
    assert q["op_sqnr_db"] is None and q["loss_rel_diff"] == 0.0  # outputs and loss untouched: the gradients fail it
    assert quality.status({"quality": q})[0] == quality.FAILED
    assert quality.failed_settings(q, {noise: "ten"}) == {noise: "ten"}


def test_noise_near_the_line_is_marginal_never_passed_and_small_noise_passes(noise):
    line = quality.LINES["layer_noise"]
    near, small = gate(noise, "near"), gate(noise, "small")
    assert near["noise_ratio"] == pytest.approx(GradNoise.scales()["near"], rel=1e-3)
    assert line.band * line.limit < near["noise_ratio"] <= line.limit
    assert near["gate"] == quality.MARGINAL and near["why"].startswith("near its line: "), near
    status, why = quality.status({"quality": near})
    assert status == quality.MARGINAL and status not in quality.GOOD and why == near["why"]
    assert quality.failed_settings(near, {noise: "near"}) is None  # not failed: measured, named, not strict-best
    assert small["noise_ratio"] == pytest.approx(GradNoise.scales()["small"], rel=1e-3)
    assert small["gate"] == quality.PASSED and small["why"] is None, small
    assert "gradients' deviation" in quality.status({"quality": small})[1]


def test_a_gradient_that_is_not_finite_fails_at_once(noise):
    q = gate(noise, "nan")
    assert q["gate"] == quality.FAILED and q["why"].startswith("not finite: "), q
    assert "the candidate's gradient is not finite" in q["why"]


def test_a_verdict_of_the_one_batch_gate_reads_as_it_did():
    """A record the gate of one batch wrote (its fields, no noise ratio) keeps its word and its reason."""
    old = {"gate": "passed", "why": None, "op_sqnr_db": 27.5, "layer_grad_gain": 0.981, "loss_rel_diff": 0.0004,
           "changes": {"fp8": "FP8 (tensorwise scaling) matrix products in the decoder's linears"}}
    assert quality.status({"quality": old}) == ("passed", "one step against its reference (fp8): linear outputs' "
                                                          "SQNR 27.5 dB, loss within 0.04%, gradients' gain 0.981 "
                                                          "(worst layer)")
    failed = dict(old, gate="failed", why="gpt_neox.layers.0's gradient is 0x the reference's")
    assert quality.status({"quality": failed}) == ("failed", failed["why"])


def test_judge_reads_its_lines_as_data(noise):
    """The lines are data: the same statistics (the reference's and the candidate's steps, as one_step takes them)
    judged under another limit give another verdict, which is how bench/gate_calibration_gpu.py calibrates them."""
    import dataclasses
    spec = prepare("tiny", {noise: "small"}, device="cpu", steps=1, warmup=0)
    batches = quality.gate_batches(spec, CPU)
    ref, layers = [], {}
    for loss, grads, _, layers in quality.gate_steps(spec, Plan.from_dict(spec.quality["reference_plan"]), batches,
                                                      CPU, reference_dtype=False):
        ref.append((loss, grads))
    per_batch, losses = [], []
    for b, (loss, grads, _, _) in enumerate(quality.gate_steps(spec, spec.plan, batches, CPU, reference_dtype=False,
                                                                changed=tuple(spec.quality["changes"]))):
        per_batch.append(quality.gradient_sums(ref[b][1], grads))
        losses.append(loss)
    stats = quality.statistics(per_batch, quality.reference_spread([g for _, g in ref], CPU), layers, losses,
                               [loss for loss, _ in ref], None)
    ratio = max(s["ratio"] for s in stats["layers"].values())
    assert ratio == pytest.approx(GradNoise.scales()["small"], rel=1e-3)

    def under(limit):
        line = dataclasses.replace(quality.LINES["layer_noise"], limit=limit)
        return quality.judge(stats, dict(quality.LINES, layer_noise=line))[0]
    assert quality.judge(stats)[0] == quality.PASSED
    assert under(ratio / 2) == quality.FAILED
    assert under(ratio / (1 + quality.LINES["layer_noise"].band) * 2) == quality.MARGINAL  # in the band below it


def test_the_calibration_script_runs_the_gates_functions(tmp_path, monkeypatch, capsys):
    """bench/gate_calibration_gpu.py on this CPU (the plans an H100 gets), one candidate that runs here, a tiny Llama
    config.json: its table and its JSON say what quality.judge says."""
    import importlib.util
    import json
    import os
    import sys
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "gate_calibration_gpu.py")
    script = importlib.util.module_from_spec(importlib.util.spec_from_file_location("gate_calibration", path))
    script.__spec__.loader.exec_module(script)
    config = tmp_path / "llama.json"
    config.write_text(json.dumps(LLAMA))
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["gate_calibration_gpu.py", "--models", str(config), "--seq", "32", "--device",
                                      "cpu", "--only", "precision bf16", "--line", "layer_noise=0.001"])
    script.main()
    printed = capsys.readouterr().out
    got = json.loads((tmp_path / "gate_calibration.json").read_text())
    rows = {r["candidate"]: r for r in got["models"][str(config)]["rows"]}
    bf16 = rows["precision bf16"]
    assert bf16["verdict"] == quality.PASSED and bf16["old_verdict"] == "passed", bf16
    assert bf16["verdict_under_lines"][0] == quality.FAILED  # judged again under a line below its noise ratio
    assert set(bf16["groups"]) >= {"model.layers.0", "model.layers.3", "model.embed_tokens.weight"}
    assert 0 < bf16["noise_ratio"] < quality.LINES["layer_noise"].limit
    assert "precision bf16" in printed and "under --line: failed" in printed


# --- the FP8 recipes as knobs -------------------------------------------------------------------------------------
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 256, "tie_word_embeddings": False}


def h100(layers: int = 4) -> Context:
    return Context(device="cuda", capability="9.0", installed=frozenset({"torchao"}), num_layers=layers,
                   global_batch=4, model_config=dict(LLAMA, num_hidden_layers=layers), seq_len=32)


@pytest.mark.parametrize("settings, ctx, fix", [
    ({"fp8": "tensorwise", "fp8_weight_grad": "high"}, h100(), "set fp8=rowwise or fp8_weight_grad=fp8"),
    ({"fp8_ends": "high"}, h100(), "fp8_ends=high needs fp8=tensorwise|rowwise"),
    ({"fp8": "rowwise", "fp8_ends": "high"}, h100(2), "set fp8_ends=fp8 or fp8=off"),
    ({"fp8": "rowwise", "fp8_weight_grad": "high"}, Context(device="cpu", num_layers=4, global_batch=4), "fp8=off"),
])
def test_the_recipes_are_refused_where_they_cannot_run_naming_the_fix(settings, ctx, fix):
    with pytest.raises(ConfigError) as e:
        resolve({"micro_batch_size": 4, **settings}, ctx)
    assert fix in str(e.value), str(e.value)


def converted(settings: dict):
    """The tiny Llama after the plan's transforms (torchao's module swap; no FP8 product runs): the plan and the
    model."""
    from trainscout.runtime import prepare_model
    from trainscout.trial.models import build_model
    plan = resolve({"micro_batch_size": 4, **settings}, h100())[1]
    torch.manual_seed(0)
    return plan, prepare_model(build_model(LLAMA, "sdpa", 32), plan)


def kinds(model) -> list[set[str]]:
    return [{type(m).__name__ for m in layer.modules() if isinstance(m, torch.nn.Linear)}
            for layer in model.model.layers]


def test_fp8_ends_leaves_the_first_and_last_decoder_layers_out_of_the_conversion():
    pytest.importorskip("torchao")
    plan, model = converted({"fp8": "tensorwise", "fp8_ends": "high"})
    assert plan.knobs == {"fp8": "tensorwise", "fp8_ends": "high"}
    assert kinds(model) == [{"Linear"}, {"Float8Linear"}, {"Float8Linear"}, {"Linear"}]
    assert type(model.get_output_embeddings()).__name__ == "Linear"  # the head stays high precision
    _, every = converted({"fp8": "tensorwise"})
    assert kinds(every) == [{"Float8Linear"}] * 4


def test_fp8_weight_grad_converts_with_torchaos_rowwise_with_gw_hp_recipe():
    pytest.importorskip("torchao")
    from torchao.float8.config import Float8LinearRecipeName, ScalingType

    from trainscout.spaces.knobs import fp8
    plan, model = converted({"fp8": "rowwise", "fp8_weight_grad": "high"})
    assert fp8.recipe(plan) == Float8LinearRecipeName.ROWWISE_WITH_GW_HP.value
    linears = [m for m in model.model.layers.modules() if type(m).__name__ == "Float8Linear"]
    assert len(linears) == 4 * 7  # q, k, v, o, gate, up, down of every layer
    for m in linears:
        assert m.config.cast_config_input_for_grad_weight.scaling_type is ScalingType.DISABLED
        assert m.config.cast_config_grad_output_for_grad_weight.scaling_type is ScalingType.DISABLED
    plain_plan, plain = converted({"fp8": "rowwise"})
    assert fp8.recipe(plain_plan) == "rowwise"
    m = next(m for m in plain.model.layers.modules() if type(m).__name__ == "Float8Linear")
    assert m.config.cast_config_input_for_grad_weight.scaling_type is ScalingType.DYNAMIC


def spec_of(settings: dict):
    """A trial's spec of the tiny 4-layer Llama as an H100 would run it (planned only: nothing runs here)."""
    from trainscout.trial.models import ModelSpec, resolve_model
    hw = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "gpu_count": 1,
          "gpu_memory_gib": 79.0}
    model = ModelSpec("llama-4-layers", LLAMA, resolve_model("tiny").recipe)
    return prepare(model, {"micro_batch_size": 4, **settings}, device="cuda", steps=1, warmup=0, hw=hw,
                   installed=frozenset({"torchao"}))


def test_the_recipes_memory_casts_gate_and_keys():
    """gw_hp's weight gradient reads the 16-bit input, so FP8's saved-activation cut does not apply; with the ends
    left out the cut covers the other layers only; gw_hp's casts are rowwise's less the second-axis ones. Each recipe
    is a numerics change the gate compares with bf16, under its own gate key; at its default a new knob changes no
    measurement key."""
    from trainscout.store.schema import measurement_key
    from trainscout.predictor import memory, steptime
    specs = {name: spec_of(s) for name, s in (("off", {}), ("rowwise", {"fp8": "rowwise"}),
                                              ("gw_hp", {"fp8": "rowwise", "fp8_weight_grad": "high"}),
                                              ("ends", {"fp8": "rowwise", "fp8_ends": "high"}),
                                              ("default", {"fp8": "rowwise", "fp8_ends": "fp8",
                                                           "fp8_weight_grad": "fp8"}))}
    acts = {n: memory.components(s)["activations"] for n, s in specs.items()}
    assert acts["rowwise"] < acts["ends"] < acts["off"] == acts["gw_hp"], acts
    assert steptime.linear_rate(specs["gw_hp"])[1] == steptime.linear_rate(specs["rowwise"])[1] - 5.0
    gw, ends = specs["gw_hp"].quality, specs["ends"].quality
    assert set(gw["changes"]) == {"fp8", "fp8_weight_grad"} and gw["reference"]["fp8"] == "off"
    assert set(ends["changes"]) == {"fp8", "fp8_ends"}
    assert Plan.from_dict(gw["reference_plan"]).knobs == {} == Plan.from_dict(ends["reference_plan"]).knobs
    keys = {n: quality.gate_key(s) for n, s in specs.items() if s.quality}
    assert keys["default"] == keys["rowwise"] and len({keys["rowwise"], keys["gw_hp"], keys["ends"]}) == 3
    hw = specs["off"].hardware
    m = {n: measurement_key(s, hw, {}) for n, s in specs.items()}
    assert m["default"] == m["rowwise"] and len({m["rowwise"], m["gw_hp"], m["ends"], m["off"]}) == 4
