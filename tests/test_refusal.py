"""What the memory model refuses to launch in a search (search/trainable._refusal and the ranker's rule): a
micro_batch_size=max probe is judged at micro-batch 1, the least it would try. On the GPU (H100, session 23) a 1.6B
model's bf16-mixed best, a start point for a 7B, probed 8 micro-batches in 90 s and stored `oom`. The hardware here is
an H100's fingerprint (a mock of the GPU: no GPU on this box); the model, the rules and the memory model are real."""
import os

from trainscout.search.args import SearchArgs
from trainscout.search.trainable import _refusal, trial_spec
from trainscout.trial import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISTRAL = os.path.join(ROOT, "bench", "models", "hub", "mistral-7b-v0.3.json")
H100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2, "gpu_count": 1, "capability": "9.0",
        "cpu": "x86_64", "cpu_count": 16, "host_memory_gib": 125.0}


def _base() -> dict:
    args = SearchArgs(model=MISTRAL, out="/tmp/none")
    return {"model": MISTRAL, "workers": 1, "steps": 3, "warmup": 1, "hardware": H100, "seed": 0,
            "recipe": args.recipe, "host": {"capacity": 125 * memory.GiB, "margin": memory.MARGIN},
            "memory": {"capacity": H100["gpu_memory_gib"] * memory.GiB, "margin": memory.MARGIN, "calibration": None}}


def test_a_probe_that_cannot_fit_even_one_sequence_is_not_launched():
    base = _base()
    settings = {"precision": "bf16-mixed", "micro_batch_size": "max", "activation_checkpointing": "none"}
    spec = trial_spec(settings, base)
    assert spec.plan.micro_batch_probe
    why = _refusal(spec, settings, base, None)
    assert why is not None
    error, extra = why
    assert "at micro-batch 1 (micro_batch_size=max tries nothing smaller)" in error and extra["predicted_gib"] > 100


def test_a_probe_that_fits_at_one_sequence_is_launched_and_a_fixed_size_is_judged_as_set():
    base = _base()
    fits = {"precision": "bf16", "micro_batch_size": "max", "activation_checkpointing": "full"}
    assert _refusal(trial_spec(fits, base), fits, base, None) is None
    big = dict(fits, micro_batch_size=128)  # as set: far over the GPU
    error, extra = _refusal(trial_spec(big, base), big, base, None)
    assert "micro-batch 1" not in error and extra["predicted_gib"] > 80
