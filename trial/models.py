"""Models and recipes, without the hub: the Pythia family as configs in code, or any causal-LM config.json."""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, replace

from trainscout.spaces import ConfigError
# a model config's sizes live below trial/ (the knobs read them)
from trainscout.spaces.model_config import dtype_refusal, hf_config, note_attentions, sizes, sizes_of

# name: (hidden, layers, heads); intermediate = 4 * hidden, vocab 50304, rotary_pct=0.25, parallel residual, untied
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
    seq_len: int = 2048         # tokens per sequence (Pythia's 2049 includes the shifted label)
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


def gpt_neox(hidden: int, layers: int, heads: int, vocab: int = 50304, max_pos: int = 2048) -> dict:
    """A GPT-NeoX config dict of Pythia's shape (intermediate 4 x hidden, rotary on a quarter, parallel residual)."""
    return dict(model_type="gpt_neox", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=max_pos,
                rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False)


def model_names() -> list[str]:
    """The built-in model names: "tiny", then the Pythia sizes."""
    return ["tiny", *PYTHIA]


def resolve_model(name_or_path: str) -> ModelSpec:
    """A Pythia name, "tiny", or the path of a transformers config.json of a causal LM."""
    if name_or_path == "tiny":
        return ModelSpec("tiny", gpt_neox(*TINY, vocab=512, max_pos=256), TINY_RECIPE)
    if name_or_path in PYTHIA:
        return ModelSpec(name_or_path, gpt_neox(*PYTHIA[name_or_path]), PYTHIA_RECIPE)
    if not (name_or_path.endswith(".json") or os.sep in name_or_path):
        raise ConfigError("--model", f"unknown model {name_or_path!r}: use one of {', '.join(model_names())} "
                                     "or the path of a config.json")
    try:  # read once per file content: a search prepares thousands of draws of one model
        stat = os.stat(name_or_path)
        key = (os.path.abspath(name_or_path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = None
    if key not in _READ:
        hf = _read_config_json(name_or_path)
        full = hf.to_dict()
        name = os.path.splitext(os.path.basename(name_or_path))[0]
        if name == "config":
            name = os.path.basename(os.path.dirname(os.path.abspath(name_or_path))) or name
        if key is None:
            return _from_config(name, full)
        _READ[key] = _from_config(name, full)
    return copy.deepcopy(_READ[key])


_READ: dict[tuple, ModelSpec] = {}  # (path, mtime, size) -> the model it describes


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
    cfg = _config_dict(path)
    cls = _config_class(path, cfg)
    kind = cfg["model_type"]
    spelled = {name: (name, cls.attribute_map.get(name, name), *_LEGACY.get(name, ()))
               for name in (*ESSENTIAL, *DEFAULTABLE)}
    for name, keys in spelled.items():  # before transformers reads them, so the error names the file's field
        for k in keys:
            v = cfg.get(k)
            if k in cfg and not (v is None and name not in ESSENTIAL) and (
                    not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError("--model", f"{path}: {k}={json.dumps(v)} is not allowed: give a positive integer")
    hf, default = _built_config(path, cfg, cls)
    _check_tokens_and_experts(path, hf)
    given = {name: any(k in cfg for k in keys) or getattr(hf, name, None) != getattr(default, name, None)
             for name, keys in spelled.items()}
    missing = [n for n in ESSENTIAL if hasattr(default, n) and not given[n]]
    if missing:
        raise ConfigError("--model", f"{path}: {', '.join(missing)} not given, and transformers' {kind} defaults "
                                     f"({', '.join(str(getattr(default, n)) for n in missing)}) describe another "
                                     "model: give the model's sizes in the config.json")
    filled = [n for n in DEFAULTABLE if not given[n] and getattr(hf, n, None) is not None]
    if filled and path not in _warned:
        _warned.add(path)
        print(f"trainscout: warning: config.json {kind}: {', '.join(filled)} not given: transformers' defaults used "
              f"({', '.join(str(getattr(hf, n)) for n in filled)})", file=sys.stderr)
    z = sizes_of(hf)
    if z.heads and z.kv_heads and z.heads % z.kv_heads:  # transformers builds it; the first forward fails
        raise ConfigError("--model", f"{path}: num_key_value_heads={z.kv_heads} does not divide num_attention_heads="
                                     f"{z.heads}: give a divisor of {z.heads} (grouped-query attention shares each "
                                     "key/value head among the same number of query heads)")
    _check_builds(path, hf)
    return hf


def _config_dict(path: str) -> dict:
    """The config.json as a dict with a "model_type", or a one-line ConfigError on --model."""
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
    return cfg


def _config_class(path: str, cfg: dict):
    """The transformers config class of its model_type; ConfigError for a type transformers does not know or a
    dtype refused."""
    import transformers
    from transformers import CONFIG_MAPPING
    kind = cfg["model_type"]
    if not isinstance(kind, str) or kind not in CONFIG_MAPPING:
        raise ConfigError("--model", f"{path}: model_type {kind!r} is not known to transformers "
                                     f"{transformers.__version__}: give a model type it has, or upgrade it")
    cls = CONFIG_MAPPING[kind]
    refusal = dtype_refusal(cfg)
    if refusal:
        raise ConfigError("--model", f"{path}: {refusal}")
    return cls


def _built_config(path: str, cfg: dict, cls):
    """(the config built from the file, the class's default one); ConfigError where transformers refuses it, says
    in a warning what it must be, or it is no causal language model."""
    from transformers import AutoModelForCausalLM
    kind = cfg["model_type"]
    try:
        with _warnings() as said:  # what transformers' config class says is wrong, it says as a warning
            hf = cls(**cfg)
        default = cls()
    except Exception as e:  # noqa: BLE001 - strict dataclass validation, a class's own checks (a ZeroDivisionError included)
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise ConfigError("--model", f"{path}: transformers refuses this {kind} config ({why}): fix that field")
    if type(hf) not in AutoModelForCausalLM._model_mapping:
        raise ConfigError("--model", f"{path}: {kind} is not a causal language model")
    refused = [m for who, m in said if who in _VALIDATORS and _REFUSED.search(m)]  # a RoPE factor < 1, ...
    if refused:
        raise ConfigError("--model", f"{path}: transformers' {cls.__name__} says: {refused[0].rstrip('. ')}: fix that "
                                     "field in the config.json")
    return hf, default


def _check_tokens_and_experts(path: str, hf) -> None:
    """ConfigError for a padding id outside the vocabulary, or a router that picks more experts than there are."""
    pad, vocab = getattr(hf, "pad_token_id", None), getattr(hf, "vocab_size", None)
    if isinstance(pad, int) and isinstance(vocab, int) and not -vocab <= pad < vocab:  # nn.Embedding's padding_idx
        raise ConfigError("--model", f"{path}: pad_token_id={pad} is outside the vocabulary (vocab_size={vocab}): set "
                                     f"pad_token_id to null or an id below {vocab}")
    topk = getattr(hf, "num_experts_per_tok", None)
    experts = next(((k, v) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if isinstance(v := getattr(hf, k, None), int) and not isinstance(v, bool)), None)
    if isinstance(topk, int) and experts and topk > experts[1]:
        raise ConfigError("--model", f"{path}: num_experts_per_tok={topk} is more than {experts[0]}={experts[1]}: "
                                     f"give num_experts_per_tok of at most {experts[1]}")


# transformers' config validation that only warns (its RoPE checks: "`rope_parameters`'s factor field must be a float
# or int >= 1, got -1"): what it says must be is refused. Its special-token check warns once per process and Hub
# configs carry pad_token_id=-1 (a valid index from the end), so the padding index is checked as nn.Embedding does.
_VALIDATORS = ("transformers.modeling_rope_utils",)
_REFUSED = re.compile(r"\bmust be\b", re.I)


@contextlib.contextmanager
def _warnings():
    """(logger, message) of what transformers logs at warning level or above while the block runs."""
    import logging
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append((record.name, record.getMessage()))
    handler, logger = Keep(logging.WARNING), logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


_BUILT: dict[str, None] = {}  # config.json contents checked by _check_builds (prepare resolves a model many times)


def _check_builds(path: str, hf) -> None:
    """Build the model on the meta device (no memory, no weights; fast) as transformers' class builds it, and
    refuse what cannot be trained as a causal LM: a class that fails to build (a padding index outside the
    vocabulary, a head count that does not divide the hidden size, ...) or whose attention sees later tokens (an
    encoder such as BERT in its LM-head class: transformers says "add is_decoder=True")."""
    import torch
    from transformers import AutoModelForCausalLM
    key = json.dumps(hf.to_dict(), sort_keys=True, default=repr)
    if key in _BUILT:
        return
    cls = AutoModelForCausalLM._model_mapping[type(hf)]
    try:
        with torch.device("meta"), _warnings() as said:
            model = AutoModelForCausalLM.from_config(hf, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - whatever the class raises: refused, naming it
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300] or type(e).__name__
        raise ConfigError("--model", f"{path}: transformers cannot build {cls.__name__} from it ({type(e).__name__}: "
                                     f"{why}): fix that field in the config.json")
    bidirectional = [n for n, m in model.named_modules() if getattr(m, "is_causal", None) is False
                     and not any(w in n.lower() for w in ("cross", "encoder_attn"))]  # cross-attention sees its input
    if bidirectional or any("is_decoder=True" in m for _, m in said):
        raise ConfigError("--model", f"{path}: {cls.__name__} is not a causal language model as configured: its "
                                     "attention sees later tokens (an encoder, is_decoder false): give a decoder's "
                                     "config.json, or set \"is_decoder\": true to train it as one")
    _BUILT[key] = None
    note_attentions(hf.to_dict(), frozenset({"eager"} | {knob for knob, flag in (("sdpa", "_supports_sdpa"),
                                                                               ("flash", "_supports_flash_attn"))
                                                       if getattr(cls, flag, True) is not False}))


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


def build_model(config: dict, attn_implementation: str, seq_len: int, dtype: str = "float32"):
    """A freshly initialised causal LM from its config dict (no weights are downloaded), its parameters in dtype
    (the plan's master_dtype). A Hub config.json's "torch_dtype"/"dtype" ("bfloat16" in Llama's, Qwen's, Mistral's;
    "float16" in Pythia's) would make transformers build the weights in it, i.e. train pure 16-bit weights under a
    mixed-precision label: the precision knob decides, never the file."""
    import torch
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
    return AutoModelForCausalLM.from_config(hf, attn_implementation=attn_implementation, dtype=getattr(torch, dtype))

