"""Measured as labelled: a config.json's torch_dtype does not decide what trains (the precision knob does), and the
dtypes a trial's optimizer really steps are read from it and checked against the label (predictor.dtypes)."""
import json

import pytest
import torch

from trainscout.spaces import Context, resolve
from trainscout.predictor import dtypes
from trainscout.trial import engines
from trainscout.trial.models import build_model, resolve_model

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
         "max_position_embeddings": 256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
RECIPE = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.01, "grad_clip": 1.0, "seq_len": 32}
FP32 = {"weights": "float32", "gradients": "float32", "optimizer": "float32"}


@pytest.fixture
def hub_config(tmp_path):
    """A tiny Llama config.json as the Hub publishes them: with "torch_dtype": "bfloat16"."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    return str(path)


def step(engine, vocab=512):
    batch = torch.randint(0, vocab, (2, RECIPE["seq_len"]), generator=torch.Generator().manual_seed(0))
    engine.micro_step(batch, is_last=True, scale=1.0)
    engine.optimizer_step()


def plan_of(config, precision="bf16-mixed"):
    ctx = Context(world_size=1, device="cpu", num_layers=2, global_batch=2, model_config=config)
    return resolve({"precision": precision, "micro_batch_size": 2}, ctx)[1]


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
def test_a_hub_config_json_trains_fp32_master_weights_and_says_so(hub_config, precision, capsys, monkeypatch):
    from trainscout.spaces.knobs import precision as knob
    monkeypatch.setattr(knob, "_said", set())  # said once per process: this test's process may have said it
    spec = resolve_model(hub_config)
    plan = plan_of(spec.config, precision)
    assert plan.master_dtype == "float32" and plan.precision == precision
    assert f"asks for bfloat16 weights; precision={precision} keeps float32 master weights" in capsys.readouterr().err
    model = build_model(spec.config, plan.attn_implementation, 32, plan.master_dtype)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    engine = engines.build(plan, model, RECIPE, torch.device("cpu"), 1, 1)
    seen = dtypes.watch(engine.optimizers())
    step(engine)
    assert seen == FP32
    dtypes.check(seen, plan)  # the label's


def test_a_trial_whose_optimizer_steps_other_dtypes_than_its_label_is_no_measurement(hub_config):
    """What every trial did before the precision knob owned the dtypes: the config.json's bf16 weights under a
    bf16-mixed label. The real engine and optimizer step them, and the check names what ran."""
    spec = resolve_model(hub_config)
    plan = plan_of(spec.config)
    model = build_model(spec.config, plan.attn_implementation, 32, "bfloat16")
    engine = engines.build(plan, model, RECIPE, torch.device("cpu"), 1, 1)
    seen = dtypes.watch(engine.optimizers())
    step(engine)
    assert seen == {"weights": "bfloat16", "gradients": "bfloat16", "optimizer": "bfloat16"}
    with pytest.raises(dtypes.DtypeMismatch, match="precision=bf16-mixed trains float32 weights.*weights in bfloat16"):
        dtypes.check(seen, plan)


def test_the_watch_reads_the_first_step_that_stepped_and_then_lets_go():
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1)
    seen = dtypes.watch([opt])
    assert seen == {}  # nothing stepped yet: nothing to check
    dtypes.check(seen, plan_of(resolve_model("tiny").config))
    p.grad = torch.ones(4)
    opt.step()
    assert seen == FP32
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks  # removed after the first


def test_a_stored_record_of_a_config_asking_16_bit_weights_from_before_the_fix_is_never_served():
    """Records measured before 2026-12-06 of a config.json with torch_dtype trained its 16-bit weights under a mixed
    label (their plans have no master_dtype): such a record has no key it could be served under; one measured since
    has, and its key names the master dtype."""
    from trainscout.store.schema import measurement_key, record_key
    from trainscout.trial import prepare
    from trainscout.trial.models import ModelSpec
    hw = {"device": "cpu", "cpu": "x", "cpu_count": 2}
    tiny = resolve_model("tiny").recipe
    spec = prepare(ModelSpec("m", dict(LLAMA), tiny), {}, device="cpu", hw=hw)
    rec = {"model": "m", "config": spec.config, "status": "ok", "model_config": spec.model_config, "device": "cpu",
           "world_size": 1, "plan": spec.plan.to_dict(), "recipe": spec.recipe, "hardware": hw, "versions": {}}
    assert record_key(rec) == measurement_key(spec, hw, {})  # measured since: served under its key
    before = dict(rec, plan={k: v for k, v in rec["plan"].items() if k != "master_dtype"})
    with pytest.raises(ValueError, match="never served"):
        record_key(before)
    without = prepare(ModelSpec("m", {k: v for k, v in LLAMA.items() if k != "torch_dtype"}, tiny), {}, device="cpu",
                      hw=hw)
    assert measurement_key(spec, hw, {}) != measurement_key(without, hw, {})


FIXED = ["--set", "compile=false", "--set", "loss_kernel=eager", "--set", "tf32=true", "--set", "attention=sdpa",
         "--set", "sdpa_backend=math", "--set", "precision=bf16-mixed", "--set", "fsdp=off",
         "--set", "micro_batch_size=2", "--set", "activation_checkpointing=none", "--set", "offload_optimizer=false"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero", [0, 2])  # plain PyTorch; DeepSpeed ZeRO-2 (its bf16 module, fp32 partitions)
def test_a_hub_config_json_searched_exported_and_trained_under_bf16_mixed_writes_fp32(
        hub_config, tmp_path, capsys, ray_local, zero):
    """The bar: a tiny Llama config.json with "torch_dtype": "bfloat16", searched, exported and trained under
    precision=bf16-mixed, writes a float32 checkpoint, and its record's dtypes say float32 three times."""
    from safetensors import safe_open

    from trainscout.cli.main import main
    from trainscout.store import Store, default_url
    out, exp, ckpt = tmp_path / "s", tmp_path / "exp", tmp_path / "ckpt"
    assert main(["search", "--model", hub_config, "--device", "cpu", "--trials", "1", "--steps", "1", "--warmup", "1",
                 "--global-batch", "4", "--seq-len", "32", "--out", str(out), "--set", f"zero_stage={zero}",
                 *FIXED]) == 0
    (rec,) = [m for m in Store(default_url(str(out))).measurements() if m.ok]
    assert rec.config["precision"] == "bf16-mixed" and rec.plan.master_dtype == "float32"
    assert rec.m["dtypes"] == FP32
    assert main(["export", str(out), "--best", "--format", "all", "--out", str(exp)]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(exp), "--steps", "2", "--out", str(ckpt), "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["metrics"]["dtypes"] == FP32 and r["saved_dtype"] == "float32"
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "float32"
    if zero:  # a cast on save, when asked, says so in the checkpoint's config.json
        half = tmp_path / "half"
        assert main(["train", "--config", str(exp), "--steps", "1", "--out", str(half), "--save-dtype", "bfloat16",
                     "--json"]) == 0
        with safe_open(str(half / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("key, value", [("torch_dtype", "float8"), ("torch_dtype", "int8"), ("torch_dtype", 16),
                                        ("torch_dtype", "garbage"), ("torch_dtype", "torch.bfloat16"),
                                        ("dtype", ["bfloat16"])])
def test_an_odd_torch_dtype_is_refused_naming_the_field_and_the_dtypes(tmp_path, capsys, key, value):
    """transformers' own errors ("module 'torch' has no attribute 'float8'", "'int' object has no attribute
    'is_floating_point'") named no field: the one line names the file, the key and what it may say."""
    from trainscout.cli.main import main
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, **{key: value})))
    assert main(["estimate", "--model", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{path}: {key}={json.dumps(value)} is not allowed" in err
    assert 'give one of "bfloat16", "float16", "float32", "float64", or leave it out' in err


@pytest.mark.parametrize("value", ["bfloat16", "float16", "float64", None])
def test_the_dtypes_transformers_builds_in_are_read(tmp_path, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, torch_dtype=value)))
    assert resolve_model(str(path)).config["hidden_size"] == 64
