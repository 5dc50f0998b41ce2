"""The optimizer hook (Runtime.optimizer) and its knobs on the real parts: optimizer_impl (torch's foreach and fused
AdamW, both on the CPU), optimizer_state (torchao.optim's AdamW8bit, AdamW4bit, AdamWFp8 and bf16 states, compiled on
the CPU), precision=bf16 (bf16 weights, torchao's _AdamW with stochastic rounding). Each engine is built in-process as a
trial's worker builds it; what its optimizer stepped is read by predictor.dtypes and checked against the label."""
import pytest
import torch

from trainscout.runtime import transforms
from trainscout.spaces import ConfigError, Context, resolve
from trainscout.predictor import dtypes, memory
from trainscout.trial import engines
from trainscout.trial.engines.base import optimizer_spec
from trainscout.trial.models import build_model, resolve_model

RECIPE = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.01, "grad_clip": 1.0, "seq_len": 32}
CTX = Context(world_size=1, device="cpu", num_layers=2, global_batch=2, installed=frozenset({"torchao"}),
              model_config=resolve_model("tiny").config)


def plan_of(**settings):
    return resolve(dict(settings, micro_batch_size=2), CTX)[1]


def trained(plan, steps=2):
    """The tiny model under the plan's engine, `steps` optimizer steps: (engine, the dtypes its optimizer stepped)."""
    torch.manual_seed(0)
    config = resolve_model("tiny").config
    model = build_model(config, plan.attn_implementation, 32, plan.master_dtype)
    engine = engines.build(plan, model, RECIPE, torch.device("cpu"), 1, 1)
    seen = dtypes.watch(engine.optimizers())
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        engine.micro_step(torch.randint(0, config["vocab_size"], (2, 32), generator=gen), is_last=True, scale=1.0)
        engine.optimizer_step()
    return engine, seen


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_builds_the_kernel_it_names(impl):
    engine, seen = trained(plan_of(optimizer_impl=impl), steps=1)
    group = engine.opt.param_groups[0]
    assert type(engine.opt) is torch.optim.AdamW and group["fused"] is (impl == "fused")
    assert group["foreach"] is (True if impl == "foreach" else None)
    dtypes.check(seen, engine_plan := plan_of(optimizer_impl=impl))
    assert seen["optimizer"] == dtypes.expected(engine_plan)["optimizer"] == "float32"


def test_optimizer_impl_auto_is_todays_choice_and_one_configuration_with_it():
    cpu, _ = resolve({}, CTX)
    assert cpu["optimizer_impl"] == "foreach"  # auto decided: the same key as foreach set by hand
    gpu = Context(world_size=1, device="cuda", num_layers=2, global_batch=2, capability="9.0")
    cfg, plan = resolve({}, gpu)
    assert cfg["optimizer_impl"] == "fused" and optimizer_spec(plan, RECIPE, "cuda").kwargs["fused"] is True
    # a plan stored before the knob (no plan.knobs entry) keeps the device's choice
    from trainscout.spaces import Plan
    assert optimizer_spec(Plan(), RECIPE, "cuda").kwargs["fused"] is True
    assert optimizer_spec(Plan(), RECIPE, "cpu").kwargs["foreach"] is True


def test_fsdp_cpu_offload_runs_fused_and_says_so():
    ctx = Context(world_size=2, device="cpu", num_layers=2, global_batch=4, installed=frozenset({"torchao"}))
    cfg, _ = resolve({"fsdp": "full_shard_offload", "micro_batch_size": 2}, ctx)
    assert cfg["optimizer_impl"] == "fused"  # what trial/engines/fsdp.py steps the host's shards with
    with pytest.raises(ConfigError, match="full_shard_offload steps the shards on the host.*set optimizer_impl=auto"):
        resolve({"fsdp": "full_shard_offload", "optimizer_impl": "foreach", "micro_batch_size": 2}, ctx)


def test_optimizer_impl_is_refused_beside_torchaos_optimizers_naming_the_fix():
    with pytest.raises(ConfigError, match="optimizer_impl=fused needs optimizer_state=fp32.*set optimizer_state=fp32"):
        plan_of(optimizer_impl="fused", optimizer_state="8bit")
    with pytest.raises(ConfigError, match="optimizer_impl=foreach needs precision="):
        plan_of(optimizer_impl="foreach", precision="bf16")


@pytest.mark.parametrize("state,cls,label", [("8bit", "AdamW8bit", "8bit"), ("4bit", "AdamW4bit", "4bit"),
                                              ("fp8", "AdamWFp8", "fp8"), ("bf16", "AdamWBf16States", "bfloat16")])
def test_optimizer_state_steps_torchaos_states_and_the_record_says_so(state, cls, label):
    plan = plan_of(optimizer_state=state)
    engine, seen = trained(plan)
    assert type(engine.opt).__name__ == cls
    # the tiny model's matrices are quantised (>= 4096 values), its norms and biases stay fp32 (torchao's rule)
    assert seen["weights"] == seen["gradients"] == "float32"
    assert set(seen["optimizer"].split("+")) == {label, "float32"}
    dtypes.check(seen, plan)
    assert all(torch.isfinite(p).all() for p in engine.params)


def test_a_quantised_label_whose_optimizer_keeps_fp32_states_is_no_measurement():
    """What a hook that changed nothing would give: the plan says 8bit, torch's AdamW steps fp32 states."""
    _, seen = trained(plan_of(), steps=1)
    with pytest.raises(dtypes.DtypeMismatch, match="8bit optimizer states.*optimizer in float32"):
        dtypes.check(seen, plan_of(optimizer_state="8bit"))


def test_optimizer_state_bytes_come_from_torchaos_block_sizes_and_reach_the_memory_model():
    import inspect

    import torchao.optim
    block8 = inspect.signature(torchao.optim.AdamW8bit.__init__).parameters["block_size"].default
    block4 = inspect.signature(torchao.optim.AdamW4bit.__init__).parameters["block_size"].default
    want = {"fp32": 8.0, "bf16": 4.0, "8bit": 2 * (1 + 4 / block8), "4bit": 2 * (0.5 + 4 / block4),
            "fp8": 2 * (1 + 4 / 256)}
    assert want["8bit"] == 2.03125 and want["4bit"] == 1.0625
    from trainscout.trial import prepare
    fp32 = memory.components(prepare("tiny", {"micro_batch_size": 2}, device="cpu", hw=HW))
    N = fp32["optimizer"] / 8
    for state, per in want.items():
        assert optimizer_spec(plan_of(optimizer_state=state)).bytes == pytest.approx(per)
        comp = memory.components(prepare("tiny", {"micro_batch_size": 2, "optimizer_state": state}, device="cpu",
                                         hw=HW))
        assert comp["optimizer"] == pytest.approx(per * N)
        assert comp["weights"] == fp32["weights"] and comp["gradients"] == fp32["gradients"]


HW = {"device": "cpu", "cpu": "x", "cpu_count": 2}


def test_optimizer_state_measured_memory_is_the_estimate():
    """The states torchao really holds on the tiny model, in bytes: each quantised state is exactly the memory
    model's bytes per parameter (codes + fp32 block scales) plus its lookup table; the states torchao leaves in fp32
    (< 4096 values: norms, biases) are what the model's per-parameter term misses (a share of tiny's parameters,
    < 0.1 % of a 1B model's)."""
    for state in ("8bit", "4bit", "fp8"):
        plan = plan_of(optimizer_state=state)
        engine, _ = trained(plan, steps=1)
        per = optimizer_spec(plan).bytes / 2  # one state
        quantised = small = tables = 0
        for p, st in engine.opt.state.items():
            for k in ("exp_avg", "exp_avg_sq"):
                v = st[k]
                if hasattr(v, "codes"):
                    assert v.codes.numel() * v.codes.element_size() + v.scale.numel() * 4 == per * p.numel()
                    quantised += per * p.numel()
                    tables += v.qmap.numel() * 4 if hasattr(v, "qmap") else 0
                else:
                    assert p.numel() < 4096 and v.dtype == torch.float32
                    small += v.numel() * 4
        n = sum(p.numel() for p in engine.params)
        est = optimizer_spec(plan).bytes * n
        n_small = small / 8
        assert est - quantised == pytest.approx(per * 2 * n_small)  # the estimate counts them quantised
        # the lookup tables: 256 (8bit) or 16 (4bit) fp32 values per state tensor, not per parameter (0.3 MiB on a
        # 1B model's 150 matrices): not a term of the memory model
        assert quantised > 0 and tables <= 2 * 256 * 4 * len(engine.opt.state)


def test_optimizer_state_refusals_name_the_fix():
    with pytest.raises(ConfigError, match="offload_optimizer steps DeepSpeed's own CPU Adam.*offload_optimizer=false"):
        plan_of(optimizer_state="8bit", zero_stage=2, offload_optimizer=True)
    with pytest.raises(ConfigError, match="keeps fp32 states for its flat partitions: set zero_stage=0"):
        plan_of(optimizer_state="4bit", zero_stage=1)
    with pytest.raises(ConfigError, match="cannot step bf16 DTensor shards.*set precision=bf16-mixed, fsdp=off"):
        resolve({"optimizer_state": "8bit", "precision": "bf16", "fsdp": "full_shard", "micro_batch_size": 2},
                Context(world_size=2, device="cpu", num_layers=2, global_batch=4, installed=frozenset({"torchao"})))
    with pytest.raises(ConfigError, match="needs torchao.*set optimizer_state=fp32"):
        resolve({"optimizer_state": "8bit"}, Context(world_size=1, device="cpu", num_layers=2, global_batch=2))


def test_precision_bf16_trains_bf16_weights_gradients_and_states_with_stochastic_rounding():
    plan = plan_of(precision="bf16")
    assert plan.master_dtype == "bfloat16" and engines.base.autocast_dtype(plan.precision) is None  # no autocast
    engine, seen = trained(plan)
    assert type(engine.opt).__name__ == "_AdamW" and engine.opt.bf16_stochastic_round
    assert seen == {"weights": "bfloat16", "gradients": "bfloat16", "optimizer": "bfloat16"}
    dtypes.check(seen, plan)
    # under 8-bit states too: bf16 weights, 8-bit states beside the bf16 ones torchao keeps for small tensors
    plan8 = plan_of(precision="bf16", optimizer_state="8bit")
    engine, seen = trained(plan8, steps=1)
    assert engine.opt.bf16_stochastic_round and set(seen["optimizer"].split("+")) == {"8bit", "bfloat16"}
    dtypes.check(seen, plan8)


def test_precision_bf16_memory_halves_the_model_states_without_autocast_copies():
    from trainscout.trial import prepare
    mixed = memory.components(prepare("tiny", {"micro_batch_size": 2}, device="cpu", hw=HW))
    pure = memory.components(prepare("tiny", {"micro_batch_size": 2, "precision": "bf16"}, device="cpu", hw=HW))
    N = mixed["gradients"] / 4
    assert pure["weights"] == 2 * N and pure["gradients"] == 2 * N and pure["optimizer"] == 4 * N


def test_precision_bf16_numerics_and_refusals():
    from trainscout.spaces import get
    ctx = CTX
    assert "bf16 weights" in get("precision").numerics.why("bf16", {}, ctx)
    assert get("optimizer_state").numerics.why("8bit", {}, ctx)  # the quality gate compares it with fp32 states
    with pytest.raises(ConfigError, match="not DeepSpeed's bf16 mode.*set precision=bf16-mixed or zero_stage=0"):
        plan_of(precision="bf16", zero_stage=1)
    with pytest.raises(ConfigError, match="optimizer_state=bf16: precision=bf16 keeps"):
        plan_of(precision="bf16", optimizer_state="bf16")


def test_hooks_run_in_the_declared_order_not_by_name():
    from trainscout.spaces import get
    from trainscout.spaces.knob import in_order
    order = [k.name for k in transforms()]
    assert order.index("experts") < order.index("fp8") and get("fp8").runtime.order > get("experts").runtime.order
    # a knob named to sort first, declared later, runs later
    names = [k.name for k in in_order([get("optimizer_state"), get("precision"), get("optimizer_impl")])]
    assert names.index("optimizer_state") == 2


# real trials: 2 gloo ranks in the trial's worker processes, the record's dtypes as the optimizer stepped them
TRIALS = {
    "ddp-8bit": ({"optimizer_state": "8bit", "precision": "bf16-mixed"}, {"8bit", "float32"}, "float32"),
    "ddp-bf16": ({"precision": "bf16"}, {"bfloat16"}, "bfloat16"),  # bf16 gradients all-reduced
    "pipeline-bf16-4bit": ({"pipeline_stages": 2, "precision": "bf16", "optimizer_state": "4bit"}, {"4bit", "bfloat16"},
                           "bfloat16"),
    "fsdp2-4bit": ({"fsdp": "full_shard", "precision": "bf16-mixed", "optimizer_state": "4bit"}, {"4bit", "float32"},
                   "float32"),  # torchao's states over FSDP2's DTensor shards
    "fsdp2-bf16": ({"fsdp": "full_shard", "precision": "bf16"}, {"bfloat16"}, "bfloat16"),
    "pipeline-fused": ({"pipeline_stages": 2, "optimizer_impl": "fused"}, {"float32"}, "float32"),
}


def trial_spec(case):
    """The real trials of this file, by name (tests/prewarm.py compiles their graphs ahead, in processes of its own):
    a case of TRIALS, "gated" (precision=bf16 on one rank, its quality gate) or "zero" (8-bit states forced under
    ZeRO-2)."""
    from trainscout.trial import prepare
    if case == "gated":
        return prepare("tiny", {"micro_batch_size": 2, "precision": "bf16"}, device="cpu", workers=1, steps=2,
                       warmup=1, global_batch=4, measure_accum=2)
    if case == "zero":
        spec = prepare("tiny", {"micro_batch_size": 2, "zero_stage": 2}, device="cpu", workers=2, steps=2, warmup=1,
                       global_batch=8, measure_accum=2)
        spec.plan.knobs["optimizer_state"] = "8bit"
        return spec
    return prepare("tiny", {"precision": "fp32", "micro_batch_size": 4, **TRIALS[case][0]}, device="cpu", workers=2,
                   steps=2, warmup=1, global_batch=32, measure_accum=2)


@pytest.mark.parametrize("case", sorted(TRIALS))
def test_a_real_trial_trains_what_the_optimizer_knobs_say(case):
    from trainscout.trial import execute
    settings, states, weights = TRIALS[case]
    rec = execute(trial_spec(case), timeout=300)
    assert rec.ok, rec.error
    seen = rec.metrics["dtypes"]
    assert seen["weights"] == seen["gradients"] == weights
    assert set(seen["optimizer"].split("+")) == states
    assert rec.metrics["optimizer_s"] > 0


def test_precision_bf16_is_gated_against_bf16_mixed_in_a_real_trial():
    from trainscout.trial import execute
    rec = execute(trial_spec("gated"), timeout=300)
    assert rec.ok, rec.error
    q = rec.metrics["quality"]
    assert q["reference"] == {"precision": "bf16-mixed"} and q["gate"] == "passed" and q["loss_rel_diff"] < 0.01
    assert rec.metrics["dtypes"] == {"weights": "bfloat16", "gradients": "bfloat16", "optimizer": "bfloat16"}
    # what that step cannot see, said with the trial
    assert any("not the stochastically rounded updates" in n for n in rec.plan.notes)
    assert any("which optimizer states do not change" in n for n in plan_of(optimizer_state="8bit").notes)


def test_why_zero_is_refused_torchao_keeps_fp32_states_for_deepspeeds_partitions():
    """The plan the refusal keeps out, forced past it: under ZeRO-2 the client AdamW8bit steps DeepSpeed's flat fp32
    partitions with fp32 states, and predictor.dtypes fails the trial instead of recording 8-bit states."""
    from trainscout.trial import execute
    rec = execute(trial_spec("zero"), timeout=400)
    assert not rec.ok and "DtypeMismatch" in rec.error and "8bit optimizer states" in rec.error
    assert "optimizer in float32" in rec.error


def test_fsdp2_memory_model_counts_optimizer_state_bytes():
    from trainscout.trial import prepare
    hw = {"device": "cpu", "cpu": "x", "cpu_count": 2}
    fp32 = memory.components(prepare("tiny", {"micro_batch_size": 2, "fsdp": "full_shard"}, device="cpu", hw=hw,
                                     workers=2))
    q = memory.components(prepare("tiny", {"micro_batch_size": 2, "fsdp": "full_shard", "optimizer_state": "8bit"},
                                  device="cpu", hw=hw, workers=2))
    assert q["optimizer"] == pytest.approx(fp32["optimizer"] * 2.03125 / 8)
