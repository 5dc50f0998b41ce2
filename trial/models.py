"""Models and recipes, without the hub: the Pythia family as configs in code, or any causal-LM config.json."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
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
        return sizes(self.config).layers

    @property
    def hidden(self) -> int:
        return sizes(self.config).hidden


@dataclass(frozen=True)
class Sizes:
    """A model's sizes under transformers' common names, whatever its config spells them (GPT-2: n_layer, n_embd,
    n_head, n_positions; BLOOM: n_layer, n_head): read this, never the config dict's keys."""

    layers: int                # num_hidden_layers
    hidden: int                # hidden_size
    heads: int | None          # num_attention_heads (None for a model without attention heads)
    kv_heads: int | None       # num_key_value_heads: fewer than heads for grouped-query attention, else heads
    vocab: int                 # vocab_size
    intermediate: int          # the MLP's inner width: intermediate_size, GPT-2's n_inner, else 4 * hidden
    tied: bool                 # tie_word_embeddings: the head shares the embedding's weights
    max_positions: int | None  # max_position_embeddings; None where the model has no limit (BLOOM's ALiBi)
    experts: int | None = None           # a mixture of experts' routed experts per layer (None: a dense model)
    experts_per_token: int | None = None  # how many of them each token runs (top-k)


_INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")  # the MLP width's spellings
# how transformers' mixture-of-experts families spell the routed experts and the experts each token runs
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "experts_per_token", "top_k")
_SIZES: dict[str, Sizes] = {}


def sizes(config: dict) -> Sizes:
    """The sizes of a model config dict (a built-in's, a config.json's, or one stored with a record), read through
    its transformers config class so that every spelling the class accepts means the same. Cached: the memory
    model reads them for every configuration it estimates. ConfigError when a size is not a positive integer."""
    try:
        key = json.dumps(config, sort_keys=True, default=repr)
    except TypeError:  # keys that do not sort (mixed int and str): read it uncached
        return _sizes_of(hf_config(config))
    if key not in _SIZES:
        _SIZES[key] = _sizes_of(hf_config(config))
    return _SIZES[key]


def hf_config(config: dict):
    """The transformers config object of a model config dict (ConfigError when transformers cannot read it)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.for_model(**config)
    except Exception as e:  # a config stored by another transformers version, say
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise ConfigError("--model", f"transformers cannot read the {config.get('model_type')!r} model config ({why}): "
                                     "give a config.json this transformers reads")


def _sizes_of(hf) -> Sizes:
    def size(name, required=True):
        v = getattr(hf, name, None)
        if v is None and not required:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError("--model", f"the {hf.model_type} config's {name}={v!r} is not allowed: give a positive integer")
        return v
    hidden = size("hidden_size")
    # only a width the class declares: a stray key (BLOOM's published configs carry "n_inner": null) is not read
    declared = {f.name for f in dataclasses.fields(hf)} | set(hf.attribute_map) if dataclasses.is_dataclass(hf) else None
    inter = next((size(n) for n in _INTERMEDIATE if (declared is None or n in declared)
                  and getattr(hf, n, None) is not None), 4 * hidden)
    heads = size("num_attention_heads", required=False)
    experts = next((v for n in EXPERTS if isinstance(v := getattr(hf, n, None), int) and v > 1), None)
    top_k = next((v for n in TOP_K if isinstance(v := getattr(hf, n, None), int) and v > 0), None) if experts else None
    return Sizes(layers=size("num_hidden_layers"), hidden=hidden, heads=heads,
                 kv_heads=size("num_key_value_heads", required=False) or heads, vocab=size("vocab_size"),
                 intermediate=inter, tied=bool(getattr(hf, "tie_word_embeddings", False)),
                 max_positions=size("max_position_embeddings", required=False), experts=experts,
                 experts_per_token=top_k)


def _gpt_neox(hidden: int, layers: int, heads: int, vocab: int = 50304, max_pos: int = 2048) -> dict:
    return dict(model_type="gpt_neox", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=max_pos,
                rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)


def model_names() -> list[str]:
    """The built-in model names: "tiny", then the Pythia sizes."""
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
    hf = _read_config_json(name_or_path)
    full = hf.to_dict()
    name = os.path.splitext(os.path.basename(name_or_path))[0]
    if name == "config":
        name = os.path.basename(os.path.dirname(os.path.abspath(name_or_path))) or name
    return _from_config(name, full)


# The sizes a config.json must give: transformers' defaults for them describe some other model (Llama's: 7B).
ESSENTIAL = ("num_hidden_layers", "hidden_size", "num_attention_heads")
# Sizes a config.json may leave to transformers' defaults: used, with a warning naming them and the values.
DEFAULTABLE = ("vocab_size", "intermediate_size", "max_position_embeddings")
_LEGACY = {"hidden_size": ("n_embed",)}  # kwargs a config class still reads under an older name (BLOOM)
_warned: set[str] = set()


def _read_config_json(path: str):
    """The transformers config of a causal-LM config.json, or a one-line ConfigError on --model naming the field.

    Policy for sizes the file leaves out: without the layer count, hidden size or head count (under any name the
    class reads: n_layer, n_embd, ...) it is refused, as transformers' defaults describe another model (a Llama
    with only "model_type" would become the 7B); vocab_size, intermediate_size and max_position_embeddings are
    filled in from transformers' defaults, which a warning on stderr names with their values (once per file)."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("--model", f"cannot read {path}: {e.__class__.__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''}; give a readable config.json")
    except RecursionError:
        raise ConfigError("--model", f"{path} nests too deeply: give a transformers config.json")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ConfigError("--model", f"{path} has no \"model_type\": give a transformers config.json")
    import transformers
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM
    kind = cfg["model_type"]
    if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
        raise ConfigError("--model", f"{path}: model_type {kind!r} is not known to transformers "
                                     f"{transformers.__version__}: give a model type it has, or upgrade it")
    cls = CONFIG_MAPPING[kind]
    spelled = {name: (name, cls.attribute_map.get(name, name), *_LEGACY.get(name, ()))
               for name in (*ESSENTIAL, *DEFAULTABLE)}
    for name, keys in spelled.items():  # before transformers reads them, so the error names the file's field
        for k in keys:
            v = cfg.get(k)
            if k in cfg and not (v is None and name not in ESSENTIAL) and (
                    not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError("--model", f"{path}: {k}={json.dumps(v)} is not allowed: give a positive integer")
    try:
        hf, default = cls(**cfg), cls()
    except Exception as e:  # strict dataclass validation, a class's own checks (a ZeroDivisionError included)
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise ConfigError("--model", f"{path}: transformers refuses this {kind} config ({why}): fix that field")
    if type(hf) not in AutoModelForCausalLM._model_mapping:
        raise ConfigError("--model", f"{path}: {kind} is not a causal language model")
    given = {name: any(k in cfg for k in keys) or getattr(hf, name, None) != getattr(default, name, None)
             for name, keys in spelled.items()}
    missing = [n for n in ESSENTIAL if hasattr(default, n) and not given[n]]
    if missing:
        raise ConfigError("--model", f"{path}: {', '.join(missing)} not given, and transformers' {kind} defaults "
                                     f"({', '.join(str(getattr(default, n)) for n in missing)}) describe another model: "
                                     "give the model's sizes in the config.json")
    filled = [n for n in DEFAULTABLE if not given[n] and getattr(hf, n, None) is not None]
    if filled and path not in _warned:
        _warned.add(path)
        print(f"trainscout: warning: config.json {kind}: {', '.join(filled)} not given: transformers' defaults used "
              f"({', '.join(str(getattr(hf, n)) for n in filled)})", file=sys.stderr)
    _sizes_of(hf)
    return hf


def _from_config(name: str, config: dict) -> ModelSpec:
    return ModelSpec(name, config, replace(PYTHIA_RECIPE, seq_len=min(2048, sizes(config).max_positions or 2048)))


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
    from transformers import AutoModelForCausalLM
    hf = hf_config(config)
    if (sizes(config).max_positions or seq_len) < seq_len:  # through the class: GPT-2 spells it n_positions
        hf.max_position_embeddings = seq_len
    model_class = AutoModelForCausalLM._model_mapping[type(hf)]
    supports = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn"}.get(attn_implementation)
    if supports and getattr(model_class, supports, True) is False:  # BLOOM has eager attention only
        knob = {"sdpa": "sdpa", "flash_attention_2": "flash"}[attn_implementation]
        raise ConfigError("attention", f"attention={knob}: {model_class.__name__} has no {attn_implementation} "
                                       "attention in this transformers: set attention=eager")
    return AutoModelForCausalLM.from_config(hf, attn_implementation=attn_implementation)
