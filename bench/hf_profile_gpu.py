"""Profile 2 optimizer steps of an export in the stock HF Trainer (with the runtime hook): where does its step
lose to trainscout's? Prints the top CUDA kernels and CPU ops, the syncs, and GPU-busy time per step.
Usage: python bench/hf_profile_gpu.py EXPORT_DIR"""
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback

from trainscout.analysis.hf_run import Tokens
from trainscout.runtime import hf

export = sys.argv[1]
exp = hf.load(export)
model = hf.prepare(AutoModelForCausalLM.from_config(hf.model_config(exp), attn_implementation="sdpa"), exp)
prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


class P(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == 3:
            torch.cuda.synchronize()
            prof.__enter__()

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 5:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)


with tempfile.TemporaryDirectory() as out:
    args = hf.training_arguments(export, output_dir=out, max_steps=6, logging_steps=10**6, save_strategy="no")
    n = 6 * args.per_device_train_batch_size * args.gradient_accumulation_steps
    Trainer(model=model, args=args, train_dataset=Tokens(n, exp["recipe"]["seq_len"],
                                                         int(exp["model_config"]["vocab_size"])),
            callbacks=[P()]).train()
ka = prof.key_averages()
print(ka.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
print(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
for k in ka:
    if any(s in k.key for s in ("Synchronize", "item", "_local_scalar_dense", "nonzero", "cudaMemcpy")):
        print(f"{k.key:50} calls {k.count:6}  cpu {k.cpu_time_total / 1e3:9.1f} ms")
