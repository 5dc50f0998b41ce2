"""The step-time model's terms against what the GPUs measured (trial/steptime.py): a pipeline's bubble and its
stage's share of the model (issue 47). Mock: no GPU here; the H200 is its fingerprint, the measurements the
shipped atlas's rows (bench/data)."""
import pytest

from trainscout.atlas import db, predict
from trainscout.trial import prepare, steptime

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
    pool = predict.samples(list(db.shipped_rows()), db.shipped_model()["features"])
    rows = [s for s in pool if s.model == "pythia-1b" and s.gpu == "H200" and s.world == 2]
    ddp = [s.ratio for s in rows if s.plan.engine == "ddp"]
    pipes = [s for s in rows if s.plan.engine == "pipeline"]
    assert ddp and len(pipes) == 4
    for s in pipes:
        assert abs(s.ratio / ddp[0] - 1) <= 0.10, (s.plan.engine_config, s.ratio, ddp)
