"""No silent knob (issue 46, item 1): every value of every registered knob away from its default changes what a trial
builds — the plan's fields the engines, the model build and the memory model read (plan.knobs alone is read by
nothing but hooks, so it does not count), the model's modules after the knobs' transforms (their types, parameter
dtypes, wrapped forwards, the process-wide kernel flags), the optimizer (class, keyword arguments, states), the
memory model's terms, the workers' environment. Built on the CPU with the tiny model where the value resolves there
on one rank; values that cannot run on this CPU (a GPU, several ranks, a mixture of experts) are compared on the plan,
the optimizer spec and the memory model alone, and listed as such.

A knob that changes nothing (a test registers one) fails the check; spaces.plugins leaves such a plugin out, named."""
import subprocess
import sys
import textwrap

import pytest
import torch

from trainscout.runtime import installed_packages, prepare_model, wrap_step
from trainscout.spaces import (REGISTRY, ConfigError, Context, Knob, ParallelDims, all_knobs, fmt, plugins, register,
                               resolve)
from trainscout.predictor import memory
from trainscout.trial.engines.base import optimizer_spec
from trainscout.trial.models import build_model, resolve_model
from trainscout.trial.records import TrialSpec

TINY = resolve_model("tiny")
# room for checkpointing every 4th layer, 8 pipeline stages and 8 tensor-parallel ranks
DEEP = dict(TINY.config, num_hidden_layers=8, num_attention_heads=8)
# a setting a value needs beside it, the same for the default's build
COMPANIONS = {("pipeline_stages", 8): {"pipeline_microbatches": 8}}
MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
       "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512,
       "max_position_embeddings": 256, "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []}
RECIPE = dict(TINY.recipe.to_dict(), seq_len=32, global_batch=256)
ALL = frozenset({p for k in all_knobs() for p in k.runtime.packages})


def contexts(config):
    """Where a value is tried, first the one it is built in: this CPU on one rank, then (plan only) two CPU ranks,
    then an H100-like GPU with every optional package on 1, 2 and 4 ranks."""
    kw = dict(num_layers=config["num_hidden_layers"], global_batch=256, model_config=config, seq_len=32)
    return [("cpu", Context(world_size=1, device="cpu", installed=installed_packages(), **kw)),
            ("plan", Context(world_size=2, device="cpu", installed=installed_packages(), **kw)),
            *[("plan", Context(world_size=w, device="cuda", capability="9.0", installed=ALL, **kw))
              for w in (1, 2, 4, 8)]]


def settings_for(knob: Knob, value) -> dict:
    """The value, with the knobs it requires at an allowed value (their last, as the requirement error names)."""
    out = {other: allowed[0] for other, allowed in knob.requires.items() if REGISTRY[other].default not in allowed}
    for other in list(out):  # one level of their own requirements
        out.update({o: a[0] for o, a in REGISTRY[other].requires.items()
                    if o not in out and REGISTRY[o].default not in a})
    return {**out, "micro_batch_size": 2, **COMPANIONS.get((knob.name, value), {}), knob.name: value}


def built(plan, ctx, config, modules: bool) -> dict:
    """What a trial builds under the plan (modules: the tiny model through every transform, on this CPU; for a plan of
    another device or several ranks only where its transforms run here, as the process-wide kernel flags do)."""
    fields = {k: v for k, v in plan.to_dict().items() if k not in ("knobs", "notes")}
    spec = optimizer_spec(plan, RECIPE, ctx.device)
    out = {"plan": fields, "optimizer": (spec.cls.__qualname__, sorted(spec.kwargs.items()), spec.states, spec.bytes)}
    trial = TrialSpec(model="m", model_config=config, device=ctx.device, world_size=ctx.world_size, config={},
                      plan=plan, recipe=RECIPE, grad_accum=plan.grad_accum, measured_accum=1, timed_steps=1,
                      warmup_steps=0)
    out["memory"] = memory.components(trial)
    def step(model, batch, scale, **kw):  # a micro-batch's forward and backward, as the engines pass it
        return None
    out["step"] = wrap_step(step, plan, ParallelDims.of(plan, ctx.world_size)) is step  # a knob's wrap_step
    if modules:
        out["modules"] = modules_of(plan, config)
    else:
        try:
            out["modules"] = modules_of(plan, config)
        except Exception as e:  # noqa: BLE001 - a transform that needs a GPU or a process group: the plan alone
            out["modules"] = type(e).__name__
    return out


def modules_of(plan, config):
    """The tiny model's modules after every transform of the plan, with the process-wide flags they set."""
    torch.manual_seed(0)
    model = build_model(config, plan.attn_implementation, 32, plan.master_dtype)
    model = prepare_model(prepare_model(model, plan), plan, after_sharding=True)
    b = torch.backends.cuda
    return ([(n, type(m).__name__, sorted(k for k, v in vars(m).items() if callable(v)), len(m._forward_pre_hooks),
              len(m._forward_hooks), len(m._backward_hooks) + len(m._backward_pre_hooks))
             for n, m in model.named_modules()],
            sorted({(n, str(p.dtype)) for n, p in model.named_parameters()}),
            (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled(),
             torch.get_float32_matmul_precision()),
            getattr(model.config, "_experts_implementation", None))


@pytest.fixture(autouse=True)
def default_process_settings():
    """The process-wide settings a default trial's transforms leave (sdpa_backend, tf32), restored after each test:
    the tests after these run in this process."""
    yield
    modules_of(resolve({}, contexts(TINY.config)[0][1])[1], TINY.config)


# values that build the same as the default wherever they run, and why (not the knob under test's doing)
SAME = {
    # experts.py has no concrete(): auto is transformers' choice, grouped_mm wherever its kernel runs (here too), so
    # grouped_mm and auto are one build under two names and two measurement keys (reported with this test)
    "experts=grouped_mm": "auto is transformers' grouped_mm where it runs",
}


def silent_values(knob: Knob) -> tuple[list[str], list[str]]:
    """(values that change nothing, values compared on the plan only, each with where). A value that only ever
    concretises to what the default does (compile_scope=layers: auto's choice where layers can run) is no other
    configuration and is skipped."""
    silent, plan_only = [], []
    for value in knob.choices:
        if value == knob.default:
            continue
        resolved = False
        for config in (DEEP, MOE):
            found = None
            for where, ctx in contexts(config):
                try:
                    cfg_v, plan_v = resolve(settings_for(knob, value), ctx)
                    cfg_d, plan_d = resolve(settings_for(knob, knob.default), ctx)
                except ConfigError:
                    continue
                resolved = True
                if cfg_v[knob.name] == cfg_d[knob.name]:  # the default concretises to it here (auto): not away
                    continue
                found = (where, ctx, plan_v, plan_d)
                break
            if found:
                break
        if not found:
            if not resolved:
                silent.append(f"{knob.name}={fmt(value)} resolves nowhere here")
            continue
        where, ctx, plan_v, plan_d = found
        if f"{knob.name}={fmt(value)}" in SAME:
            continue
        if built(plan_v, ctx, config, where == "cpu") == built(plan_d, ctx, config, where == "cpu"):
            silent.append(f"{knob.name}={fmt(value)} ({where}, {ctx.device} x{ctx.world_size})")
        elif where != "cpu":
            plan_only.append(f"{knob.name}={fmt(value)}: {ctx.device} x{ctx.world_size}")
    return silent, plan_only


@pytest.mark.parametrize("name", sorted(k.name for k in all_knobs()))
def test_every_value_away_from_the_default_changes_what_a_trial_builds(name):
    silent, plan_only = silent_values(REGISTRY[name])
    assert not silent, f"silent: {silent}"
    print(f"compared on the plan only (cannot run on this CPU): {plan_only}")


def test_a_knob_that_changes_nothing_fails_the_check():
    """optimizer_impl as it was first written: a domain, a default, an apply into plan.knobs, and nothing reads it."""
    class Silent(Knob):
        """Written by the guide, read by nothing."""
        name = "silent_optimizer_impl"
        default = "foreach"
        choices = ("foreach", "fused")

        def apply(self, plan, value, cfg, ctx):
            plan.knobs[self.name] = value

    register(Silent)
    try:
        silent, _ = silent_values(REGISTRY["silent_optimizer_impl"])
        assert silent == ["silent_optimizer_impl=fused (cpu, cpu x1)"]
        assert plugins.contract_problem(REGISTRY["silent_optimizer_impl"]).startswith("changes nothing: no value of "
                                                                                       "foreach|fused")
    finally:
        del REGISTRY["silent_optimizer_impl"]


SILENT_PLUGIN = '''
from trainscout.spaces import Knob, register

@register
class Quiet(Knob):
    """Sets a value nothing reads."""
    name = "quiet_knob"
    default = "off"
    choices = ("off", "on")

    def apply(self, plan, value, cfg, ctx):
        plan.knobs[self.name] = value
'''


def test_plugin_loading_leaves_out_a_knob_that_changes_nothing_naming_it(tmp_path):
    from test_plugins import fake_dist, with_path
    fake_dist(tmp_path, "ts-quiet", "ts_quiet", SILENT_PLUGIN)
    code = textwrap.dedent("""
        from trainscout.spaces import REGISTRY, all_knobs, plugins
        all_knobs()
        print("quiet_knob" in REGISTRY, "cuda_alloc_conf" in REGISTRY)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=with_path(tmp_path))
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", "False"]
    assert ("trainscout: warning: the knob plugin ts-quiet (entry point ts_quiet = ts_quiet) is left out: ValueError: "
            "knob 'quiet_knob' changes nothing: no value of off|on away from its default off changes what the engines "
            "read of the plan") in res.stderr, res.stderr


def test_the_example_plugins_knobs_change_what_a_trial_builds(example_plugin):
    """examples/knob-plugin installed in a folder of its own (conftest's example_plugin, as tests/test_plugins.py
    uses it): its knobs pass the same check in a process that loads them."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = example_plugin
    from test_plugins import with_path
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, "tests")
        from trainscout.spaces import REGISTRY, all_knobs
        import test_no_silent_knob as t
        all_knobs()
        for name in ("cuda_alloc_conf", "mlp_checkpointing"):
            print(name, t.silent_values(REGISTRY[name]))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=with_path(target), cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in res.stdout.strip().splitlines())
    assert lines["mlp_checkpointing"] == "([], [])"  # its transform wraps each MLP, on this CPU
    assert lines["cuda_alloc_conf"] == "([], [])"  # its environment, in the plan


def test_a_plugin_optimizer_hook_that_raises_is_named():
    """A plugin knob's optimizer hook runs in every engine's optimizer construction; one that raises names it."""
    from trainscout.spaces.roles import Runtime
    from trainscout.trial.engines.base import optimizer_spec

    class Fails(Runtime):
        def optimizer(self, spec, plan):
            raise KeyError("no such optimizer")

    class Broken(Knob):
        """An optimizer hook that fails."""
        name = "broken_optimizer_hook"
        default = "off"
        choices = ("off", "on")
        runtime = Fails()

        def apply(self, plan, value, cfg, ctx):
            plan.knobs[self.name] = value

    register(Broken)
    plugins.ORIGIN["broken_optimizer_hook"] = "ts-broken (entry point b = b)"
    try:
        with pytest.raises(RuntimeError, match=r"the knob plugin ts-broken \(entry point b = b\) failed in the "
                                               r"optimizer hook of broken_optimizer_hook \(KeyError: 'no such "
                                               r"optimizer'\): fix it, uninstall it, or set broken_optimizer_hook=off"):
            optimizer_spec(resolve({}, contexts(TINY.config)[0][1])[1])
    finally:
        del REGISTRY["broken_optimizer_hook"], plugins.ORIGIN["broken_optimizer_hook"]
