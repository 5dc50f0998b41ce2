"""Pipeline-parallel engine on torch.distributed.pipelining, data parallel (DDP) over the remaining ranks.

Why torch.distributed.pipelining and not DeepSpeed's PipelineModule: it keeps the model a plain PyTorch module
(no rewrite into a LayerSpec list), it ships every schedule the knob offers (GPipe, 1F1B, interleaved 1F1B,
interleaved zero-bubble) and it composes with DDP/FSDP2 the way torchtitan does; DeepSpeed's pipeline engine
has one schedule and refuses ZeRO-2/3.

Ranks form a (data, pipeline) mesh with the pipeline innermost, so neighbouring stages sit on neighbouring GPUs.
Each pipeline rank holds `chunks` model parts (2 for the interleaved schedules, looped: rank r holds parts r and
r + stages). One `micro_step` is one schedule step over `microbatches` micro-batches of `micro_batch_size`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainscout.spaces import Plan

from .engines import DTYPES, adamw, apply_activation_checkpointing, decoder_layers, loss_kernel

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


def causal_cross_entropy(logits, target):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target[:, 1:].flatten())


class PipelineEngine:
    def __init__(self, model, plan: Plan, recipe: dict, device: torch.device, world: int):
        from torch.distributed import pipelining
        from torch.distributed.device_mesh import init_device_mesh
        pp, chunks, n_micro = plan.pipeline["stages"], plan.pipeline["chunks"], plan.pipeline["microbatches"]
        dp = world // pp
        mesh = init_device_mesh(device.type, (dp, pp), mesh_dim_names=("dp", "pp"))
        self.pp_group, pp_rank = mesh["pp"].get_group(), mesh["pp"].get_local_rank()
        self.data_rank = mesh["dp"].get_local_rank()  # pipeline ranks of one replica read the same batch
        n_layers, parts = len(decoder_layers(model)), pp * chunks
        per = n_layers // parts
        dtype = DTYPES[plan.precision]
        self.stages, mods = [], []
        for c in range(chunks):
            idx = pp_rank + c * pp  # looped placement (interleaved schedules)
            mod = StageModule(model, idx * per, (idx + 1) * per, n_layers, dtype, device.type).to(device)
            apply_activation_checkpointing(mod.layers, plan.checkpoint_every)
            mods.append(mod)
            if dp > 1:
                from torch.nn.parallel import DistributedDataParallel
                mod = DistributedDataParallel(mod, process_group=mesh["dp"].get_group(),
                                              device_ids=[device.index] if device.type == "cuda" else None)
            self.stages.append(pipelining.PipelineStage(mod, idx, parts, device, group=self.pp_group))
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        cls = getattr(pipelining.schedules, SCHEDULES[plan.pipeline["schedule"]])
        self.scale = 1.0
        self.cross_entropy = loss_kernel(causal_cross_entropy, plan)
        self.schedule = cls(self.stages if chunks > 1 else self.stages[0],  # multi-stage schedules take a list
                            n_microbatches=n_micro, loss_fn=self._loss, scale_grads=True)
        self.params = [p for m in mods for p in m.parameters() if p.requires_grad]
        self.opt = adamw(self.params, recipe, device)
        self.clip = recipe["grad_clip"]

    def _loss(self, logits, target):
        """The model's own causal-LM loss (next-token, mean over tokens), times the accumulation scale."""
        return self.cross_entropy(logits, target) * self.scale

    def micro_step(self, batch, is_last: bool, scale: float):
        """One schedule step over the pipeline's micro-batches; the loss (mean over them) on the last stage's rank."""
        self.scale = scale
        losses = [] if self.has_last else None
        args = (batch,) if self.has_first else ()
        self.schedule.step(*args, target=batch if self.has_last else None, losses=losses)
        return torch.stack(losses).mean() if losses else None

    def optimizer_step(self):
        if self.clip:  # the global norm: each pipeline rank holds only its parts' gradients
            grads = [p.grad for p in self.params if p.grad is not None]
            local = torch.nn.utils.get_total_norm(grads, 2.0) if grads else torch.zeros((), device=self.params[0].device)
            sq = local.float() ** 2
            dist.all_reduce(sq, group=self.pp_group)
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip, sq.sqrt())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
