"""One part of a pipeline: some decoder layers of a transformers model, with the embedding or the head."""
from __future__ import annotations

import torch
from torch import nn

from trainscout.runtime import decoder_layers

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
             "zero_bubble": "ScheduleInterleavedZeroBubble"}


def _first_attr(obj, names):
    for n in names:
        if getattr(obj, n, None) is not None:
            return getattr(obj, n)
    raise ValueError(f"{type(obj).__name__} has none of {names}")


def causal_mask(config, h: torch.Tensor, pos: torch.Tensor):
    """transformers' own causal mask for a stage's input (None where the kernel applies causality itself). Its
    keyword names moved between 5.x releases (input_embeds/inputs_embeds, past_key_values/cache)."""
    import inspect

    from transformers.masking_utils import create_causal_mask
    params = inspect.signature(create_causal_mask).parameters
    kw = {"config": config, "attention_mask": None, "position_ids": pos}
    kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = h
    for name in ("cache", "past_key_values"):
        if name in params:
            kw[name] = None
    if "cache_position" in params:
        kw["cache_position"] = pos[0]
    return create_causal_mask(**kw)


class StageModule(nn.Module):
    """Layers lo..hi of a decoder-only transformers model, with the embedding on the first part and the final norm
    and LM head on the last. Positions, rotary embeddings and the causal mask are rebuilt on every part the way
    the model's own forward builds them."""

    def __init__(self, model: nn.Module, lo: int, hi: int, n_layers: int, dtype, device_type: str):
        super().__init__()
        base = model.base_model
        self.config = model.config
        self.embed = model.get_input_embeddings() if lo == 0 else None
        self.layers = nn.ModuleList(decoder_layers(model)[lo:hi])
        self.rotary = getattr(base, "rotary_emb", None)
        last = hi == n_layers
        self.norm = _first_attr(base, ("final_layer_norm", "norm", "ln_f")) if last else None
        self.head = model.get_output_embeddings() if last else None
        self.dtype, self.device_type = dtype, device_type

    def forward(self, x):
        with torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            h = self.embed(x) if self.embed is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            mask = causal_mask(self.config, h, pos)
            extra = {"position_embeddings": self.rotary(h, position_ids=pos)} if self.rotary is not None else {}
            for layer in self.layers:
                out = layer(h, attention_mask=mask, position_ids=pos, **extra)
                h = out[0] if isinstance(out, tuple) else out
            if self.head is not None:
                h = self.head(self.norm(h))
        return h
