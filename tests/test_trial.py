"""A trial end to end with two gloo workers started by Ray Train, for every engine and knob family, and the
failure classification through the real code path (faults injected into one worker)."""
import math
import ray
import time

import pytest

from trainscout.predictor import flops
from trainscout.trial import execute, prepare
from trainscout.trial.models import build_model, resolve_model


pytestmark = pytest.mark.timeout(600)
TINY_PARAMS = sum(p.numel() for p in build_model(resolve_model("tiny").config, "sdpa", 64).parameters())


def spec_of(settings, fault=None, **kw):
    """The trial run() measures (tests/prewarm.py compiles the graphs of ENGINES' specs ahead, in processes of its
    own)."""
    kw = {"workers": 2, "steps": 2, "warmup": 1, "global_batch": 32, "measure_accum": 2, **kw}
    return prepare("tiny", {"precision": "fp32", "micro_batch_size": 4, **settings}, device="cpu", fault=fault, **kw)


def run(settings, fault=None, timeout=300, **kw):
    return execute(spec_of(settings, fault, **kw), timeout=timeout)


# Every engine and knob path once (the exports' fixture in test_analysis.py also measures DDP, ZeRO-2 + optimizer
# offload and FSDP2 full_shard; test_runtime_hf.py checkpointing every 2nd layer): each case is a real trial
ENGINES = {
    "ddp": {},
    "zero1-loss-compiled": {"zero_stage": 1, "loss_kernel": "compiled"},
    "zero3": {"zero_stage": 3},
    "zero3-offload-optimizer-params": {"zero_stage": 3, "offload_optimizer": True, "offload_params": True},
    "fsdp-grad-op-bf16": {"fsdp": "shard_grad_op", "precision": "bf16-mixed"},
    "ckpt-every-2-zero2-bf16": {"activation_checkpointing": 2, "zero_stage": 2, "precision": "bf16-mixed"},
    "compile-model-sdpa-flash": {"compile": True, "compile_scope": "model", "sdpa_backend": "flash"},  # flags traced
    "compile-layers-fsdp-ckpt-loss": {"compile": True, "fsdp": "full_shard", "activation_checkpointing": "full",
                                      "loss_kernel": "compiled"},  # compile_scope auto: layers
}


@pytest.mark.parametrize("name", ENGINES)
def test_trial_measures_each_engine(ray_local, name):
    r = run(ENGINES[name])
    assert r.status == "ok", (r.error, r.stderr_tail)
    m = r.metrics
    # real optimizer steps with real accumulation: 4 micro-batches per step, 2 of them measured per step
    assert (r.grad_accum, r.measured_accum) == (4, 2)
    assert m["step_s"] > 0 and m["micro_batch_s"] > 0 and m["optimizer_s"] > 0
    # the projection is the phases of the slowest rank: 3 accumulating micro-batches + the last + the optimizer
    assert m["step_s"] >= 3 * min(m["micro_batch_s"], m["last_micro_batch_s"])
    assert m["tokens_per_s"] == pytest.approx(32 * 64 / m["step_s"])
    assert m["projected_days"] == pytest.approx(1000 * m["step_s"] / 86400)
    assert len(m["peak_rss_mib"]) == 2 and min(m["peak_rss_mib"]) > 100
    assert m["mfu"] is None  # no GPU peak on the CPU
    # the whole model's parameters, counted before ZeRO-3 partitions them (the GPU run once showed MFU 0.04); the
    # FLOPs from the model's modules, whatever the engine holds (predictor/flops.py)
    assert m["n_params"] == TINY_PARAMS
    assert m["flops_per_token"] == flops.count(resolve_model("tiny").config).per_token(64)
    assert m["flops_convention"] == flops.CONVENTION and m["active_params"] < TINY_PARAMS  # no embedding lookup
    assert math.isfinite(m["loss"]) and 0 < m["loss"] < 2 * math.log(512)
    assert r.config == {**r.config, **ENGINES[name]}
    assert r.hardware["device"] == "cpu" and r.versions["torch"]
    # what the optimizer stepped, read from it (predictor.dtypes): fp32 masters under fp32 and bf16-mixed, on every
    # engine (DeepSpeed's bf16 model is 16-bit, its optimizer's partitions are not; FSDP2 keeps fp32 shards)
    assert m["dtypes"] == {"weights": "float32", "gradients": "float32", "optimizer": "float32"}
    # torch.compile's own timers: what of the build and warm-up was compiling (the loss alone compiles too)
    compiles = ENGINES[name].get("compile") or ENGINES[name].get("loss_kernel") == "compiled"
    assert (m["compile_s"] > 0) == bool(compiles) and m["compile_s"] <= m["build_s"] + m["warmup_s"]


@pytest.mark.parametrize("backend, kernel", [("math", "_scaled_dot_product_attention_math"),
                                             ("flash", "_scaled_dot_product_flash_attention_for_cpu")])
def test_sdpa_backend_runs_only_its_kernel(backend, kernel):
    import torch
    import torch.nn.functional as F

    from trainscout.spaces.knobs.sdpa_backend import select_sdpa
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    try:
        select_sdpa(backend)
        with torch.profiler.profile() as prof:
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    finally:
        select_sdpa("auto")
    ops = {e.key for e in prof.key_averages() if "_scaled_dot_product" in e.key}
    assert ops and all(kernel in op for op in ops), ops


def test_compile_scope_layers_compiles_each_layer_and_leaves_the_causal_mask_to_sdpa():
    """compile_scope=layers (auto on the PyTorch engines): every decoder layer is compiled on its own and the mask is
    built eagerly, so the layers get no mask tensor and SDPA runs is_causal (a whole-model trace materialises it)."""
    import torch

    from trainscout.spaces import Context, resolve
    from trainscout.trial.engines.plain import TorchEngine
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": 2, "compile": True}, device="cpu")
    assert spec.config["compile_scope"] == "layers"
    model = build_model(resolve_model("tiny").config, "sdpa", 64)
    engine = TorchEngine(model, resolve(spec.config, Context(global_batch=2, num_layers=2))[1], spec.recipe,
                         torch.device("cpu"), 1)
    layers = [m for m in model.modules() if isinstance(m, torch._dynamo.eval_frame.OptimizedModule)]
    assert engine.model is model and len(layers) == model.config.num_hidden_layers
    masks = []
    layers[0].register_forward_pre_hook(lambda mod, args, kw: masks.append(kw.get("attention_mask", "absent")),
                                        with_kwargs=True)
    loss = engine.micro_step(torch.randint(0, 512, (2, 64)), is_last=True, scale=1.0)
    engine.optimizer_step()
    assert masks == [None] and math.isfinite(loss.item())


def test_compiled_loss_gives_the_eager_loss_and_gradients():
    """loss_kernel=compiled: the model's loss function runs compiled, with the eager loss and gradients."""
    import copy

    import torch

    from trainscout.spaces import Context, resolve
    from trainscout.trial.engines.plain import TorchEngine
    torch.manual_seed(0)
    base, batch, out = build_model(resolve_model("tiny").config, "sdpa", 64), torch.randint(0, 512, (2, 64)), {}
    for kernel in ("eager", "compiled"):
        spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": 2, "loss_kernel": kernel}, device="cpu")
        model = copy.deepcopy(base)
        engine = TorchEngine(model, resolve(spec.config, Context(global_batch=2, num_layers=2))[1], spec.recipe,
                             torch.device("cpu"), 1)
        loss = engine.micro_step(batch, is_last=True, scale=1.0)
        out[kernel] = loss.item(), [p.grad.clone() for p in model.parameters()], model.loss_function
    assert hasattr(out["compiled"][2], "_torchdynamo_orig_callable")  # the function torch.compile returns
    assert not hasattr(out["eager"][2], "_torchdynamo_orig_callable")
    assert out["compiled"][0] == pytest.approx(out["eager"][0], rel=1e-5)
    for g_eager, g_compiled in zip(out["eager"][1], out["compiled"][1]):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)


def test_full_step_is_measured_when_asked(ray_local):
    r = run({}, measure_accum=0, steps=3)
    m = r.metrics
    assert r.status == "ok" and r.measured_accum == r.grad_accum == 4
    assert m["measured_step_s"] == pytest.approx(m["step_s"], rel=0.5)
    # the seed paper's timer is recorded beside ours (on the CPU, where work is synchronous, it is close; on a GPU
    # it times kernel launches: bench numbers in docs/BENCHMARKS.md)
    assert 0 < m["seed_method_step_s"] < 2 * m["step_s"]


@pytest.mark.parametrize("fault, status, words", [
    ("oom@1", "oom", "allocate"),
    ("crash@1", "crash", ""),
    ("assert", "crash", "AssertionError: injected assertion failure"),
    # pickle refuses it (torch.compile's errors hold frames): the message still comes back, not "cannot pickle"
    ("unpicklable", "crash", "InjectedCompileError: injected failure that cannot be pickled"),
])
def test_failures_are_classified(ray_local, fault, status, words):
    r = run({}, fault=fault)
    assert r.status == status and r.metrics is None
    assert words in r.error
    assert "injected" in r.stderr_tail  # the failing rank's stderr tail comes back


def test_worker_group_is_reused_until_a_failure(ray_local, worker_pids):
    """trial.pool: the next trial of the same rank count runs in the same processes (record.reused counts the
    trials before it there); a failure kills them and the trial after it starts fresh; reuse=False runs in
    processes of its own, killed after it."""
    first = run({})
    pids = set(worker_pids())
    second = run({})
    assert first.status == second.status == "ok" and second.reused == first.reused + 1
    assert set(worker_pids()) == pids and len(pids) == 2  # the same two rank processes
    assert second.wall_s < first.wall_s or first.reused > 0  # no start-up the second time
    m = second.metrics  # where the wall went outside the phases: Ray's hand-off, the reset, the collector
    assert m["handoff_s"] >= 0 and 0 <= m["reset_s"] < second.wall_s and m["gc_s"] >= 0
    assert m["handoff_s"] + m["reset_s"] + m["build_s"] + m["warmup_s"] + m["timed_s"] <= second.wall_s + 0.01
    failed = run({}, fault="assert")
    assert failed.status == "crash" and failed.reused is None
    after = run({})
    assert after.status == "ok" and after.reused == 0 and not set(worker_pids()) & pids
    alone = execute(prepare("tiny", {"precision": "fp32", "micro_batch_size": 4}, device="cpu", workers=2, steps=2,
                            warmup=1, global_batch=32, measure_accum=2), reuse=False)
    assert alone.status == "ok" and alone.reused == 0
    again = run({})
    assert again.reused == 1  # the group of `after` waited while `alone` ran in processes of its own


def settle(pids, want: int, timeout: float = 60) -> set:
    """The rank processes once `want` of them are alive (a killed group's take a moment to exit)."""
    deadline = time.time() + timeout
    while len(pids()) != want and time.time() < deadline:
        time.sleep(0.2)
    return set(pids())


def test_a_warmed_group_runs_the_first_trial_and_one_of_another_kind_is_dropped(ray_local, worker_pids):
    """trial.runner.warm (a search's driver, for its first trial): the group is started before the trial asks, the
    trial runs in it (the same processes, its model already imported: no build cost left in the trial); a group
    warmed for 1 rank frees an idle group of 2 ranks and is given up when a trial of 2 ranks comes first, so no
    processes outlive that."""
    from trainscout.trial.runner import warm

    def spec(workers):
        return prepare("tiny", {"precision": "fp32", "micro_batch_size": 4}, device="cpu", workers=workers, steps=1,
                       warmup=0, global_batch=8 * workers)
    one, two = spec(1), spec(2)
    assert execute(one).status == "ok"  # an earlier test's idle group is of another kind: this frees it
    before = settle(worker_pids, 1)
    assert len(before) == 1
    warm(two)
    deadline = time.time() + 120
    while len(set(worker_pids()) - before) < 2 and time.time() < deadline:  # its 2 ranks start meanwhile
        time.sleep(0.2)
    warmed = set(worker_pids()) - before
    assert len(warmed) == 2
    r = execute(two)
    assert r.status == "ok" and r.reused == 0, r.error
    assert settle(worker_pids, 2) == warmed  # ran in the warmed processes; the idle 1-rank group freed for it
    assert r.metrics["build_s"] < 1.0  # the model's imports were done while warming (3-5 s cold on 2 cores)
    warm(one)  # frees the idle 2-rank group, as run frees a group of another kind (it could starve Tune's actor)
    r = execute(two)  # comes before the 1-rank group is up: that group is given up, its rank killed
    assert r.status == "ok" and r.reused == 0, r.error
    time.sleep(2)
    after = settle(worker_pids, 2)
    assert len(after) == 2 and not after & warmed


def test_hang_is_killed_at_the_timeout(ray_local, worker_pids):
    t = time.time()
    r = run({}, fault="hang@1", timeout=8)  # a hang before step 1 or at it: the same limit kills it (12 s before: a
    assert r.status == "timeout" and "8 s" in r.error  # reused group reaches its first step in 1-2 s, a fresh one 3-5)
    assert time.time() - t < 8 + 10
    deadline = time.time() + 10  # the workers die with the trial
    while worker_pids() and time.time() < deadline:
        time.sleep(0.5)
    assert worker_pids() == []


def test_micro_batch_max_probes_down_in_one_process(ray_local, monkeypatch, capsys):
    """micro_batch_size=max: candidates above the (simulated) capacity fail with a real allocator error and the
    trial steps down without restarting; the largest that fits is measured. TRAINSCOUT_FAKE_CAPACITY_MBS stands
    in for a smaller GPU (the CPU has no device memory limit to hit)."""
    monkeypatch.setenv("TRAINSCOUT_FAKE_CAPACITY_MBS", "5")
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": "max"}, device="cpu", workers=1, steps=2,
                   warmup=1, global_batch=16)
    assert [c["mbs"] for c in spec.probe] == [16, 8, 4, 2, 1]
    spec.fault = None
    from trainscout.trial.runner import worker_env
    monkeypatch.setattr("trainscout.trial.runner.worker_env",
                        lambda s: dict(worker_env(s), TRAINSCOUT_FAKE_CAPACITY_MBS="5"))
    seen = []
    r = execute(spec, timeout=240, on_step=seen.append)
    assert r.status == "ok", (r.error, r.stderr_tail)
    assert r.probe == [[16, "oom"], [8, "oom"], [4, "ok"]]
    # measured at the largest that fits and one below; the record is whichever projects the shorter step
    (m4, t4), (m2, t2) = r.probe_compared
    assert (m4, m2) == (4, 2) and t4 > 0 and t2 > 0
    mbs = 4 if t4 >= t2 else 2
    assert r.plan.micro_batch_size == r.metrics["micro_batch_size"] == mbs and r.grad_accum == 16 // mbs
    assert r.metrics["tokens_per_s"] == pytest.approx(max(t4, t2))
    # the per-step values early stopping sees are on the record's basis: projected with the accumulation of the
    # micro-batch that ran (4 here), not the first candidate's (1), which inflated them by that ratio
    assert len(seen) == 2 and 0.5 < max(s["tokens_per_s"] for s in seen) / t4 < 2
    from trainscout.cli.measure import print_trial
    print_trial(r)  # what `trainscout trial` prints of the probe
    assert "probe    micro_batch_size=max tried 16 oom, 8 oom, 4 ok; measured 4: " in capsys.readouterr().out
    with pytest.raises(Exception, match="micro_batch_size=max"):
        prepare("tiny", {"micro_batch_size": "max"}, device="cpu", workers=2)


def test_bad_fault_switch_is_refused_before_launch(monkeypatch, capsys):
    from trainscout.cli.main import main
    monkeypatch.setenv("TRAINSCOUT_FAULT", "meteor@0")
    assert main(["trial", "--model", "tiny", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "TRAINSCOUT_FAULT" in err and "\n" not in err


def test_probed_micro_batch_compiles_static_graphs_after_an_oom(monkeypatch):
    """An out-of-memory candidate compiled its layers for its own batch size; the micro-batch that fits, and the one
    below, must run graphs compiled for their own shape, as a run at that micro-batch compiles them. Without
    probe.forget_graphs dynamo recompiled the changed batch size with a symbolic batch dimension (automatic
    dynamic): the record measured kernels no user run executes. In this process, with the real plain engine and
    per-layer torch.compile; the simulated capacity fails after a compiled forward and backward, as on a GPU.
    Dynamo logs each symbolic size it creates (whether inductor's caches hit or not): there must be none. Dynamo
    decides the shapes before any backend runs, so the layers compile with backend aot_eager here (dynamo and
    AOTAutograd as in a trial, without inductor's C++ code generation: 45 s with a cold cache, 3 with this)."""
    import functools
    import logging
    import torch
    from trainscout.trial import engines, probe
    monkeypatch.setenv("TRAINSCOUT_FAKE_CAPACITY_MBS", "2")
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": "max", "compile": True, "compile_scope": "layers"},
                   device="cpu", workers=1, steps=1, warmup=2, global_batch=4, measure_accum=2)
    plan, device = spec.plan.replace(), torch.device("cpu")  # a copy the probe steps down, as the worker's

    def make(accum):
        model = build_model(spec.model_config, plan.attn_implementation, spec.recipe["seq_len"])
        model.config.use_cache = False
        return model, engines.build(plan, model, spec.recipe, device, 1, accum)

    class Symbols(logging.Handler):
        seen: list = []

        def emit(self, record):
            if "create_symbol" in record.getMessage():
                self.seen.append(record.getMessage()[:120])
    log, handler = logging.getLogger("torch.fx.experimental.symbolic_shapes"), Symbols()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        torch.compiler.reset()
        compiled = probe.compile_seconds()
        (_, engine), accum, tried = probe.largest_fit(spec, plan, make, device)
        assert tried == [[4, "oom"], [2, "ok"]] and plan.micro_batch_size == 2
        # dynamo's timers, those of the refused candidate's graphs included (forget_graphs cleared them)
        forgotten = probe.forgotten_seconds["compile"]
        assert forgotten > compiled and probe.compile_seconds() > forgotten  # then the fitting candidate's
        batches = [torch.randint(0, 64, (2, spec.recipe["seq_len"]))]

        def timed_step(a):
            for i in range(a):
                engine.micro_step(batches[0], is_last=i == a - 1, scale=1.0 / a)
            engine.optimizer_step()
            return {}, None
        timed_step(accum)
        # no allocator retries in the timed steps (no memory pressure): the micro-batch below is not measured
        assert probe.measure_below(spec, plan, device, batches, timed_step, lambda d: {}, 0) is None
        below = probe.measure_below(spec, plan, device, batches, timed_step, lambda d: {}, None)
        assert below["mbs"] == 1 and plan.micro_batch_size == 2
        engine.close()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        torch.compiler.reset()
    assert handler.seen == []


def test_warm_up_steps_run_two_micro_batches_where_the_engine_lets_the_caller_count_them():
    """A warm-up (and probe) step runs two micro-batches, one that accumulates and the last, which synchronises,
    not all the measured ones (at 1.7B on the H200: 4 of 0.55-1.1 s each); DeepSpeed counts a step's micro-batches
    itself (gradient_accumulation_steps), so its steps run all of them. The real plain engine, in this process."""
    import torch
    from trainscout.trial import engines, probe
    from trainscout.trial.engines.deepspeed import DeepSpeedEngine
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": 2}, device="cpu", workers=1, steps=1, warmup=2,
                   global_batch=8, measure_accum=4)
    assert spec.measured_accum == 4
    model = build_model(spec.model_config, spec.plan.attn_implementation, spec.recipe["seq_len"])
    engine = engines.build(spec.plan, model, spec.recipe, torch.device("cpu"), 1, 4)
    calls, step = [], engine.micro_step
    engine.micro_step = lambda batch, is_last, scale: calls.append((is_last, scale)) or step(batch, is_last, scale)
    probe.probe_step(engine, spec.plan, spec, 4, torch.device("cpu"))
    assert calls == [(False, 0.5), (True, 0.5)] * probe.PROBE_STEPS
    assert probe.warmup_accum(engine, 1) == 1
    assert DeepSpeedEngine.counts_micro_batches and not type(engine).counts_micro_batches
    assert probe.warmup_accum(object.__new__(DeepSpeedEngine), 4) == 4  # the rule, on the class (no ZeRO built)
    engine.close()


def test_a_stopped_trial_leaves_at_a_step_boundary_and_keeps_its_workers(ray_local):
    """Early stopping (a search's ASHA) asks a running trial to stop: its ranks leave after the step they are in,
    the caller gets Cancelled (no record: nothing failed), and the worker group is kept, so the next trial does not
    pay a fresh start. Two gloo ranks: both leave at the same step."""
    from trainscout.trial import pool
    from trainscout.trial.runner import Cancelled
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": 2}, device="cpu", workers=2, steps=60,
                   warmup=1, global_batch=64, measure_accum=0)
    seen = []

    def on_step(p):
        if not seen:
            ray.get(pool.pool().stop.remote(owner="searcher"))
        seen.append(p)
    with pytest.raises(Cancelled):
        execute(spec, timeout=240, on_step=on_step, owner="searcher")
    assert 1 <= len(seen) < 30  # 9 of 60 when measured: the stop arrives with the first report
    r = execute(spec.replace(timed_steps=2), timeout=240)
    assert r.status == "ok" and r.reused >= 1, (r.error, r.reused)


def test_a_warm_process_collects_new_garbage_and_no_longer_traverses_what_it_kept():
    """worker.collect (after every trial and a group's preload): a full collection whose survivors are frozen, so a
    later trial's collections skip them, while the garbage cycles a later trial makes are still freed."""
    import gc

    from trainscout.trial.worker import collect
    kept = [[i] for i in range(1000)]
    frozen = gc.get_freeze_count()
    try:
        collect()
        assert gc.get_freeze_count() >= frozen + len(kept)
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # made after the freeze: freed as before
    finally:
        gc.unfreeze()  # this test process goes on as it was
