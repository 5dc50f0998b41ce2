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

from trainscout.runtime import decoder_layers, prepare_model

from .base import Engine, autocast_dtype, optimizer, register_engine
from .plain import TorchEngine


@register_engine
class PipelineEngine(Engine):
    """torch.distributed.pipelining stages, DDP over the data-parallel ranks."""

    name = "pipeline"
    launcher = "trainscout"
    portability = 3
    formats = ("command",)
    not_carried = ("HF Trainer and accelerate have no pipeline engine (they would run plain DDP with a stage's share "
                   "of the batch): use --format command, which runs it with `trainscout train`")

    def __init__(self, model, plan, recipe, device, world, measured_accum=1, dims=None):
        from torch.distributed import pipelining

        from trainscout.runtime import parallel_dims

        from .pipeline_stage import SCHEDULES, StageModule
        self.dims = dims or parallel_dims(plan, world)
        pipe = plan.engine_config  # the pipeline_stages knob's: stages, schedule, chunks per rank, microbatches
        pp, chunks, n_micro = pipe["stages"], pipe["chunks"], pipe["microbatches"]
        dp = self.dims.dp
        mesh = self.dims.mesh(device.type)  # (dp, pp): the pipeline innermost
        self.pp_group, pp_rank = mesh["pp"].get_group(), mesh["pp"].get_local_rank()
        self.data_rank = mesh["dp"].get_local_rank()  # pipeline ranks of one replica read the same batch
        n_layers, parts = len(decoder_layers(model)), pp * chunks
        per = n_layers // parts
        dtype = autocast_dtype(plan.precision)
        # on the whole model: each part takes its layers as the transforms left them
        prepare_model(model, plan, dims=self.dims)
        self.loss_function, self.vocab = model.loss_function, model.config.vocab_size
        self.stages, mods = [], []
        for c in range(chunks):
            idx = pp_rank + c * pp  # looped placement (interleaved schedules)
            mod = StageModule(model, idx * per, (idx + 1) * per, n_layers, dtype, device.type).to(device)
            mods.append(mod)
            if dp > 1:
                from torch.nn.parallel import DistributedDataParallel
                mod = DistributedDataParallel(mod, process_group=mesh["dp"].get_group(),
                                              device_ids=[device.index] if device.type == "cuda" else None)
            self.stages.append(pipelining.PipelineStage(mod, idx, parts, device, group=self.pp_group))
        self.has_first = any(s.is_first for s in self.stages)
        self.has_last = any(s.is_last for s in self.stages)
        cls = getattr(pipelining.schedules, SCHEDULES[pipe["schedule"]])
        self.scale = 1.0
        self.schedule = cls(self.stages if chunks > 1 else self.stages[0],  # multi-stage schedules take a list
                            n_microbatches=n_micro, loss_fn=self._loss, scale_grads=True)
        self.params = [p for m in mods for p in m.parameters() if p.requires_grad]
        self.opt = optimizer(self.params, plan, recipe, device)  # every knob's optimizer hook applied
        self.clip = recipe["grad_clip"]

    def _loss(self, logits, target):
        """The model's own causal-LM loss function (next-token, mean over tokens; compiled where loss_kernel says),
        times the accumulation scale."""
        return self.loss_function(logits, target, self.vocab) * self.scale

    def micro_step(self, batch, is_last: bool, scale: float):
        """One schedule step over the pipeline's micro-batches; the loss (mean over them) on the last stage's rank."""
        self.scale = scale
        losses = [] if self.has_last else None
        args = (batch,) if self.has_first else ()
        self.schedule.step(*args, target=batch if self.has_last else None, losses=losses)
        import torch
        return torch.stack(losses).mean() if losses else None

    def optimizer_step(self):
        import torch
        import torch.distributed as dist
        if self.clip:  # the global norm: each pipeline rank holds only its parts' gradients
            grads = [p.grad for p in self.params if p.grad is not None]
            local = (torch.nn.utils.get_total_norm(grads, 2.0) if grads
                     else torch.zeros((), device=self.params[0].device))
            sq = local.float() ** 2
            dist.all_reduce(sq, group=self.pp_group)
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip, sq.sqrt())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def full_state_dict(self, names, rank):
        """Pipeline ranks send their stages' parameters to rank 0."""
        import torch.distributed as dist
        parts = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object({names[id(p)]: p.detach().cpu() for p in self.params}, parts, dst=0)
        return {k: v for part in (parts or []) for k, v in part.items()}

    @classmethod
    def held(cls, c, plan):
        P = plan.engine_config["stages"]  # the fullest rank: its share of the layers plus the embedding or the head
        return c["per_layer"] * (c["L"] // P) + c["embed"], c["L"] // P

    model_states = TorchEngine.model_states  # each stage holds its parameters as plain PyTorch / DDP does

    @classmethod
    def schedule(cls, plan):
        from trainscout.spaces.knobs.pipeline import BUBBLE
        pipe = plan.engine_config
        return pipe.get("microbatches", 1), (pipe["stages"] - 1) * BUBBLE[pipe.get("schedule", "1f1b")]

    @classmethod
    def in_flight(cls, plan, activations, logits):
        pipe = plan.engine_config
        P, n = pipe["stages"], pipe.get("microbatches", 1)
        chunks, schedule = pipe.get("chunks", 1), pipe.get("schedule")
        if schedule == "gpipe":  # every forward before any backward: the last stage keeps every micro-batch's logits
            return activations * n, logits * n
        # 1F1B: the stage count; interleaved: one more; zero-bubble also holds deferred weight-gradient inputs
        return activations * min(n, P + (chunks > 1) + (P - 1) * (schedule == "zero_bubble")), logits
