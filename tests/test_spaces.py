"""The knob space: a contract test over every registered knob, and every constraint."""
import random

import pytest

from trainscout import spaces
from trainscout.spaces import ConfigError, Context, Plan, resolve

CTX = Context(world_size=2, device="cpu", num_layers=4, global_batch=256,
              installed=frozenset({"torchao"}))  # this CPU box: torchao installed (its optimizers run here)
KNOBS = spaces.all_knobs()
GPU = Context(world_size=1, device="cuda", num_layers=4, global_batch=256, capability="9.0",
              installed=frozenset(p for k in KNOBS for p in k.runtime.packages))  # an H200 with every optional package
PIPELINE = Context(world_size=8, num_layers=16, global_batch=256)
GPUS = Context(world_size=8, device="cuda", num_layers=16, global_batch=256, capability="9.0",
               installed=GPU.installed)  # 8 H200s: a knob that needs several GPUs (context parallel)


def test_builtin_knobs_are_registered():
    names = {k.name for k in KNOBS}
    assert {"zero_stage", "offload_optimizer", "offload_params", "fsdp", "activation_checkpointing",
            "micro_batch_size", "compile", "tf32", "attention", "precision"} <= names


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_knob_contract(knob):
    # a one-line description, a default, a fixed non-empty search domain of distinct values
    assert spaces.description(knob) and "\n" not in spaces.description(knob)
    assert len(knob.choices) == len(set(map(spaces.fmt, knob.choices))) >= 2
    # every requirement names a registered knob and allowed values in its domain
    for other, allowed in knob.requires.items():
        assert other in spaces.REGISTRY
        assert set(allowed) <= set(spaces.REGISTRY[other].choices)
    # the default and every choice round-trip through the CLI spelling
    for v in (knob.default, *knob.choices):
        assert knob.parse(spaces.fmt(v)) == v
    # a value outside the domain is refused with an error that names the knob
    with pytest.raises(ConfigError, match=knob.name):
        knob.parse("surely-not-a-value")
    # every choice, with its requirements satisfied, resolves on some box (the CPU, an H200 with every optional
    # package, 8 ranks for the pipeline, 8 H200s) and changes the plan only through apply
    for v in knob.choices:
        settings = {knob.name: v}
        for other, allowed in knob.requires.items():
            settings[other] = allowed[-1]
        if knob.name == "pipeline_microbatches":
            settings["pipeline_stages"] = 2  # every choice >= 2 stages
        elif settings.get("pipeline_stages", 1) > 1:
            settings.setdefault("pipeline_microbatches", 8)
        errors = []
        for ctx in (CTX, GPU, PIPELINE, GPUS):
            try:
                cfg, plan = resolve(settings, ctx)
                break
            except ConfigError as e:
                errors.append(str(e))
        else:
            raise AssertionError(f"{knob.name}={spaces.fmt(v)} resolves nowhere: {errors}")
        assert cfg[knob.name] == v
        assert isinstance(plan, Plan) and Plan.from_dict(plan.to_dict()) == plan
    # the runtime role: a declared stage of the runtime's order, with its own transform; every role a role object
    from trainscout.runtime import STAGES
    from trainscout.spaces import plugins, roles
    assert knob.runtime.stage is None or knob.runtime.stage in STAGES
    assert (knob.runtime.stage is not None) == (type(knob.runtime).transform is not roles.Runtime.transform)
    assert plugins.role_problem(knob) is None


def test_defaults_resolve_to_plain_ddp():
    cfg, plan = resolve({}, CTX)
    assert plan.engine == "ddp" and plan.precision == "bf16-mixed" and plan.engine_config == {}
    assert cfg["micro_batch_size"] == 8 and plan.grad_accum == 16  # auto: largest divisor of 128 <= 8


@pytest.mark.parametrize("settings, field, fix", [
    ({"offload_params": True, "zero_stage": 2}, "offload_params", "set zero_stage=3 or offload_params=false"),
    ({"offload_optimizer": True}, "offload_optimizer", "set zero_stage=3 or offload_optimizer=false"),
    ({"fsdp": "full_shard", "zero_stage": 1}, "fsdp", "set zero_stage=0 or fsdp=off"),
    ({"micro_batch_size": 3}, "micro_batch_size", "choose a divisor such as 2, 4"),
    ({"micro_batch_size": 0}, "micro_batch_size", "positive integer"),
    ({"micro_batch_size": "many"}, "micro_batch_size", "positive integer"),
    ({"zero_stage": 4}, "zero_stage", "choose one of 0|1|2|3"),
    ({"zero_stage": float("nan")}, "zero_stage", "choose one of"),
    ({"precision": "fp8"}, "precision", "choose one of"),
    ({"precision": "fp16-mixed"}, "precision", "needs a CUDA GPU"),
    ({"attention": "flash"}, "attention", "set attention=sdpa"),
    ({"sdpa_backend": "cudnn"}, "sdpa_backend", "set sdpa_backend=flash, math or auto"),
    ({"sdpa_backend": "flash", "attention": "eager"}, "sdpa_backend", "attention=sdpa"),
    ({"activation_checkpointing": 9}, "activation_checkpointing", "choose n <= 4"),
    ({"fsdp": "full_shard", "precision": "fp16-mixed"}, "fsdp", "set precision=bf16-mixed or fsdp=off"),
    ({"zero_stagee": 1}, "zero_stagee", "did you mean zero_stage"),
    ({"compile_scope": "layers"}, "compile_scope", "set compile=true"),
    ({"compile": True, "compile_scope": "layers", "zero_stage": 1}, "compile_scope",
     "set compile_scope=model or zero_stage=0"),
])
def test_constraints_refuse_with_the_fix(settings, field, fix):
    ctx = GPU if settings.get("precision") == "fp16-mixed" and "fsdp" in settings else CTX
    with pytest.raises(ConfigError) as e:
        resolve(settings, ctx)
    msg = str(e.value)
    assert e.value.field == field and field in msg and fix in msg and "\n" not in msg


def test_compile_scope_auto_is_layers_on_pytorch_engines_and_model_under_deepspeed():
    assert resolve({"compile": True}, CTX)[1].compile_scope == "layers"
    assert resolve({"compile": True, "fsdp": "full_shard"}, CTX)[1].compile_scope == "layers"
    assert resolve({"compile": True, "zero_stage": 2}, CTX)[1].compile_scope == "model"
    # measured on the H200: the flash kernel takes no mask, and a model traced whole passes one
    with pytest.raises(ConfigError, match="set compile_scope=layers or sdpa_backend=auto") as e:
        resolve({"compile": True, "compile_scope": "model", "sdpa_backend": "flash"}, GPU)
    assert e.value.field == "sdpa_backend"
    assert resolve({"compile": True, "sdpa_backend": "flash"}, GPU)[1].compile_scope == "layers"


def test_efficient_sdpa_is_refused_for_grouped_query_attention():
    """The Llama-1B shape (32 query heads over 8 key/value heads): transformers calls SDPA with enable_gqa, which the
    memory-efficient kernel cannot run on the H200 (a search's trial crashed on it); Pythia's heads are not grouped."""
    import dataclasses
    import json
    import pathlib
    llama = json.loads((pathlib.Path(__file__).parents[1] / "bench" / "models" / "llama-1b.json").read_text())
    ctx = dataclasses.replace(GPU, model_config=llama)
    with pytest.raises(ConfigError, match="set sdpa_backend=flash, cudnn or auto") as e:
        resolve({"sdpa_backend": "efficient", "compile": True}, ctx)
    assert e.value.field == "sdpa_backend" and "32 query heads over 8" in str(e.value)
    for ok in ({"sdpa_backend": "cudnn"}, {"sdpa_backend": "efficient", "compile": True, "compile_scope": "model"}):
        resolve(ok, ctx)
    from trainscout.trial.models import resolve_model
    resolve({"sdpa_backend": "efficient"}, dataclasses.replace(GPU, model_config=resolve_model("pythia-160m").config))


def test_global_batch_must_split_over_ranks():
    with pytest.raises(ConfigError, match="global_batch=33 does not split over 2"):
        resolve({}, Context(world_size=2, global_batch=33, num_layers=2))


def test_accumulation_is_exact():
    for mbs in (1, 2, 4, 8, 16):
        cfg, plan = resolve({"micro_batch_size": mbs}, CTX)
        assert CTX.world_size * plan.micro_batch_size * plan.grad_accum == CTX.global_batch


def test_random_samples_never_break_an_invariant():
    """Many random combinations: each either resolves to a consistent plan or is refused with a one-line error."""
    rng = random.Random(0)
    ok = refused = n = 0
    while (ok < 150 or refused < 150) and n < 100000:  # a count of each, not of draws: each new knob refuses more draws
        n += 1
        settings = {k.name: rng.choice(k.choices) for k in KNOBS if rng.random() < 0.6}
        ctx = rng.choice([CTX, GPU])
        try:
            cfg, plan = resolve(settings, ctx)
        except ConfigError as e:
            assert "\n" not in str(e) and e.field in str(e) and ":" in str(e)
            refused += 1
            continue
        ok += 1
        assert (plan.engine == "deepspeed") == (cfg["zero_stage"] > 0)
        assert (plan.engine == "fsdp") == (cfg["fsdp"] != "off")
        assert not (cfg["offload_params"] and cfg["zero_stage"] != 3)
        assert not (cfg["offload_optimizer"] and cfg["zero_stage"] == 0)
        assert (plan.engine == "pipeline") == (cfg["pipeline_stages"] > 1)
        assert (plan.master_dtype == "bfloat16") == (cfg["precision"] == "bf16")
        assert cfg["optimizer_impl"] in (("foreach", "fused") if cfg["optimizer_state"] == "fp32" and
                                         cfg["precision"] != "bf16" else ("auto",))
        assert ctx.data_parallel_ranks(cfg) * plan.sequences_per_call * plan.grad_accum == ctx.global_batch
    assert ok > 100 and refused > 100


def _special_values(knob) -> list:
    """The words outside a knob's search domain that it takes (max, auto), as parse reads them."""
    out = []
    for word in ("max", "auto"):
        try:
            out.append(knob.parse(word))
        except ConfigError:
            pass
    return out


# small recipes (global batch 1..4) on 1-8 ranks, CPU and an H200; pipeline settings (none first) with a schedule of
# one model chunk per rank and one of two (the chunks are what the layer count must split into)
SMALL = [Context(world_size=w, device=box.device, num_layers=L, global_batch=g, capability=box.capability,
                 installed=box.installed) for w in (1, 2, 4, 8) for g in (1, 2, 3, 4) for L in (2, 4)
         for box in (CTX, GPU)]
PIPELINES = [{}] + [{"pipeline_stages": s, "pipeline_microbatches": m, "pipeline_schedule": sc}
                    for s in spaces.get("pipeline_stages").choices[1:]
                    for m in spaces.get("pipeline_microbatches").choices
                    for sc in ("1f1b", "interleaved_1f1b")]


def _resolves_or_refuses(settings, ctx):
    """resolve() either gives a plan whose batch adds up or refuses with a one-line ConfigError naming the field
    (any other exception fails the test: it would crash the search's feasibility check)."""
    try:
        cfg, plan = resolve(settings, ctx)
    except ConfigError as e:
        assert "\n" not in str(e) and e.field in str(e) and ":" in str(e), (settings, ctx, str(e))
        return False
    assert plan.micro_batch_size >= 1 and plan.grad_accum >= 1, (settings, ctx, plan)
    assert ctx.data_parallel_ranks(cfg) * plan.sequences_per_call * plan.grad_accum == ctx.global_batch
    return True


def test_max_and_auto_refuse_only_with_config_error():
    """Found by `search --set micro_batch_size=max` on the tiny recipe: the feasibility check sampled 32 pipeline
    micro-batches for a per-rank batch of 16 and micro_batch_size's apply ended in `max() arg is an empty sequence`.
    Every knob's max/auto value against small recipes and every pipeline setting, then random mixes of all knobs."""
    specials = [(k, v) for k in KNOBS for v in _special_values(k)]
    assert {("micro_batch_size", "max"), ("micro_batch_size", "auto")} <= {(k.name, v) for k, v in specials}
    ok = 0
    for knob, value in specials:
        base = {knob.name: value, **{o: a[-1] for o, a in knob.requires.items()}}
        for ctx in SMALL:
            for pipe in PIPELINES:
                ok += _resolves_or_refuses({**base, **pipe}, ctx)
    rng = random.Random(1)
    for _ in range(2000):
        settings = {k.name: rng.choice([*k.choices, *_special_values(k)]) for k in KNOBS if rng.random() < 0.5}
        ok += _resolves_or_refuses({**settings, **rng.choice(PIPELINES)}, rng.choice(SMALL))
    assert ok > 100  # the loop reached plans, not only refusals


def test_pipeline_micro_batches_beyond_the_per_rank_batch_name_the_fix():
    for mbs in ("max", "auto", 1):
        with pytest.raises(ConfigError) as e:
            resolve({"micro_batch_size": mbs, "pipeline_stages": 2, "pipeline_microbatches": 32},
                    Context(world_size=2, num_layers=4, global_batch=16))
        assert e.value.field == ("micro_batch_size" if mbs == "max" else "pipeline_microbatches")
        assert ("pipeline_stages=1" if mbs == "max" else "choose pipeline_microbatches=16") in str(e.value)


def test_sampling_order_puts_requirements_first():
    order = [k.name for k in KNOBS]
    for i, k in enumerate(KNOBS):
        for other in k.requires:
            assert order.index(other) < i


def test_yaml_booleans_read_as_the_domain_words():
    """YAML 1.1 (PyYAML) reads a bare `off` as False: fsdp: [off, full_shard] must still mean "off"."""
    import yaml
    raw = yaml.safe_load("fsdp: [off, full_shard]")["fsdp"]
    assert [spaces.get("fsdp").parse(v) for v in raw] == ["off", "full_shard"]
    with pytest.raises(ConfigError):
        spaces.get("zero_stage").parse(True)


def test_registry_loads_once_for_concurrent_threads():
    """Found on the GPU box: trials prepared from two threads saw a half-loaded registry ("unknown knob")."""
    import subprocess
    import sys
    code = ("from concurrent.futures import ThreadPoolExecutor\n"
            "from trainscout.spaces import Context, resolve\n"
            "ctx = Context(world_size=1, num_layers=4, global_batch=64)\n"
            "with ThreadPoolExecutor(8) as p:\n"
            "    print(sum(1 for _ in p.map(lambda i: resolve({'micro_batch_size': 8, 'zero_stage': i % 4}, ctx), "
            "range(64))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "64", out.stderr[-2000:]


def test_resolve_gives_one_answer_under_every_order_of_the_knobs():
    """Two-phase resolve: concretise all, check all, apply all. Swapping compile_scope and sdpa_backend made the
    one-pass resolve accept sdpa_backend=flash with the model compiled whole (its rule read compile_scope before
    it was concretised from auto)."""
    import random

    from trainscout.spaces import all_knobs, resolve
    ctx = Context(world_size=2, device="cuda", num_layers=4, global_batch=64, capability="9.0")
    knobs = all_knobs()
    orders = [knobs, knobs[::-1]] + [random.Random(seed).sample(knobs, len(knobs)) for seed in range(30)]
    scope_last = [k for k in knobs if k.name != "compile_scope"] + [k for k in knobs if k.name == "compile_scope"]
    for settings in ({"compile": True, "zero_stage": 1}, {"micro_batch_size": "auto", "pipeline_stages": 2},
                     {"fsdp": "full_shard", "activation_checkpointing": 2, "compile": True}):
        answers = {repr(resolve(settings, ctx, order)) for order in orders}
        assert len(answers) == 1, settings
    for order in [*orders, scope_last]:  # zero_stage makes compile_scope=auto the whole model: flash refused
        with pytest.raises(ConfigError, match="sdpa_backend=flash takes no mask tensor"):
            resolve({"compile": True, "zero_stage": 1, "sdpa_backend": "flash"}, ctx, order)


def test_every_knobs_optimizer_hook_keeps_the_spec_whole_and_the_order_is_declared():
    """Runtime.optimizer over every registered knob and every value that resolves: the spec stays an OptimizerSpec, a
    class that takes its keyword arguments, states named and bytes per parameter > 0; `order` is an int on every
    knob."""
    import inspect

    from trainscout.spaces.roles import OptimizerSpec
    from trainscout.trial.engines.base import optimizer_spec
    recipe = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.0}
    for knob in KNOBS:
        assert isinstance(knob.runtime.order, int), knob.name
        for value in knob.choices:
            for ctx in (CTX, GPU):
                try:
                    _, plan = resolve({knob.name: value}, ctx)
                except ConfigError:
                    continue
                spec = optimizer_spec(plan, recipe, ctx.device)
                # step_cost: the optimizer step's cost against fused fp32 AdamW's (predictor/steptime.py)
                assert isinstance(spec, OptimizerSpec), (knob.name, value)
                assert spec.step_cost > 0
                assert set(spec.kwargs) <= set(inspect.signature(spec.cls.__init__).parameters)
                assert spec.states and spec.bytes > 0
