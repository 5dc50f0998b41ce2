"""Models and recipes, without the hub: the Pythia family as configs in code, or any causal-LM config.json."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace

from trainscout.spaces import ConfigError

# name: (hidden, layers, heads); intermediate = 4 * hidden, vocab 50304, rotary_pct 0.25, parallel residual, untied
PYTHIA = {
    "pythia-14m": (128, 6, 4), "pythia-31m": (256, 6, 8), "pythia-70m": (512, 6, 8),
    "pythia-160m": (768, 12, 12), "pythia-410m": (1024, 24, 16), "pythia-1b": (2048, 16, 8),
    "pythia-1.4b": (2048, 24, 16), "pythia-2.8b": (2560, 32, 32), "pythia-6.9b": (4096, 32, 32),
    "pythia-12b": (5120, 36, 40),
}
TINY = (64, 2, 4)  # a GPT-NeoX small enough for tests on two CPU cores


@dataclass(frozen=True)
class Recipe:
    """What a full training run is: the batch, the sequence length and how long it lasts."""

    global_batch: int = 1024    # sequences per optimizer step
    seq_len: int = 2048         # tokens per sequence (Pythia's 2,049 includes the shifted label)
    total_steps: int = 143_000  # optimizer steps of the whole run
    lr: float = 1e-4
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.01
    grad_clip: float = 1.0      # 0 = no clipping

    @property
    def total_tokens(self) -> int:
        return self.global_batch * self.seq_len * self.total_steps

    def to_dict(self) -> dict:
        return asdict(self)


PYTHIA_RECIPE = Recipe()
TINY_RECIPE = Recipe(global_batch=16, seq_len=64, total_steps=1000)


@dataclass(frozen=True)
class ModelSpec:
    """A model to build from its config: a name, the transformers config as a dict, and its default recipe."""

    name: str
    config: dict
    recipe: Recipe

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])


def _gpt_neox(hidden: int, layers: int, heads: int, vocab: int = 50304, max_pos: int = 2048) -> dict:
    return dict(model_type="gpt_neox", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=max_pos,
                rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)


def model_names() -> list[str]:
    return ["tiny", *PYTHIA]


def resolve_model(name_or_path: str) -> ModelSpec:
    """A Pythia name, "tiny", or the path of a transformers config.json of a causal LM."""
    if name_or_path == "tiny":
        return ModelSpec("tiny", _gpt_neox(*TINY, vocab=512, max_pos=256), TINY_RECIPE)
    if name_or_path in PYTHIA:
        return ModelSpec(name_or_path, _gpt_neox(*PYTHIA[name_or_path]), PYTHIA_RECIPE)
    if not (name_or_path.endswith(".json") or os.sep in name_or_path):
        raise ConfigError("--model", f"unknown model {name_or_path!r}: use one of {', '.join(model_names())} "
                                     "or the path of a config.json")
    try:
        with open(name_or_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("--model", f"cannot read {name_or_path}: {e.__class__.__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''}; give a readable config.json")
    except RecursionError:
        raise ConfigError("--model", f"{name_or_path} nests too deeply: give a transformers config.json")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ConfigError("--model", f"{name_or_path} has no \"model_type\": give a transformers config.json")
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        hf = AutoConfig.for_model(**cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError("--model", f"{name_or_path}: model_type {cfg['model_type']!r} is not known to transformers ({e})")
    if type(hf) not in AutoModelForCausalLM._model_mapping:
        raise ConfigError("--model", f"{name_or_path}: {cfg['model_type']} is not a causal language model")
    for key in ("num_hidden_layers", "hidden_size"):
        if not isinstance(getattr(hf, key, None), int) or getattr(hf, key) < 1:
            raise ConfigError("--model", f"{name_or_path}: {key} must be a positive integer")
    full = hf.to_dict()
    name = os.path.splitext(os.path.basename(name_or_path))[0]
    if name == "config":
        name = os.path.basename(os.path.dirname(os.path.abspath(name_or_path))) or name
    return _from_config(name, full)


def _from_config(name: str, config: dict) -> ModelSpec:
    return ModelSpec(name, config, replace(PYTHIA_RECIPE, seq_len=min(2048, int(config.get("max_position_embeddings") or 2048))))


def stored_model(name: str, config: dict | None) -> ModelSpec:
    """The model a stored record or an export names: a built-in by its name, any other (a config.json model, known
    by its file's name) by the full config stored with it, so verify and train work from any directory."""
    if name in model_names() or not config:
        return resolve_model(name)
    return _from_config(name, config)


def absolute(name_or_path: str) -> str:
    """A model argument with a config.json path made absolute (search trials run in other working directories)."""
    if name_or_path not in model_names() and os.path.exists(name_or_path):
        return os.path.abspath(name_or_path)
    return name_or_path


OVERRIDABLE = ("global_batch", "seq_len", "total_steps", "grad_clip")


def overrides_of(recipe: dict) -> dict:
    """A stored recipe as with_overrides() keywords: re-running it (verify, train) uses the same recipe."""
    return {k: recipe.get(k) for k in OVERRIDABLE}


def with_overrides(recipe: Recipe, *, global_batch=None, seq_len=None, total_steps=None, total_tokens=None,
                   grad_clip=None) -> Recipe:
    """The recipe with CLI overrides; total_tokens sets the step count (rounded up)."""
    for field, v in (("global_batch", global_batch), ("seq_len", seq_len), ("total_steps", total_steps),
                     ("total_tokens", total_tokens)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ConfigError(f"--{field.replace('_', '-')}", f"{v} is not allowed: give a positive integer")
    if total_steps is not None and total_tokens is not None:
        raise ConfigError("--train-tokens", "give --train-steps or --train-tokens, not both")
    if grad_clip is not None and not (grad_clip >= 0 and grad_clip < float("inf")):
        raise ConfigError("--grad-clip", f"{grad_clip} is not allowed: give a number >= 0 (0 turns clipping off)")
    r = replace(recipe, **{k: v for k, v in (("global_batch", global_batch), ("seq_len", seq_len),
                                              ("total_steps", total_steps), ("grad_clip", grad_clip)) if v is not None})
    if total_tokens is not None:
        per_step = r.global_batch * r.seq_len
        r = replace(r, total_steps=-(-total_tokens // per_step))
    return r


def build_model(config: dict, attn_implementation: str, seq_len: int):
    """A freshly initialised causal LM from its config dict (no weights are downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(config)
    if cfg.get("max_position_embeddings", seq_len) < seq_len:
        cfg["max_position_embeddings"] = seq_len
    hf = AutoConfig.for_model(**cfg)
    return AutoModelForCausalLM.from_config(hf, attn_implementation=attn_implementation)
