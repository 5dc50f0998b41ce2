"""micro_batch_size=max releases a refused candidate's memory before it tries the next (issue 46, item 3): on one H100
a 3.7B MoE found "no micro-batch fits (tried [8, 4, 2, 1])" although micro-batch 1 fits alone, as each refused
candidate's model, engine and optimizer were still alive (the exception's traceback held their frames, and the
engine's reference cycle waited for a collection that ran before they were unreachable). The CPU has no device
memory to run out of: the fault `held` (trial/faults.py) makes a candidate fail with torch.OutOfMemoryError while
anything of the candidate tried before it is still alive, and TRAINSCOUT_FAKE_CAPACITY_MBS makes the candidates
above a micro-batch fail with a real allocator error, as on a smaller GPU. Real model, real engines, real torch."""
import gc

import pytest
import torch

from trainscout.trial import engines, execute, prepare, probe
from trainscout.trial.models import build_model


def _largest_fit(monkeypatch, capacity: int, global_batch: int, settings: dict | None = None):
    monkeypatch.setenv("TRAINSCOUT_FAKE_CAPACITY_MBS", str(capacity))
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": "max", **(settings or {})}, device="cpu",
                   workers=1, steps=1, warmup=2, global_batch=global_batch, measure_accum=2, fault="held")
    plan, device = spec.plan.replace(), torch.device("cpu")

    def make(accum):  # as trial/worker.py's make(): the model, its names, the engine
        model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"])
        model.config.use_cache = False
        names = {id(p): n for n, p in model.named_parameters()}
        return model, names, engines.build(plan, model, spec.recipe, device, 1, accum)
    return spec, plan, probe.largest_fit(spec, plan, make, device)


def test_a_refused_candidates_memory_is_released_before_the_next(monkeypatch):
    """Candidates 8, 4, 2, 1; 8 over the (simulated) capacity. Before the fix, 4 was tried while 8's engine (and
    through it the model and the optimizer) was still alive: [[8, oom], [4, oom], [2, ok]]."""
    gc.collect()
    spec, plan, ((model, _, engine), accum, tried) = _largest_fit(monkeypatch, 4, 8)
    assert [c["mbs"] for c in spec.probe] == [8, 4, 2, 1]
    assert tried == [[8, "oom"], [4, "ok"]] and plan.micro_batch_size == 4
    assert accum == spec.probe[1]["measured_accum"]
    engine.close()


def test_the_held_fault_refuses_a_candidate_while_the_previous_one_is_alive(monkeypatch):
    """The fault itself: a candidate built while the one before it is still referenced fails as out of memory."""
    from trainscout.trial import faults
    gc.collect()  # an earlier test's candidates, if any, freed
    model = torch.nn.Linear(2, 2)
    faults.probe_built("held", (model, torch.optim.SGD(model.parameters(), lr=0.1)))
    with pytest.raises(torch.OutOfMemoryError, match="Linear"):
        faults.probe_candidate("held", 1)
    faults.probe_built("held", (model,))
    del model
    gc.collect()
    faults.probe_candidate("held", 1)  # released: no error
    faults.probe_candidate(None, 1)  # off unless asked for
    faults.fire("held", 0, torch.device("cpu"))  # not at the first timed step


def test_a_trial_with_max_finds_the_largest_that_fits_in_its_worker(ray_local, monkeypatch):
    """The same through a real trial: trial/worker.py's make() in a rank's process of a worker group."""
    monkeypatch.setenv("TRAINSCOUT_FAKE_CAPACITY_MBS", "4")
    from trainscout.trial.runner import worker_env
    monkeypatch.setattr("trainscout.trial.runner.worker_env",
                        lambda s: dict(worker_env(s), TRAINSCOUT_FAKE_CAPACITY_MBS="4"))
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": "max"}, device="cpu", workers=1, steps=1,
                   warmup=1, global_batch=8, fault="held")
    r = execute(spec, timeout=240, reuse=False)  # processes of its own: no warm group left for other tests
    assert r.status == "ok", (r.error, r.stderr_tail)
    assert r.probe == [[8, "oom"], [4, "ok"]]
