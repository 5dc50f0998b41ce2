import json

import pytest

from trainscout.spaces import ConfigError
from trainscout.trial import metrics
from trainscout.trial.models import PYTHIA, build_model, resolve_model, with_overrides


def test_pythia_sizes_match_their_names():
    """The configs in code build models whose parameter counts match the published names."""
    expected = {"pythia-70m": 70e6, "pythia-160m": 162e6, "pythia-410m": 405e6, "pythia-1b": 1.01e9}
    from transformers import AutoConfig
    for name, n in expected.items():
        cfg = AutoConfig.for_model(**resolve_model(name).config)
        d, L = cfg.hidden_size, cfg.num_hidden_layers
        params = 2 * cfg.vocab_size * d + L * (12 * d * d + 13 * d) + 2 * d  # GPT-NeoX with biases, untied
        assert abs(params - n) / n < 0.03, (name, params)
    assert len(PYTHIA) == 10


def test_pythia_recipe():
    r = resolve_model("pythia-1b").recipe
    assert (r.global_batch, r.seq_len, r.total_steps, r.betas) == (1024, 2048, 143_000, (0.9, 0.95))


def test_config_json_model(tmp_path):
    spec = resolve_model("tiny")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec.config))
    m = resolve_model(str(path))
    assert m.num_layers == spec.num_layers and m.name == tmp_path.name
    model = build_model(m.config, "sdpa", 64)
    assert sum(p.numel() for p in model.parameters()) == 165_632


@pytest.mark.parametrize("content, fix", [
    ("{not json", "give a readable config.json"),
    ('{"hidden_size": 8}', 'no "model_type"'),
    ('{"model_type": "no-such-arch"}', "not known to transformers"),
    ('{"model_type": "resnet"}', "not a causal language model"),
    ("[1, 2]", 'no "model_type"'),
])
def test_bad_config_files(tmp_path, content, fix):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fix) as e:
        resolve_model(str(path))
    assert e.value.field == "--model" and "\n" not in str(e.value)


def test_unknown_model_name():
    with pytest.raises(ConfigError, match="unknown model 'gpt-5'"):
        resolve_model("gpt-5")


def test_recipe_overrides():
    r = resolve_model("pythia-160m").recipe
    assert with_overrides(r, total_tokens=10 * 1024 * 2048 + 1).total_steps == 11
    assert with_overrides(r, global_batch=64, seq_len=1024).global_batch == 64
    with pytest.raises(ConfigError, match="--train-tokens"):
        with_overrides(r, total_steps=5, total_tokens=5)
    with pytest.raises(ConfigError, match="--global-batch"):
        with_overrides(r, global_batch=0)


def test_flops_and_mfu_formula():
    # pythia-1b on the yardstick: 6N + 12 L d s
    fpt = metrics.flops_per_token(1_011_781_632, 16, 2048, 2048)
    assert fpt == 6 * 1_011_781_632 + 12 * 16 * 2048 * 2048
    assert metrics.gpu_peak_tflops("NVIDIA H200") == 989.0
    assert metrics.gpu_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert metrics.gpu_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert metrics.gpu_peak_tflops("Mystery GPU") is None
    assert metrics.mfu(69_690, fpt, 989.0, 1) == pytest.approx(0.485, abs=0.002)  # the yardstick's row
    assert metrics.mfu(1000, fpt, None, 1) is None


def test_projection_counts_every_micro_batch():
    # 8 micro-batches of which 2 measured: 7 accumulating ones, the synchronising last one, the optimizer
    assert metrics.project_step([1.0], [1.5], [0.25], 8) == pytest.approx(7 * 1.0 + 1.5 + 0.25)
    assert metrics.project_step([], [2.0], [0.5], 1) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        metrics.project_step([], [2.0], [0.5], 4)
