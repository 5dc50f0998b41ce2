"""Tensor parallel: on 2 gloo ranks (tp 2) and 4 (dp 2 x tp 2: FSDP2 on a 2-D mesh, and FSDP2's replicate) a tiny
Llama and GPT-NeoX train one step with the unsharded model's loss, gradients and updated weights; the rules name the
fix; the memory model predicts each rank's parameters; the export carries only the command."""
import copy
import itertools
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainscout.spaces import ConfigError, Context, ParallelDims, resolve
from trainscout.trial import engines
from trainscout.trial.models import TINY_RECIPE, gpt_neox, build_model

pytestmark = pytest.mark.timeout(300)
SEQ = 32
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
         "max_position_embeddings": 128, "tie_word_embeddings": False}
MODELS = {"llama": LLAMA, "gpt_neox": gpt_neox(64, 2, 4, vocab=256, max_pos=128)}
LOSS_REL, GRAD_ABS, PARAM_ABS = 1e-5, 1e-5, 1e-6  # fp32; measured 1.7e-7, 3.0e-8, 2.1e-7 (reduction order)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _rank(rank: int, world: int, port: int, runs: dict, out: dict) -> None:
    """Each run (name -> settings) in turn, in one process group: one start-up of the ranks for all of them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    recipe = TINY_RECIPE.to_dict()
    batch = torch.randint(0, 256, (4, SEQ), generator=torch.Generator().manual_seed(1))
    for (run, settings), (family, config) in itertools.product(runs.items(), MODELS.items()):
        torch.manual_seed(0)
        model = build_model(config, "sdpa", SEQ)
        ref = copy.deepcopy(model)
        _, plan = resolve({**settings, "precision": "fp32"},
                          Context(world_size=world, num_layers=2, global_batch=4, model_config=config))
        engine = engines.build(plan, model, recipe, torch.device("cpu"), world, plan.grad_accum)
        dims = ParallelDims.of(plan, world)
        mine = batch.chunk(dims.dp)[dims.data_rank(rank)]  # the worker's split: tp ranks read the same sequences
        loss = engine.micro_step(mine, is_last=True, scale=1.0).detach()
        grads = {n: _full(p.grad).clone() for n, p in model.named_parameters()}
        local_params = sum(_local(p).numel() for p in model.parameters())
        engine.optimizer_step()
        dist.all_reduce(loss)  # the mean over the data ranks (each tp rank holds its replica's loss)
        loss = loss.item() / world

        ref_loss = ref(input_ids=batch, labels=batch).loss
        ref_loss.backward()
        ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        torch.nn.utils.clip_grad_norm_(ref.parameters(), recipe["grad_clip"])
        engines.adamw(list(ref.parameters()), recipe, torch.device("cpu")).step()
        ref_params = dict(ref.named_parameters())
        out[(run, family, rank)] = {
            "loss": loss, "ref_loss": ref_loss.item(), "local_params": local_params,
            "grad_diff": max((grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads),
            "param_diff": max((_full(p.detach()) - ref_params[n].detach()).abs().max().item()
                              for n, p in model.named_parameters()),
            "sharded": sum(hasattr(p, "to_local") for p in model.parameters())}
        engine.close()
        dist.barrier()
    dist.destroy_process_group()


def _spawn(world, runs: dict) -> dict:
    """{run: {(family, rank): figures}} of each run (name -> settings) on `world` gloo ranks."""
    with mp.Manager() as m:
        out = m.dict()
        # forked: the ranks start with this process's imports (a spawned interpreter imports torch again)
        mp.start_processes(_rank, args=(world, _free_port(), runs, out), nprocs=world, join=True,
                           start_method="fork")
        got = {}
        for (run, family, rank), v in dict(out).items():
            got.setdefault(run, {})[(family, rank)] = v
        return got


@pytest.fixture(scope="module")
def runs():
    return {**_spawn(2, {"tp2": {"tensor_parallel": 2}}),
            **_spawn(4, {"dp2xtp2": {"tensor_parallel": 2, "fsdp": "full_shard"},
                         "dp2xtp2-replicate": {"tensor_parallel": 2}})}


@pytest.mark.parametrize("run, world", [("tp2", 2), ("dp2xtp2", 4)])
@pytest.mark.parametrize("family", list(MODELS))
def test_tensor_parallel_matches_the_unsharded_model(runs, run, world, family):
    out = [runs[run][(family, r)] for r in range(world)]
    for r in out:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=LOSS_REL)
        assert r["grad_diff"] < GRAD_ABS and r["param_diff"] < PARAM_ABS, out
        assert r["sharded"] > 0  # the layers' linears are DTensors


def test_data_parallel_over_tensor_parallel_without_fsdp_is_replicate(runs):
    """dp 2 x tp 2 with fsdp=off: FSDP2's replicate over the data ranks (DDP takes no DTensors): same numbers."""
    out = runs["dp2xtp2-replicate"]
    for r in (out[("gpt_neox", k)] for k in range(4)):
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=LOSS_REL)
        assert r["grad_diff"] < GRAD_ABS and r["param_diff"] < PARAM_ABS, out


def test_the_memory_model_predicts_each_ranks_parameters(runs):
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    from trainscout.trial.models import ModelSpec
    spec_of = lambda tp, world: prepare(ModelSpec("llama-tiny", LLAMA, TINY_RECIPE),  # noqa: E731
                                        {"tensor_parallel": tp, "precision": "fp32", "micro_batch_size": 1},
                                        workers=world, hw={"device": "cpu", "gpu_count": 0}, global_batch=4, gate=False)
    one, two = memory.components(spec_of(1, 1)), memory.components(spec_of(2, 2))
    measured = runs["tp2"][("llama", 0)]["local_params"]
    assert two["weights"] / 4 == pytest.approx(measured, rel=0.01)  # fp32: 4 bytes a parameter; norms counted split
    assert two["optimizer"] == pytest.approx(one["optimizer"] * two["weights"] / one["weights"])
    # the layers' activations: their split share (Korthikanti et al.'s 24 of 34) halves, the rest stays whole
    from trainscout.spaces.knobs.tensor_parallel import SPLIT_SHARE
    assert two["activations"] < one["activations"]
    assert two["logits"] == one["logits"]  # the head is not split
    assert SPLIT_SHARE == pytest.approx(24 / 34)


LLAMA_CTX = dict(num_layers=2, global_batch=8, model_config=LLAMA)


@pytest.mark.parametrize("settings, world, words", [
    ({"tensor_parallel": 2}, 1, "on one rank only tensor_parallel=1"),
    ({"tensor_parallel": 4}, 6, "does not divide the 6 rank(s)"),
    ({"tensor_parallel": 4}, 4, "does not divide the model's 2 key/value heads"),
    ({"tensor_parallel": 2, "zero_stage": 2}, 2, "needs zero_stage=0"),
    ({"tensor_parallel": 2, "fp8": "rowwise"}, 2, "fp8"),
])
def test_tensor_parallel_rules_name_the_fix(settings, world, words):
    with pytest.raises(ConfigError) as e:
        resolve(settings, Context(world_size=world, **LLAMA_CTX))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_model_without_a_plan_is_refused():
    bloom = {"model_type": "bloom", "n_layer": 2, "hidden_size": 64, "n_head": 4, "vocab_size": 256}
    with pytest.raises(ConfigError, match="has no plan for bloom model .*set tensor_parallel=1"):
        resolve({"tensor_parallel": 2}, Context(world_size=2, num_layers=2, global_batch=8, model_config=bloom))


def test_the_export_carries_the_command_and_refuses_hf_in_one_line(tmp_path):
    from trainscout.analysis.export import carried, export, launch
    from trainscout.trial.records import Record
    cfg, plan = resolve({"tensor_parallel": 2}, Context(world_size=2, **LLAMA_CTX))
    rec = Record.from_dict({"key": "k", "status": "ok", "model": "llama-tiny", "model_config": LLAMA, "config": cfg,
                            "plan": plan.to_dict(), "recipe": TINY_RECIPE.to_dict(), "device": "cpu", "world_size": 2,
                            "grad_accum": plan.grad_accum, "metrics": {"step_s": 1.0, "tokens_per_s": 1.0},
                            "hardware": {"device": "cpu", "world_size": 2}, "versions": {}})
    assert carried(rec)[0] == ("command",)
    assert launch(rec) == {"launcher": "trainscout", "command": "trainscout train --config . --steps 1000"}
    with pytest.raises(ConfigError) as e:
        export(rec, str(tmp_path / "hf"), formats=("hf",))
    assert "tensor_parallel=2" in str(e.value) and "use --format command" in str(e.value) and "\n" not in str(e.value)
    written = export(rec, str(tmp_path / "all"))
    assert sorted(os.path.basename(w) for w in written) == ["launch.sh", "trainscout.json"]
