"""Context parallelism: every sequence's tokens split over ranks, attention as a ring over them (long sequences)."""
from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Export, Runtime

# what torch 2.13 answers on the CPU (gloo, 2 ranks, checked in tests/test_context_parallel.py): its ring attention
# shards only the CUDA SDPA kernels (flash, memory-efficient, cuDNN); the CPU's flash kernel has no sharding
# strategy, and the math kernel decomposes into ops that mix the sharded and the whole causal mask
CPU_ERROR = ("Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy "
             "registered")


class ContextParallelRuntime(Runtime):
    def wrap_step(self, step, plan, dims):
        """Shard the micro-batch's tokens over the mesh's "cp" ranks (load-balanced: each rank a head and a tail
        chunk) with the labels shifted and the positions numbered before sharding, and run forward and backward in
        torch's context-parallel SDPA. Each rank's loss is its tokens' sum over the micro-batch's token count / cp,
        so the gradients averaged over the data x context ranks are the unsharded mean's; the loss returned is the
        micro-batch's (all-reduced over cp)."""
        cp = plan.mesh.get("cp", 1)
        if cp == 1:
            return step

        def cp_step(model, batch, scale, **loss_kwargs):
            import torch
            import torch.distributed as dist
            from torch.distributed.tensor.experimental import context_parallel
            mesh = dims.mesh(batch.device.type)["cp"]
            b, s = batch.shape
            tokens = batch.clone()
            labels = torch.cat([batch[:, 1:], batch.new_full((b, 1), -100)], dim=1)  # the next token, shifted whole
            positions = torch.arange(s, device=batch.device).expand(b, s).contiguous()
            count = torch.tensor(b * (s - 1) / cp, device=batch.device)  # the unsharded mean's tokens, over cp
            buffers = [tokens, labels, positions]
            with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
                loss = step(model, tokens, scale, shift_labels=labels, position_ids=positions,
                            num_items_in_batch=count, **loss_kwargs)
            out = loss.detach().clone()
            dist.all_reduce(out, group=mesh.get_group())
            return out / cp
        return cp_step


@register
class ContextParallel(Knob):
    """Context parallel degree: split every sequence's tokens over this many ranks, ring attention between them (torch.distributed.tensor.experimental.context_parallel; CUDA SDPA kernels)."""  # noqa: E501 - its first line is the description `trainscout knobs` prints (spaces.knob.description)

    name = "context_parallel"
    default = 1
    choices = (1, 2, 4, 8)
    requires = {"zero_stage": (0,), "pipeline_stages": (1,), "attention": ("sdpa",)}  # torch's ring replaces SDPA
    # the memory model splits each sequence over its mesh dimension; gradients average over data x context ranks
    runtime = ContextParallelRuntime(mesh_dim="cp")
    export = Export(formats=("command",), launcher="trainscout",
                    not_carried=("transformers' TrainingArguments has no context-parallel field (accelerate's "
                                 "parallelism_config cp_size needs your script to shard every batch in its context): "
                                 "use --format command, whose launch.sh runs it with `trainscout train`"))

    def check(self, value, cfg, ctx):
        if value == 1:
            return
        if ctx.world_size % value:
            raise ConfigError(self.name, f"context_parallel={value} does not divide the {ctx.world_size} rank(s): "
                                         f"choose a divisor of {ctx.world_size}" +
                                         (" (on one rank only context_parallel=1)" if ctx.world_size == 1 else ""))
        chunks = 2 * value  # torch's load-balanced split: each rank a head and a tail chunk of every sequence
        if ctx.seq_len and ctx.seq_len % chunks:
            low = ctx.seq_len // chunks * chunks
            near = "--seq-len " + " or ".join(str(n) for n in (low, low + chunks) if n > 0)
            raise ConfigError(self.name, f"context_parallel={value} splits each sequence into {chunks} equal chunks: "
                                         f"--seq-len {ctx.seq_len} is not a multiple of {chunks}: use {near}")
        if ctx.device != "cuda":
            raise ConfigError(self.name, f"context_parallel={value} needs CUDA GPUs: torch's ring attention shards "
                                         f"only the CUDA SDPA kernels (on the CPU: {CPU_ERROR}): set "
                                         "context_parallel=1")
        if cfg["sdpa_backend"] == "math":
            raise ConfigError(self.name, f"context_parallel={value} shards the flash, memory-efficient or cuDNN SDPA "
                                         "kernel, not the math one: set sdpa_backend=auto")

    def apply(self, plan, value, cfg, ctx):
        pass  # resolve() writes the degree into plan.mesh["cp"] (mesh_dim); wrap_step reads it there
