"""What the memory model refuses to launch in a search (search/trainable.launch_refusal and the ranker's rule): a
micro_batch_size=max probe is judged at micro-batch 1, the least it would try. On the GPU (H100, session 23) a 1.6B
model's bf16-mixed best, a start point for a 7B, probed 8 micro-batches in 90 s and stored `oom`. The hardware here is
an H100's fingerprint (a mock of the GPU: no GPU on this box); the model, the rules and the memory model are real."""
import os

from trainscout.search.args import SearchArgs
from trainscout.search.trainable import launch_refusal, trial_spec
from trainscout.predictor import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISTRAL = os.path.join(ROOT, "bench", "models", "hub", "mistral-7b-v0.3.json")
H100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2, "gpu_count": 1, "capability": "9.0",
        "cpu": "x86_64", "cpu_count": 16, "host_memory_gib": 125.0}


def _base() -> dict:
    args = SearchArgs(model=MISTRAL, out="/tmp/none")
    return {"model": MISTRAL, "workers": 1, "steps": 3, "warmup": 1, "hardware": H100, "seed": 0,
            "recipe": args.recipe, "host": {"capacity": 125 * memory.GiB},
            "memory": {"capacity": H100["gpu_memory_gib"] * memory.GiB, "calibration": None}}


def test_a_probe_that_cannot_fit_even_one_sequence_is_not_launched():
    base = _base()
    settings = {"precision": "bf16-mixed", "micro_batch_size": "max", "activation_checkpointing": "none"}
    spec = trial_spec(settings, base)
    assert spec.plan.micro_batch_probe
    why = launch_refusal(spec, base)
    assert why is not None
    error, extra = why
    assert "at micro-batch 1 (micro_batch_size=max tries nothing smaller)" in error and extra["predicted_gib"] > 100


def test_a_probe_that_fits_at_one_sequence_is_launched_and_a_fixed_size_is_judged_as_set():
    base = _base()
    fits = {"precision": "bf16", "micro_batch_size": "max", "activation_checkpointing": "full"}
    assert launch_refusal(trial_spec(fits, base), base) is None
    big = dict(fits, micro_batch_size=128)  # as set: far over the GPU
    error, extra = launch_refusal(trial_spec(big, base), base)
    assert "micro-batch 1" not in error and extra["predicted_gib"] > 80


def test_one_rule_names_every_capacity_it_is_over_and_a_start_point_is_held_to_its_share():
    """predictor.memory.refusal, the rule of the trials, the ranker and the start points: where the GPU and the host are
    both over, both are named with the predicted GiB and the capacity; the start points' line (FIT_SHARE) is below
    the trials' (the GPU + MARGIN): a configuration predicted at the GPU's memory is launched as a trial, not taken
    as a start point."""
    base = _base()
    spec = trial_spec({"precision": "bf16-mixed", "micro_batch_size": 4, "activation_checkpointing": "none",
                       "zero_stage": 1}, base)
    gpu, host = H100["gpu_memory_gib"] * memory.GiB, 16 * memory.GiB  # DeepSpeed builds the 7B's fp32 model (29 GB)
    # on the host
    error, extra = memory.refusal(spec, gpu, host)
    on_gpu, on_host = error.split("; ")
    assert on_gpu == f"predicted {extra['predicted_gib']:.1f} GiB per rank > 79 GiB + 10%"
    assert extra["predicted_gib"] > 87
    assert on_host.startswith("predicted ")
    assert "GiB of host memory for the trial's 1 rank(s) > 16 GiB less 10%" in on_host
    assert memory.refusal(spec, None, host)[0] == on_host and memory.refusal(spec, gpu)[0] == on_gpu  # each alone
    predicted = memory.predict(spec)
    assert memory.refusal(spec, predicted) is None  # the trials' line: within the margin, it is tried
    error, _ = memory.refusal(spec, predicted, share=memory.FIT_SHARE)
    assert error == f"predicted {predicted / memory.GiB:.1f} GiB per rank > 85% of {predicted / memory.GiB:.0f} GiB"


def test_a_gpu_start_point_takes_the_largest_micro_batch_that_fits_the_host_too():
    """Activation offload keeps each micro-batch's saved activations in host memory. On an H100 with 32 GiB of host
    memory (a mock of the GPU and the box: the hardware dict says so; the model, the rules and the memory model are
    real) the GPU start point took Pythia-410M's micro-batch 32 (44 GiB of the GPU's 85 %), which needs 59 GiB of
    host memory: the trial would have been pruned. It judged the GPU alone; now it is the trials' rule
    (predictor.memory.refusal): micro-batch 8 (16 GiB of host memory; 16 needs 31 > 32 less 10 %)."""
    from trainscout.search.service import SearchArgs, start_points
    from trainscout.search.space import Space
    from trainscout.trial import prepare
    from trainscout.trial.runner import context
    hw = dict(H100, host_memory_gib=32.0)
    space = Space.build({"activation_offload": "on", "micro_batch_size": [4, 8, 16, 32, 64], "compile": False}, {},
                        context(prepare("pythia-410m", {}, hw=hw).model_config, 1024, 1, hw))
    args = SearchArgs(model="pythia-410m", out="unused")
    [point] = start_points(args, space, hw, None)
    assert point["micro_batch_size"] == 8

    def refused(mbs):
        at = prepare("pythia-410m", dict(point, activation_offload="on", micro_batch_size=mbs), hw=hw)
        return memory.refusal(at, 79.2 * memory.GiB, 32 * memory.GiB, share=memory.FIT_SHARE)
    assert refused(8) is None and "of host memory" in refused(16)[0] and "per rank" not in refused(32)[0]
