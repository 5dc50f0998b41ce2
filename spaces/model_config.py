"""What the knobs read of a model config, without building the model: its sizes under transformers' common names
(whatever the config spells them), the causal-LM class it builds, the attention implementations that class has.
Below trial/ (trial.models re-exports these names): the knobs' rules and the runtime read them too."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from .errors import ConfigError


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
        return sizes_of(hf_config(config))
    if key not in _SIZES:
        _SIZES[key] = sizes_of(hf_config(config))
    return _SIZES[key]


def asked_dtype(config: dict) -> str | None:
    """The weights' dtype a model config asks for ("torch_dtype", or transformers 5's "dtype": nearly every Hub
    config.json has one), when it is not float32; trainscout builds the plan's master dtype all the same."""
    v = config.get("dtype") or config.get("torch_dtype")
    v = str(v).replace("torch.", "") if v else None
    return None if v in (None, "float32", "auto") else v


# what a config.json's "torch_dtype" (transformers 5: "dtype") may say: a floating dtype transformers' config classes
# take, by torch's name ("torch.bfloat16" and "auto" they refuse); trainscout builds the plan's master dtype anyway
DTYPES = ("bfloat16", "float16", "float32", "float64")


def dtype_refusal(config: dict) -> str | None:
    """Why a config's "torch_dtype"/"dtype" is refused, naming the key, its value and the accepted values; None where
    it is absent, null or one of DTYPES (transformers' own error for float8, int8 or 16 named no field)."""
    for key in ("torch_dtype", "dtype"):
        v = config.get(key)
        if v is None or v in DTYPES:
            continue
        return (f"{key}={json.dumps(v)} is not allowed: give one of {', '.join(json.dumps(d) for d in DTYPES)}, "
                "or leave it out (the precision knob sets the dtype trainscout trains in)")
    return None


def hf_config(config: dict):
    """The transformers config object of a model config dict (ConfigError when transformers cannot read it)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.for_model(**config)
    except Exception as e:  # noqa: BLE001 - a config stored by another transformers version, say
        why = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        raise ConfigError("--model", f"transformers cannot read the {config.get('model_type')!r} model config ({why}): "
                                     "give a config.json this transformers reads")


def sizes_of(hf) -> Sizes:
    """The sizes of a transformers config object (ConfigError when a size is not a positive integer)."""
    def size(name, required=True):
        v = getattr(hf, name, None)
        if v is None and not required:
            return None
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError("--model", f"the {hf.model_type} config's {name}={v!r} is not allowed: give a positive "
                                         "integer")
        return v
    hidden = size("hidden_size")
    # only a width the class declares: a stray key (BLOOM's published configs carry "n_inner": null) is not read
    declared = ({f.name for f in dataclasses.fields(hf)} | set(hf.attribute_map) if dataclasses.is_dataclass(hf)
                else None)
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


def model_attentions(config: dict) -> frozenset[str] | None:
    """The attention knob's values the model's transformers class implements, as trial.models' _check_builds read them
    from the class of a config.json it checked in this process (eager always; sdpa and flash where the class says so:
    _supports_sdpa, _supports_flash_attn; BLOOM, Gemma-2, Mamba: eager alone, Gemma-2 and flash, in
    transformers 5.24). None for a config not checked here (a built-in GPT-NeoX, which has them all, or a stored
    record's, checked when it was measured): importing a modeling class costs seconds and torchao's import warnings
    on stderr."""
    return _ATTENTIONS.get(json.dumps(config, sort_keys=True, default=repr))


_ATTENTIONS: dict[str, frozenset] = {}


def note_attentions(config: dict, values: frozenset[str]) -> None:
    """Record the attention values the class of a checked config implements (for model_attentions)."""
    _ATTENTIONS[json.dumps(config, sort_keys=True, default=repr)] = values


KINDS = ("sizes", "attentions")  # the kinds of fact `known` hands on (predictor.model_tree leaves them to `learn`)


def known() -> dict[tuple, object]:
    """What this process read of model configs (their Sizes, the attentions their classes have), to hand to another
    process (predictor.model_tree.known): a search's trial actor then need not import transformers (seconds) to read the
    sizes its driver already read."""
    return {**{("sizes", k): v for k, v in _SIZES.items()}, **{("attentions", k): v for k, v in _ATTENTIONS.items()}}


def learn(facts: dict[tuple, object]) -> None:
    """Take what another process read (`known` there); what this process read itself stays."""
    for (kind, *rest), value in facts.items():
        if kind in KINDS and len(rest) == 1:
            (_SIZES if kind == "sizes" else _ATTENTIONS).setdefault(rest[0], value)


def model_class_name(config: dict) -> str:
    """The name of the transformers causal-LM class a model config builds."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM._model_mapping[type(hf_config(config))].__name__
