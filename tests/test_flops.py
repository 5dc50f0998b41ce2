"""FLOPs per token from the model's modules (predictor/flops.py) against torch's own FlopCounterMode, and the recount of
records stored under the dense count."""
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainscout.store import Store
from trainscout.predictor import flops
from trainscout.trial import metrics
from trainscout.trial.records import Record

S = 64
BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=512, max_position_embeddings=256)
MODELS = {  # tiny real models of each kind the count must get right
    "untied": dict(BASE, model_type="gpt_neox", intermediate_size=256, rotary_pct=0.25, tie_word_embeddings=False),
    "tied_gqa": dict(BASE, model_type="llama", num_key_value_heads=2, intermediate_size=172, tie_word_embeddings=True),
    "moe": dict(BASE, model_type="qwen3_moe", num_key_value_heads=2, head_dim=32, intermediate_size=128,
                moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
    "moe_shared": dict(BASE, model_type="qwen2_moe", num_key_value_heads=2, intermediate_size=96,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                       num_experts_per_tok=2),
    "sliding_window": dict(BASE, model_type="mistral", num_key_value_heads=2, intermediate_size=172, sliding_window=16,
                           tie_word_embeddings=False),
}


def counted_by_torch(config: dict) -> float:
    """FLOPs per token FlopCounterMode counts over a real forward + backward (CPU). Eager attention and experts:
    it has no formula for the CPU SDPA kernel nor for transformers' grouped-experts fallback (it would miss them)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    kw = {"experts_implementation": "eager"} if "num_experts" in config else {}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), attn_implementation="eager", **kw)
    model.config.use_cache = False
    ids = torch.randint(0, config["vocab_size"], (2, S))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / ids.numel()


@pytest.mark.parametrize("kind", MODELS)
def test_flops_per_token_agree_with_flop_counter_mode(kind):
    config = MODELS[kind]
    ours, theirs = flops.count(config).per_token(S), counted_by_torch(config)
    assert ours == pytest.approx(theirs, rel=0.05), (kind, ours, theirs)
    dense = metrics.dense_flops_per_token(flops.count(config).total_params, 2, 64, S)
    if kind in ("untied", "moe"):  # what the dense count got wrong: the embedding lookup, every expert
        assert dense > 1.15 * theirs


def test_moe_counts_its_routed_experts_and_the_head_once():
    moe, c = MODELS["moe"], flops.count(MODELS["moe"])
    experts = 8 * (2 * 48 * 64 + 64 * 48)  # per layer, all of them: gate_up and down
    assert c.total_params - c.active_params > 2 * experts * (1 - 2 / 8) * 0.99  # 6 of 8 experts idle per token
    tied = flops.count(MODELS["tied_gqa"])
    assert tied.outside == 512 * 64  # the head, once; its tied embedding is a lookup
    assert moe["num_experts_per_tok"] / moe["num_experts"] == 0.25


def counted_with_checkpointing(config: dict, every: int) -> float:
    """FlopCounterMode's FLOPs per token over a real forward + backward (CPU) with the decoder layers wrapped as the
    activation_checkpointing knob wraps them (torch's non-reentrant checkpoint, every n-th layer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainscout.spaces import Plan, get
    torch.manual_seed(0)
    kw = {"experts_implementation": "eager"} if "num_experts" in config else {}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), attn_implementation="eager", **kw)
    model.config.use_cache = False
    model = get("activation_checkpointing").runtime.transform(model, Plan(checkpoint_every=every))
    assert type(model.model.layers[0] if hasattr(model, "model") else model.gpt_neox.layers[0]).__name__ == \
        "CheckpointWrapper"
    ids = torch.randint(0, config["vocab_size"], (2, S))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / ids.numel()


@pytest.mark.parametrize("kind", ["untied", "tied_gqa", "moe"])
def test_hfu_counts_what_checkpointing_really_recomputes(kind):
    """torch's non-reentrant checkpoint stops its recompute once the backward's tensors are back: a dense layer's
    MLP down projection is not run again (counted as a whole forward, HFU was 6.3 % high on the untied NeoX, 4.4 % on
    the Llama shape); a MoE layer's experts are recomputed whole. The recomputed FLOPs match FlopCounterMode's under
    the knob's own wrapping, full and every 2nd layer; the model FLOPs (MFU) do not change."""
    config, c = MODELS[kind], flops.count(MODELS[kind])
    base = counted_by_torch(config)
    for every in (1, 2):
        theirs = counted_with_checkpointing(config, every)
        ours = c.hardware_per_token(S, every)
        layers = range(0, len(c.layer_weights), every)
        whole = c.per_token(S) + sum(c.layer_forward(i, S) for i in layers)
        if kind == "moe":  # its experts counted at their routed share, torch's at the batch's routing: within 5 %
            assert ours == pytest.approx(theirs, rel=0.05) and ours == pytest.approx(whole), (every, ours, theirs)
            continue
        assert ours - c.per_token(S) == pytest.approx(theirs - base, rel=1e-6), (every, ours, theirs)  # recomputed
        assert ours == pytest.approx(theirs, rel=1e-6) and whole > (1.04 if every == 1 else 1.0) * ours, \
            (every, ours, whole, theirs)
    assert c.hardware_per_token(S, 0) == c.per_token(S)
    m = flops.metrics(config, S, 1e5, 989.0, 1, checkpoint_every=1)
    assert m["hfu"] > m["mfu"] > 0 and m["flops_convention"] == flops.CONVENTION
    assert m["flops_per_token"] == c.per_token(S)


def test_a_record_stored_under_the_dense_count_is_recounted_on_read(tmp_path):
    config = MODELS["moe"]
    dense = metrics.dense_flops_per_token(flops.count(config).total_params, 2, 64, S)
    old = Record(model="tiny-moe", model_config=config, config={}, status="ok", device="cuda", world_size=1,
                 plan={"checkpoint_every": 0}, recipe={"seq_len": S, "global_batch": 8, "total_steps": 10},
                 metrics={"tokens_per_s": 1e6, "step_s": 1.0, "flops_per_token": dense, "peak_tflops": 989.0,
                          "mfu": 1e6 * dense / 989e12}).to_dict()
    url = f"sqlite:///{tmp_path}/results.db"
    store = Store(url)
    store.put("k1", old)
    got = store.get("k1")
    assert got.m["flops_convention"] == flops.CONVENTION
    assert got.m["flops_per_token"] == pytest.approx(counted_by_torch(config), rel=0.05)
    assert got.m["flops_per_token_dense_v0"] == dense and got.m["mfu_dense_v0"] == old["metrics"]["mfu"]
    assert got.m["mfu"] < 0.6 * got.m["mfu_dense_v0"]
    assert [r.m["mfu"] for r in store.measurements()] == [got.m["mfu"]]
    with store.engine.connect() as c:  # the stored row is as it was written
        row = c.exec_driver_sql("SELECT record FROM trainscout_measurements").scalar()
    assert json.loads(row) == old


def test_a_record_whose_model_cannot_be_built_keeps_its_figures_and_says_why():
    rec = Record(model="gone", model_config={"model_type": "no-such-model"}, config={}, status="ok", world_size=1,
                 recipe={"seq_len": S}, metrics={"tokens_per_s": 10.0, "step_s": 1.0, "mfu": 0.5})
    stub = Record(model="tiny", config={}, status="ok", metrics={"tokens_per_s": 1.0})  # no recipe: as it is
    assert flops.recount(stub) is stub
    got = flops.recount(rec)
    assert got.m["mfu"] == 0.5 and got.m["flops_convention"] == flops.OLD
    assert got.m["flops_note"].startswith("not recounted")


def test_a_mixture_of_experts_is_first_class(tmp_path):
    """The experts kernel is a knob (a dense model refuses it, batched_mm is refused with why), fp8 says that the
    routed experts stay bf16, and the memory model measures MoE layers on the meta device under autocast (the
    grouped kernel's meta function takes bf16 only: it fell back to the GPT-NeoX formula)."""
    from trainscout.spaces import ConfigError
    from trainscout.predictor import model_tree
    from trainscout.trial import prepare
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(MODELS["moe"]))
    assert prepare(str(path), {"experts": "eager"}, device="cpu").plan.knobs == {"experts": "eager"}
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        prepare("tiny", {"experts": "grouped_mm"}, device="cpu")
    with pytest.raises(ConfigError, match="batched_mm copies every token's expert weights"):
        prepare(str(path), {"experts": "batched_mm"}, device="cpu")
    hw = {"device": "cuda", "gpu_count": 1, "gpu": "NVIDIA H200", "capability": "9.0", "gpu_memory_gib": 139.8}
    notes = prepare(str(path), {"fp8": "tensorwise"}, hw=hw).plan.notes
    assert notes and "routed experts' weights stay in bf16" in notes[0]
    assert prepare("pythia-160m", {"fp8": "tensorwise"}, hw=hw).plan.notes == []
    for compute in ("autocast", "16-bit", "fp32"):
        saved = model_tree.saved(MODELS["moe"], "sdpa", compute)
        assert saved.measured, saved.why
    # autocast over fp32 weights saves more than the 16-bit model (its fp32 residual stream and norms; the expert
    # GEMMs themselves take 16-bit copies: the experts knob's transform)
    assert model_tree.saved(MODELS["moe"], "sdpa", "autocast").per_layer > \
        model_tree.saved(MODELS["moe"], "sdpa", "16-bit").per_layer


def test_the_experts_compute_in_the_autocast_dtype():
    """transformers' grouped_mm is not autocast-enabled: over fp32 weights the experts ran in fp32 (on the H200 a 2.6B
    qwen3_moe at a quarter of FSDP2's bf16 speed). After the experts knob's transform the grouped GEMMs take bf16
    under bf16 autocast, eager and with the layers compiled, the gradients reach the fp32 weights, the state dict keeps
    its keys, and without autocast the module is what it was (fp32 products, the same loss to the last bit)."""
    from torch.overrides import TorchFunctionMode

    from trainscout.runtime import prepare_model
    from trainscout.spaces.plan import Plan
    from trainscout.trial.models import build_model
    grouped = {f for f in (getattr(torch.nn.functional, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f}

    class Dtypes(TorchFunctionMode):
        seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in grouped:
                self.seen.append((args[0].dtype, args[1].dtype))
            return func(*args, **(kwargs or {}))

    def model(transformed):
        torch.manual_seed(0)
        m = build_model(MODELS["moe"], "sdpa", S)
        m.set_experts_implementation("grouped_mm")
        return prepare_model(m, Plan(knobs={"experts": "grouped_mm"})) if transformed else m

    x = torch.randint(0, 512, (2, S))
    plain, cast = model(False), model(True)
    assert list(cast.state_dict()) == list(plain.state_dict())
    for m, want in ((plain, torch.float32), (cast, torch.bfloat16)):
        Dtypes.seen = []
        with Dtypes(), torch.autocast("cpu", torch.bfloat16):
            m(input_ids=x, labels=x).loss.backward()
        assert Dtypes.seen and set(Dtypes.seen) == {(want, want)}, Dtypes.seen
        w = m.model.layers[0].mlp.experts.gate_up_proj
        assert w.dtype == torch.float32 and w.grad is not None and w.grad.dtype == torch.float32
    assert torch.allclose(cast.model.layers[0].mlp.experts.gate_up_proj.grad,
                          plain.model.layers[0].mlp.experts.gate_up_proj.grad, rtol=0.1, atol=1e-3)
    assert torch.equal(cast(input_ids=x, labels=x).loss, plain(input_ids=x, labels=x).loss)  # no autocast: as it was
    for layer in cast.model.layers:
        layer.compile()
    with torch.autocast("cpu", torch.bfloat16):
        compiled = cast(input_ids=x, labels=x).loss
    with torch.autocast("cpu", torch.bfloat16):
        eager = model(True)(input_ids=x, labels=x).loss
    assert torch.allclose(compiled, eager, atol=2e-2)
