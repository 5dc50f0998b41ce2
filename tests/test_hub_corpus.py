"""Real Hub config.json files (bench/models/hub, as their model cards publish them) through trainscout, on the CPU:
each is read (or refused with one line naming why), estimated at its real shape at micro-batch 1, its FLOPs/token
counted at the real shape, and a shrunk copy of the same architecture counts what FlopCounterMode counts and trains
one bf16-mixed optimizer step with float32 weights, gradients and AdamW states (bench/hub_corpus.py)."""
import json
import math
import os

import pytest

from trainscout.spaces import ConfigError
from trainscout.predictor import flops
from trainscout.trial.models import resolve_model
import bench_script  # tests/bench_script.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
hub = bench_script.load("hub_corpus")

FILES = {os.path.splitext(os.path.basename(p))[0]: p for p in hub.files()}
# what trainscout refuses, and the words of its reason
REFUSED = {"gemma-3-4b-pt-text": "num_attention_heads not given"}
# every parameter once at the real shape, in billions, as the model cards state them (tie flags, experts, MLA)
PARAMS_B = {
    "deepseek-v2-lite": 15.7, "gemma-2-2b": 2.61, "gemma-3-1b-pt": 1.00, "granite-3.1-2b-base": 2.53,
    "llama-3.1-8b": 8.03, "llama-3.2-1b": 1.24, "llama-3.2-3b": 3.21, "mistral-7b-v0.3": 7.25,
    "mixtral-8x7b-v0.1": 46.7, "olmo-2-0425-1b": 1.48, "olmo-2-1124-7b": 7.30, "olmoe-1b-7b-0924": 6.92,
    "phi-3.5-mini-instruct": 3.82, "phi-4-mini-instruct": 3.84, "pythia-1b": 1.01, "qwen2.5-0.5b": 0.494,
    "qwen2.5-1.5b": 1.54, "qwen2.5-7b": 7.62, "qwen3-1.7b": 1.72, "qwen3-30b-a3b": 30.5, "qwen3-8b": 8.19,
    "smollm2-1.7b": 1.71,
}


def test_the_corpus_has_at_least_20_files_each_as_published():
    assert len(FILES) >= 20 and set(FILES) == set(PARAMS_B) | set(REFUSED)
    for name, path in FILES.items():
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        assert cfg.get("model_type"), name
        if name not in REFUSED:  # a whole config.json, not a fragment
            assert cfg.get("architectures") and (cfg.get("torch_dtype") or cfg.get("dtype")), name


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_hub_config_reads_estimates_counts_and_trains_bf16_mixed_in_fp32(name):
    path = FILES[name]
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    if name in REFUSED:  # 1: refused, in one line that says why
        with pytest.raises(ConfigError) as e:
            resolve_model(path)
        assert REFUSED[name] in str(e.value) and "\n" not in str(e.value)
        return
    spec = resolve_model(path)  # 1: read
    assert spec.config["model_type"] == raw["model_type"]
    c = flops.count(spec.config)
    assert c.total_params / 1e9 == pytest.approx(PARAMS_B[name], rel=0.02), c.total_params
    gib = hub.estimate_gib(path)  # 2: what `trainscout estimate --set micro_batch_size=1` predicts
    assert math.isfinite(gib) and c.total_params * 16 / 2 ** 30 < gib < 2000, gib  # weights, grads, AdamW at least
    seq = spec.recipe.seq_len
    per_token = c.per_token(seq)  # 3: the real shape's count, then a shrunk copy against FlopCounterMode
    assert 6 * c.active_params < per_token < 6 * c.active_params + 12 * max(c.attention_width) * len(
        c.attention_width) * seq + 1, per_token
    small = hub.shrink(raw)
    ours, theirs, ratio = hub.flop_counter_ratio(small)
    assert ratio == pytest.approx(1.0, abs=0.05), (ours, theirs)
    dtypes = hub.one_step_dtypes(small)  # 4: one bf16-mixed step keeps every tensor float32
    assert dtypes == {"params": {"float32"}, "grads": {"float32"}, "adamw": {"float32"}, "loss_finite": {"True"}}


def test_the_shrunk_copy_keeps_the_architecture_flags():
    """Same model_type, tie, window, experts and top-k, rope scaling, MLA ranks; small sizes."""
    for name in ("qwen3-30b-a3b", "deepseek-v2-lite", "phi-4-mini-instruct", "gemma-3-1b-pt", "mixtral-8x7b-v0.1"):
        with open(FILES[name], encoding="utf-8") as f:
            raw = json.load(f)
        small = hub.shrink(raw)
        for k in ("model_type", "tie_word_embeddings", "num_experts", "num_local_experts", "n_routed_experts",
                  "num_experts_per_tok", "first_k_dense_replace", "partial_rotary_factor"):
            assert small.get(k) == raw.get(k), (name, k)
        assert (small.get("sliding_window") is None) == (raw.get("sliding_window") is None)
        assert (small.get("rope_scaling") or {}).get("type") == (raw.get("rope_scaling") or {}).get("type")
        assert small["hidden_size"] == 64 and small["num_hidden_layers"] == 2 and small["vocab_size"] == 256
