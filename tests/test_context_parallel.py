"""Context parallel: what runs on the CPU. The numerical test (loss and gradients of a cp-sharded step against the
unsharded model) needs CUDA GPUs: torch 2.13's ring attention (torch.distributed.tensor.experimental.context_parallel)
shards only the CUDA SDPA kernels. On 2 gloo CPU ranks the CPU's SDPA kernel raises "Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered", and the math
kernel (sdpa_kernel(MATH)) "aten.add.Tensor got mixed torch.Tensor and DTensor" on the causal mask; the first is
pinned below, so a torch that runs it on the CPU fails this file and the knob's CPU refusal can go. Here: the plan and
the mesh, the rules, the memory split, the export refusal."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainscout.spaces import ConfigError, Context, ParallelDims, resolve
from trainscout.spaces.knobs.context_parallel import CPU_ERROR
from trainscout.trial.models import TINY_RECIPE, gpt_neox

pytestmark = pytest.mark.timeout(300)
CONFIG = gpt_neox(64, 2, 4, vocab=256, max_pos=128)
GPUS = dict(device="cuda", capability="9.0", num_layers=2, global_batch=8, model_config=CONFIG)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_ring(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out[rank] = "ran"
    except Exception as e:  # noqa: BLE001 - the error is what this records
        out[rank] = f"{type(e).__name__}: {e}"
    dist.destroy_process_group()


def test_torchs_ring_attention_does_not_run_on_the_cpu():
    with mp.Manager() as m:
        out = m.dict()
        # forked: the ranks start with this process's imports (a spawned interpreter imports torch again)
        mp.start_processes(_cpu_ring, args=(2, _free_port(), out), nprocs=2, join=True, start_method="fork")
        out = dict(out)
    assert all(CPU_ERROR in r for r in out.values()), out


def test_the_plan_the_mesh_and_the_batch_split():
    cfg, plan = resolve({"context_parallel": 2, "fsdp": "full_shard", "micro_batch_size": 2},
                        Context(world_size=4, **GPUS))
    assert plan.mesh == {"cp": 2} and plan.engine == "fsdp"
    dims = ParallelDims.of(plan, 4)
    assert (dims.dp, dims.replicas, dims.names) == (2, 4, ("dp", "cp"))  # FSDP shards over data x context ranks
    assert [dims.data_rank(r) for r in range(4)] == [0, 0, 1, 1]  # the cp ranks of a replica read its sequences
    assert plan.micro_batch_size * plan.grad_accum * dims.dp == 8  # the batch splits over the data ranks only


@pytest.mark.parametrize("settings, ctx, words", [
    ({"context_parallel": 2}, Context(world_size=1, **GPUS), "on one rank only context_parallel=1"),
    ({"context_parallel": 2}, Context(world_size=2, num_layers=2, global_batch=8, model_config=CONFIG),
     "needs CUDA GPUs"),
    ({"context_parallel": 2, "sdpa_backend": "math"}, Context(world_size=2, **GPUS), "set sdpa_backend=auto"),
    ({"context_parallel": 2, "attention": "eager"}, Context(world_size=2, **GPUS), "needs attention=sdpa"),
    ({"context_parallel": 4, "pipeline_stages": 2}, Context(world_size=8, **GPUS), "needs pipeline_stages=1"),
])
def test_context_parallel_rules_name_the_fix(settings, ctx, words):
    with pytest.raises(ConfigError) as e:
        resolve(settings, ctx)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_memory_model_splits_the_tokens():
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    from trainscout.trial.models import ModelSpec
    hw = {"device": "cuda", "gpu": "NVIDIA H200", "capability": "9.0"}

    def comp(cp, world, fsdp="off"):
        spec = prepare(ModelSpec("tiny-neox", CONFIG, TINY_RECIPE), {"context_parallel": cp, "fsdp": fsdp,
                       "micro_batch_size": 1}, workers=world, hw=dict(hw, gpu_count=world), global_batch=world // cp,
                       gate=False)
        return memory.components(spec)
    one, two = comp(1, 1), comp(2, 2)
    assert two["activations"] == pytest.approx(one["activations"] / 2)  # each rank holds half of every sequence
    assert two["logits"] == pytest.approx(one["logits"] / 2)
    assert two["weights"] == one["weights"] and two["optimizer"] == one["optimizer"]  # weights stay whole
    assert comp(2, 2, "full_shard")["optimizer"] == pytest.approx(comp(1, 1, "full_shard")["optimizer"] / 2)  # D=dp*cp


def test_the_export_refuses_hf_and_accelerate_in_one_line(tmp_path):
    from trainscout.analysis.export import carried, export, launch
    from trainscout.trial.records import Record
    cfg, plan = resolve({"context_parallel": 2}, Context(world_size=2, **GPUS))
    rec = Record.from_dict({"key": "k", "status": "ok", "model": "tiny-neox", "model_config": CONFIG, "config": cfg,
                            "plan": plan.to_dict(), "recipe": TINY_RECIPE.to_dict(), "device": "cuda", "world_size": 2,
                            "grad_accum": plan.grad_accum, "metrics": {"step_s": 1.0, "tokens_per_s": 1.0},
                            "hardware": {"device": "cuda", "world_size": 2}, "versions": {}})
    assert carried(rec)[0] == ("command",) and launch(rec)["launcher"] == "trainscout"
    for fmt in ("hf", "accelerate"):
        with pytest.raises(ConfigError) as e:
            export(rec, str(tmp_path / fmt), formats=(fmt,))
        assert "context_parallel=2" in str(e.value) and "use --format command" in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("cp, seq_len, fix", [
    (2, 63, "context_parallel=2 splits each sequence into 4 equal chunks: --seq-len 63 is not a multiple of 4: "
            "use --seq-len 60 or 64"),
    (4, 100, "context_parallel=4 splits each sequence into 8 equal chunks: --seq-len 100 is not a multiple of 8: "
             "use --seq-len 96 or 104"),
    (4, 6, "context_parallel=4 splits each sequence into 8 equal chunks: --seq-len 6 is not a multiple of 8: "
           "use --seq-len 8"),
])
def test_a_sequence_the_load_balanced_split_cannot_divide_is_refused(cp, seq_len, fix):
    """torch's load-balanced split gives each cp rank a head and a tail chunk of every sequence: 2*cp equal chunks
    (at 63 tokens over 2 ranks it cut 32/31 without a word); a length they divide runs."""
    with pytest.raises(ConfigError) as e:
        resolve({"context_parallel": cp}, Context(world_size=cp, seq_len=seq_len, **GPUS))
    assert e.value.field == "context_parallel" and str(e.value).endswith(fix), str(e.value)
    assert resolve({"context_parallel": cp}, Context(world_size=cp, seq_len=64, **GPUS))[1].mesh == {"cp": cp}


def test_trial_refuses_the_sequence_length_in_one_line_with_exit_2(tmp_path):
    """Through the CLI: the runner's context carries the recipe's sequence length (--seq-len) to the knob's check."""
    import json
    import subprocess
    import sys
    cfg = tmp_path / "neox.json"
    cfg.write_text(json.dumps(CONFIG))
    res = subprocess.run([sys.executable, "-m", "trainscout.cli", "estimate", "--model", str(cfg), "--workers", "2",
                          "--seq-len", "63", "--set", "context_parallel=2"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if "context_parallel" in ln]
    assert len(lines) == 1 and "--seq-len 63 is not a multiple of 4: use --seq-len 60 or 64" in lines[0], res.stderr
