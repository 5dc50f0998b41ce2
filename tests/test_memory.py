"""The memory model: its terms move the way the engines hold memory, its calibration recovers a known linear
relation, and `trainscout estimate` answers without a GPU (exit 1 when it does not fit, 2 on bad input)."""
import json

import pytest

from trainscout.cli.main import main
from trainscout.predictor import memory
from trainscout.trial import prepare

HW = {"device": "cuda", "gpu_count": 8, "gpu": "NVIDIA H200"}


def spec(settings, workers=1, model="pythia-410m"):
    return prepare(model, settings, workers=workers, hw=dict(HW, gpu_count=workers))


def states(c):
    return c["weights"] + c["gradients"] + c["optimizer"] + c["buffers"]


def test_terms_follow_the_engines():
    mb = {"micro_batch_size": 4}
    plain, z1, z3 = (memory.components(spec(dict(mb, **s), workers=4))
                     for s in ({}, {"zero_stage": 1}, {"zero_stage": 3}))
    assert states(z3) < states(z1) < states(plain)
    off = memory.components(spec(dict(mb, zero_stage=2, offload_optimizer=True), workers=4))
    assert off["optimizer"] == 0 and states(off) < states(z1)
    fsdp4 = memory.components(spec(dict(mb, fsdp="full_shard"), workers=4))
    fsdp1 = memory.components(spec(dict(mb, fsdp="full_shard")))
    assert states(fsdp4) < states(fsdp1)
    none, full, every2 = (memory.components(spec(dict(mb, activation_checkpointing=a)))
                          for a in ("none", "full", 2))
    assert full["activations"] < every2["activations"] < none["activations"]
    big = memory.components(spec({"micro_batch_size": 8}))
    assert big["activations"] == pytest.approx(2 * none["activations"]) and big["logits"] == 2 * none["logits"]
    fused = memory.components(spec({"micro_batch_size": 4, "loss_kernel": "compiled"}))  # no fp32 copy of the logits
    assert fused["logits"] == pytest.approx(none["logits"] / 3) and fused["activations"] == none["activations"]
    pp = {"micro_batch_size": 4, "pipeline_stages": 2, "pipeline_microbatches": 8}
    gpipe = memory.components(spec(dict(pp, pipeline_schedule="gpipe"), workers=2))
    one_f1b = memory.components(spec(dict(pp, pipeline_schedule="1f1b"), workers=2))
    assert one_f1b["activations"] < gpipe["activations"] and states(one_f1b) < states(plain) * 1.01


def test_calibration_recovers_a_linear_relation():
    settings = [{"micro_batch_size": m, "zero_stage": z, "activation_checkpointing": a}
                for m in (2, 4, 8) for z in (0, 1) for a in ("none", "full")]
    specs = [spec(s, workers=2) for s in settings]
    truth = {"a": 1.1, "b": 0.8, "c": 2.0 * memory.GiB}
    pairs = [(sp, memory.predict(sp, truth)) for sp in specs]
    fit = memory.fit(pairs)
    assert fit["a"] == pytest.approx(1.1, rel=1e-3) and fit["b"] == pytest.approx(0.8, rel=1e-3)
    assert fit["c"] == pytest.approx(truth["c"], rel=1e-3) and fit["n"] == len(pairs)
    assert memory.fit(pairs[:2]) is None  # too few: the analytic sum is used


def test_estimate_cli(capsys):
    assert main(["estimate", "--model", "pythia-1b", "--set", "micro_batch_size=8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["predicted_gib"] > sum(r["components_gib"].values())  # + the workspace allowance
    assert main(["estimate", "--model", "pythia-1b", "--set", "micro_batch_size=128", "--gpu-memory", "80GiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["estimate", "--model", "pythia-160m", "--gpu-memory", "80GiB"]) == 0
    for bad, field in ((["--gpu-memory", "lots"], "--gpu-memory"), (["--set", "zero_stage=4"], "zero_stage"),
                       (["--set", "pipeline_stages=2"], "pipeline_stages")):
        assert main(["estimate", "--model", "pythia-160m", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert field in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * 2**30), ("141GB", 141e9), ("512 MiB", 512 * 2**20)])
def test_sizes(text, expected):
    assert memory.parse_size(text) == expected


def test_host_memory_is_predicted_and_refuses_what_the_host_cannot_hold():
    """The host term (issue 18): ZeRO offload keeps the optimizer on the host, a CPU trial keeps everything there.
    The Pythia-6.9B ZeRO-2 + optimizer offload trial that was killed for host memory on the H200 box (125 GB) is
    refused before launch; the same model without offload, and a tiny CPU trial, are not."""
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    hw = {"device": "cuda", "gpu_count": 1, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.7, "capability": "9.0"}
    offload = prepare("pythia-6.9b", {"zero_stage": 2, "offload_optimizer": True, "micro_batch_size": 8,
                                      "activation_checkpointing": "full"}, workers=1, hw=hw)
    plain = prepare("pythia-6.9b", {"activation_checkpointing": "full", "micro_batch_size": 4}, workers=1, hw=hw)
    comp = memory.host_peak(offload)
    assert comp["offload"] > comp["build"] > 0 and "offload" not in memory.host_peak(plain)
    why = memory.host_refusal(offload, 125e9)
    assert why and "host memory" in why and "offload" in why
    assert memory.host_refusal(plain, 125e9) is None
    cpu_big = prepare("pythia-14m", {"micro_batch_size": 128}, device="cpu", workers=2)  # the Pythia recipe on a CPU
    assert memory.host_refusal(cpu_big, 24e9)
    assert memory.host_refusal(prepare("tiny", {}, device="cpu", workers=2), 24e9) is None


# Tiny configs of the three shapes the memory model must count from the module tree: a Pythia (GPT-NeoX: fused
# QKV, 2 MLP matrices, untied), a Llama (GQA: fewer key/value heads; SwiGLU: 3 MLP matrices) and a tied Llama
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
              "tie_word_embeddings": False}
TIED_LLAMA = dict(TINY_LLAMA, tie_word_embeddings=True, num_key_value_heads=1)


def _built(config):
    from trainscout.trial.models import build_model
    return build_model(config, "sdpa", 64)


@pytest.mark.parametrize("config", ["pythia-14m", TINY_LLAMA, TIED_LLAMA], ids=["pythia", "llama-gqa", "llama-tied"])
def test_parameter_counts_are_the_built_models(config):
    """counts reads N, a layer's, the embedding's and the linears' parameters and the tying from the modules of
    the model the config builds (on the meta device), not from a formula: the GPT-NeoX formula missed GQA, SwiGLU's
    third matrix and a tied vocabulary (Llama-3.2-1B shape: -28 % peak memory against the measurement)."""
    from torch import nn

    from trainscout.runtime import decoder_layers
    from trainscout.trial.models import resolve_model
    if isinstance(config, str):
        config = resolve_model(config).config
    model = _built(config)
    c = memory.counts(config)
    assert c["N"] == sum(p.numel() for p in model.parameters())
    assert c["per_layer"] == sum(p.numel() for p in decoder_layers(model)[0].parameters())
    assert c["embed"] == model.get_input_embeddings().weight.numel() and c["L"] == len(decoder_layers(model))
    assert c["tied"] == (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert c["tied"] == config.get("tie_word_embeddings", False)
    linears = {id(p): p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters()}
    assert c["cast"] == sum(linears.values())


def _saved_by_a_forward(model, b, s):
    """Bytes of the distinct storages a real CPU forward saves for backward, parameters left out (no cache, as a
    trial runs the model)."""
    import torch
    model.config.use_cache = False
    params = {p.untyped_storage()._cdata for p in (*model.parameters(), *model.buffers())}
    seen = {}

    def pack(t):
        if t.untyped_storage()._cdata not in params:
            seen.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
        return t
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.zeros(b, s, dtype=torch.long))
    return sum(seen.values())


@pytest.mark.parametrize("config", ["tiny", TINY_LLAMA], ids=["pythia", "llama-gqa"])
@pytest.mark.parametrize("compute", ["16-bit", "fp32"])
def test_saved_activations_match_a_real_forward(config, compute):
    """The activation term is what autograd saves, measured on the meta device and scaled to b·s: with eager
    attention (plain ops: nothing is emulated) it equals what a real CPU forward of the same tiny model saves at
    another micro-batch and sequence length, to 0.5 %, s x s scores included."""
    from trainscout.predictor import model_tree
    from trainscout.trial.models import build_model, resolve_model
    if isinstance(config, str):
        config = resolve_model(config).config
    model = build_model(config, "eager", 128)
    if compute == "16-bit":
        model.bfloat16()
    b, s = 3, 80
    saved = model_tree.saved(config, "eager", compute)
    assert saved.measured and saved.per_layer_s > 0  # eager attention keeps its scores
    predicted = model.config.num_hidden_layers * saved.layer_bytes(b, s) + saved.outside * b * s
    assert predicted == pytest.approx(_saved_by_a_forward(model, b, s), rel=0.005)


@pytest.mark.parametrize("config", ["tiny", TINY_LLAMA], ids=["pythia", "llama-gqa"])
def test_saved_activations_under_autocast_and_sdpa(config):
    """With SDPA and autocast the meta device stands in for the GPU's kernels and casts (checked on an H200 by
    bench/data/gpu-2026-12-01-mem/); a CPU forward under CPU autocast with CPU SDPA saves the same to 1 % (0.3 % seen),
    past autocast's 16-bit weight copies. The knob attention matters: eager attention saves the s x s scores (the
    fp32 softmax output and its 16-bit copy: 6 bytes per head and position), SDPA's fused kernels none."""
    import torch

    from trainscout.predictor import model_tree
    from trainscout.trial.models import build_model, resolve_model
    if isinstance(config, str):
        config = resolve_model(config).config
    sdpa, eager = model_tree.saved(config, "sdpa", "autocast"), model_tree.saved(config, "eager", "autocast")
    assert sdpa.per_layer_s == 0 and eager.per_layer_s == pytest.approx(6 * config["num_attention_heads"])
    assert sdpa.layer_input == 4 * config["hidden_size"]  # the fp32 residual stream under autocast
    model, (b, s) = build_model(config, "sdpa", 128), (3, 80)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = _saved_by_a_forward(model, b, s)
    casts = 2 * memory.counts(config)["cast"]  # autocast's bf16 weight copies, saved by the linears
    predicted = config["num_hidden_layers"] * sdpa.layer_bytes(b, s) + sdpa.outside * b * s
    assert predicted == pytest.approx(real - casts, rel=0.01)


def test_a_failed_meta_forward_falls_back_to_the_formula_and_says_so(monkeypatch, capsys):
    """An architecture whose forward cannot run on the meta device (a .item() on data, say) gets the GPT-NeoX
    formula's 34·h bytes per layer, with measured=False and the reason, and one warning on stderr."""
    from trainscout.predictor import model_tree

    def fails(*a, **k):
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")
    monkeypatch.setattr(model_tree, "count_saved", fails)
    config = dict(TINY_LLAMA, hidden_size=96)  # a config no other test measured (the results are cached)
    got = model_tree.saved(config, "sdpa", "autocast")
    assert not got.measured and "Tensor.item()" in got.why and got.per_layer == 34 * 96
    assert "GPT-NeoX formula" in capsys.readouterr().err
    model_tree.saved(config, "sdpa", "autocast")
    assert capsys.readouterr().err == ""


def test_compiled_layers_save_what_the_partitioner_leaves():
    """torch.compile's partitioner recomputes cheap ops in backward: a compiled Llama layer saves less than an eager
    one (on an H200: 24·h bytes per token less for the Llama-1B shape, which the trace finds). Every layer counts as
    compiled: the model runs without a cache, as in a trial (test_per_layer_compile_compiles_every_layer)."""
    from trainscout.predictor import model_tree
    eager = model_tree.saved(TINY_LLAMA, "sdpa", "autocast")
    layers, whole = (model_tree.saved(TINY_LLAMA, "sdpa", "autocast", scope) for scope in ("layers", "model"))
    assert layers.per_layer == whole.per_layer < 0.8 * eager.per_layer and layers.why == whole.why == ""


def test_per_layer_compile_compiles_every_layer():
    """compile_scope=layers as a trial applies it (use_cache=False, the knob's transform): the 3 layers of a
    Llama-shaped model share one graph, so none falls back to eager. With a cache, dynamo would guard on each
    layer's index and stop compiling at its recompile limit (8)."""
    import torch
    from torch._dynamo.utils import counters

    from trainscout.spaces import get
    from trainscout.trial.models import build_model
    torch._dynamo.reset()
    counters.clear()
    config = dict(TINY_LLAMA, num_hidden_layers=3)
    model = build_model(config, "sdpa", 32)
    model.config.use_cache = False  # as trial/worker.py and runtime/hf.py set it
    model.train()

    class Plan:
        compile, compile_scope = True, "layers"
    get("compile_scope").runtime.transform(model, Plan())
    x = torch.randint(0, config["vocab_size"], (2, 32))
    model(input_ids=x, labels=x).loss.backward()
    assert counters["stats"]["unique_graphs"] == 1 and counters["stats"]["calls_captured"] > 0
    torch._dynamo.reset()

def test_meta_facts_handed_to_another_process_need_no_model_built(monkeypatch):
    """model_tree.known/learn (a search's driver to its trial actors): the facts worked out in one process answer
    parameters, saved and the FLOP count in another without building the model; what a process worked out itself
    is not replaced."""
    from trainscout.predictor import flops, model_tree
    from trainscout.trial.models import resolve_model
    config = resolve_model("tiny").config
    facts = (model_tree.parameters(config), model_tree.saved(config, "sdpa", "autocast"), flops.count(config))
    handed = model_tree.known()
    assert {at[0] for at in handed} >= {"parameters", "saved", "count"}
    monkeypatch.setattr(model_tree, "FACTS", {})  # a fresh process
    monkeypatch.setattr(model_tree, "meta_model", lambda *a, **k: pytest.fail("the model was built again"))
    model_tree.learn(handed)
    assert (model_tree.parameters(config), model_tree.saved(config, "sdpa", "autocast"), flops.count(config)) == facts
    mine = dict(model_tree.FACTS)
    model_tree.learn({at: None for at in handed})  # another's facts never replace this process's
    assert model_tree.FACTS == mine


def test_the_ranks_cache_environment_does_not_change_when_inductor_sets_its_own(monkeypatch):
    """trial.runner.worker_env: inductor sets TORCHINDUCTOR_CACHE_DIR in a process the first time it compiles
    (the memory model's trace of a compiled layer does); the ranks' environment, which keys their warm groups,
    stays what the user set."""
    from trainscout.trial import runner
    spec = prepare("tiny", {}, workers=1, device="cpu")
    before = runner.worker_env(spec)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_somebody")
    assert runner.worker_env(spec) == before
