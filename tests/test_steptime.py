"""The step-time model's terms against what the GPUs measured (predictor/steptime.py): a pipeline's bubble and its
stage's share of the model (issue 47). Mock: no GPU here; the H200 is its fingerprint, the measurements the
shipped atlas's rows (bench/data)."""
import pytest

from trainscout.atlas import db, predict
from trainscout.atlas.loo import leave_one_out
from trainscout.atlas.samples import samples
from trainscout.predictor import steptime
from trainscout.trial import prepare

H200x2 = {"device": "cuda", "gpu": "NVIDIA H200", "gpu_count": 2, "gpu_memory_gib": 139.8, "capability": "9.0"}
PIPE = {"precision": "bf16-mixed", "micro_batch_size": 4, "pipeline_stages": 2, "pipeline_microbatches": 8}


def _step(**change):
    spec = prepare("pythia-1b", dict(PIPE, **change), workers=2, hw=H200x2, global_batch=1024)
    return spec, steptime.step_s(spec)


def test_a_pipeline_rank_runs_its_stage_for_every_micro_batch_and_waits_out_the_bubble():
    """GPipe and 1F1B idle stages - 1 micro-batch slots per schedule step ((p-1)/(m+p-1) of it), interleaving two
    chunks half that, interleaved zero-bubble a third of that; more micro-batches, a smaller share idle."""
    spec, gpipe = _step(pipeline_schedule="gpipe")
    _, one = _step(pipeline_schedule="1f1b")
    _, inter = _step(pipeline_schedule="interleaved_1f1b")
    _, zb = _step(pipeline_schedule="zero_bubble")
    assert gpipe == pytest.approx(one) and one > inter > zb
    opt = steptime.optimizer_s(spec)  # once a step, outside the schedule: the stage's share of the parameters
    assert 0 < opt < 0.01 * one
    busy = (one - opt) * 8 / 9  # the bubble's share of 1F1B's micro-batches: (p-1)/(m+p-1) = 1/9
    assert inter - opt == pytest.approx(busy * 8.5 / 8) and zb - opt == pytest.approx(busy * (8 + 1 / 6) / 8)
    _, more = _step(pipeline_microbatches=16)
    assert (more - opt) / (one - opt) == pytest.approx((16 + 1) / 16 / (9 / 8))  # the same tokens, a smaller bubble


def test_pipeline_rows_measured_against_the_model_as_the_same_model_without_a_pipeline():
    """On the H200 (bench/data, Pythia-1B on 2 GPUs, global batch 1024): the measured/roofline ratio of every
    pipeline schedule is within 10 % of plain DDP's on the same GPUs (the roofline had no bubble and counted one
    micro-batch per schedule step: ratios 5.1-9.2 against DDP's 1.8)."""
    pool = samples(list(db.shipped_rows()), db.shipped_model()["features"])
    rows = [s for s in pool if s.model == "pythia-1b" and s.gpu == "H200" and s.world == 2]
    ddp = [s.ratio for s in rows if s.plan.engine == "ddp"]
    pipes = [s for s in rows if s.plan.engine == "pipeline"]
    assert ddp and len(pipes) == 4
    for s in pipes:
        assert abs(s.ratio / ddp[0] - 1) <= 0.10, (s.plan.engine_config, s.ratio, ddp)


H100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "gpu_memory_gib": 79.2, "capability": "9.0"}


def test_the_optimizer_step_is_the_states_bytes_at_the_bandwidth_times_what_each_knob_declares():
    """The optimizer term against the H100's Pythia-1B rows (bench/data/gpu-2026-12-06-s23/optimizer_pythia1b_h100
    .jsonl): fused fp32 AdamW 28 B a parameter at 3.35 TB/s (8.5 ms; measured 15.35, the calibration's ratio carries
    the rest), each other optimizer its measured step over the fused one's; offloaded states cost the GPU nothing."""
    def opt(**knobs):
        spec = prepare("pythia-1b", dict(micro_batch_size=4, **knobs), workers=1, global_batch=8, hw=H100,
                       installed=frozenset({"torchao"}))
        return steptime.optimizer_s(spec)
    fused = opt()
    assert fused == pytest.approx(1.0118e9 * steptime.ADAMW_BYTES / 3.35e12, rel=0.01)
    measured = {"optimizer_impl": {"foreach": 34.28}, "precision": {"bf16": 36.83},
                "optimizer_state": {"bf16": 72.18, "8bit": 51.59, "4bit": 119.29, "fp8": 91.73}}
    for knob, by in measured.items():
        for value, ms in by.items():
            assert opt(**{knob: value}) / fused == pytest.approx(ms / 15.35, rel=1e-3), (knob, value)


def test_fp8_tensorwise_linears_run_at_the_fp8_peak_less_their_casts_and_rowwise_claims_no_speed_up():
    """FP8 tensorwise: the decoder linears at twice the bf16 peak plus their casts' bytes, faster than bf16 but by
    less than the linears' share alone; rowwise: only the casts (measured slower than bf16 as a whole model)."""
    def step(**knobs):
        spec = prepare("pythia-1b", dict(micro_batch_size=16, compile=True, **knobs), workers=1, global_batch=16,
                       hw=H100, installed=frozenset({"torchao"}))
        return spec, steptime.step_s(spec)
    _, bf16 = step()
    spec, tensorwise = step(fp8="tensorwise")
    _, rowwise = step(fp8="rowwise")
    assert steptime.linear_rate(spec) == (2.0, 7.0)
    assert bf16 / 2 < tensorwise < bf16 and rowwise > tensorwise


def test_an_lm_head_at_a_vocabulary_not_a_multiple_of_8_costs_what_the_h100_measured():
    """Granite's 49,155-token head ran its GEMMs 3.45x slower than 49,152's on an H100
    (bench/data/gpu-2026-12-06-s25/gaps_h100.log): the roofline counts the head's FLOPs at that fraction of the peak,
    a multiple of 8 at the full peak. Mock: the H100 is its fingerprint."""
    import json
    import os
    import tempfile
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "bench", "models", "granite-1.6b.json"), encoding="utf-8") as f:
        base = json.load(f)

    def step(vocab):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(dict(base, vocab_size=vocab), f)
        spec = prepare(f.name, {"micro_batch_size": 4, "precision": "bf16-mixed"}, workers=1, global_batch=4, hw=H100)
        os.unlink(f.name)
        return spec, steptime.step_s(spec)
    spec, aligned = step(49152)
    _, odd = step(49155)
    _, eight = step(49160)
    head = 4 * spec.recipe["seq_len"] * 6 * 2048 * 49152 / (989e12)  # the aligned head's seconds at the peak
    assert odd - aligned == pytest.approx(head * 2.45, rel=0.01)
    assert eight == pytest.approx(aligned, rel=1e-3)
    assert steptime.head_alignment(49156, 2048) == 1.86 and steptime.head_alignment(50257, 4096) == 4.13


def test_zero3_hooks_are_a_host_floor_under_the_step_not_a_term_added_to_it():
    """ZeRO-3's parameter hooks: 0.164 s of host work per micro-batch and 0.43 ms more per module holding parameters
    (an H100 box ran Pythia-160M's 75 modules at micro-batch 8 in 0.196 s a micro-batch and Pythia-410M's 147 in
    0.227 s, host-bound; Pythia-1B's 99 hid behind its 0.27 s of GPU work: bench/data/gpu-2026-12-06-s25 and -s26
    gaps_h100.log). The atlas predicts max(roofline x ratio, floor), and a row whose measured step is the floor
    calibrates no other: the H200's Pythia-410M ZeRO-3 row (another box, 128 micro-batches a step), held out, was
    +96.6 % with the roofline alone and -29.5 % with 2.4 ms a module and nothing fixed. Mock: the H100 is its
    fingerprint."""
    def spec(model, stage):
        return prepare(model, {"micro_batch_size": 8, "zero_stage": stage, "precision": "bf16-mixed",
                               "compile": False}, workers=1, global_batch=16, hw=H100)
    small, big = spec("pythia-160m", 3), spec("pythia-1b", 3)
    assert steptime.host_s(spec("pythia-160m", 0)) == 0.0
    assert steptime.host_s(small) == pytest.approx(2 * (0.164 + 75 * 4.3e-4))
    assert steptime.host_s(big) == pytest.approx(2 * (0.164 + 99 * 4.3e-4))
    assert steptime.step_s(small) == pytest.approx(steptime.step_s(spec("pythia-160m", 0)), rel=0.02)  # GPU alone
    pool = samples(list(db.shipped_rows()), db.shipped_model()["features"])
    bound = [s for s in pool if s.host_bound]
    assert bound and all(s.config.get("zero_stage") == 3 for s in bound)
    assert any(s.model == "pythia-160m" and s.gpu == "H100" for s in bound)
    got = {r["id"]: r for r in leave_one_out(pool, "model")}
    z3 = next(s for s in pool if s.model == "pythia-410m" and s.config.get("zero_stage") == 3 and s.gpu == "H200")
    assert abs(got[z3.id]["tps_err"]) < 0.10
    assert got[z3.id]["tps_err"] == pytest.approx(z3.step_s / z3.host_s - 1, rel=1e-6)  # predicted at its floor


def test_the_loss_kernels_logits_traffic_is_what_loss_kernel_declares():
    """The logits move loss_kernel's Costs.logits_bytes per token and vocabulary entry (measured on an H100: eager 52,
    compiled 9.4, bench/data/gpu-2026-12-06-s26): a compiled loss saves (52 - 9.4) x b x s x V bytes at the
    GPU's bandwidth, and the model compiled whole counts as compiled whatever its loss kernel. Mock: the H100 is its
    fingerprint."""
    from trainscout.spaces.knobs.loss_kernel import LossKernel

    def at(**settings):
        s = prepare("pythia-160m", {"micro_batch_size": 8, "precision": "bf16-mixed", **settings}, workers=1,
                    global_batch=8, hw=H100)
        return s, steptime.step_s(s)
    spec, eager = at(loss_kernel="eager", compile=True, compile_scope="layers")
    _, compiled = at(loss_kernel="compiled", compile=True, compile_scope="layers")
    b = LossKernel.costs.logits_bytes
    assert steptime.logits_bytes(spec) == b["eager"] == 52.0 and b["compiled"] == 9.4
    saved = (b["eager"] - b["compiled"]) * 8 * spec.recipe["seq_len"] * 50304 / 3.35e12
    assert eager - compiled == pytest.approx(saved, rel=1e-6)
    whole, _ = at(loss_kernel="eager", compile=True, compile_scope="model")
    assert steptime.logits_bytes(whole) == b["compiled"]


def test_a_prediction_at_the_host_floor_says_so(monkeypatch):
    """lookup's row says when its step is the engine's host work, not the GPU's (here with the hooks' cost raised to
    50 ms a module, so that Pythia-70M's ZeRO-3 row sits on its floor). Mock: the H100 is its name."""
    import trainscout.trial.engines.deepspeed as ds
    monkeypatch.setattr(ds, "ZERO3_HOOK_S", 0.05)
    pool = samples(list(db.shipped_rows()), db.shipped_model()["features"])
    rows = predict.predict_model("pythia-70m", "NVIDIA H100 80GB HBM3", 1, pool)["rows"]
    z3 = [r for r in rows if r["plan"]["engine"] == "deepspeed" and r["plan"]["engine_config"].get("stage") == 3]
    assert z3 and all("[host-bound: the engine's hooks take" in r["describe"] for r in z3)
    assert all("host-bound" not in r["describe"] for r in rows if r not in z3)
