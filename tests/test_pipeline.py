"""Pipeline parallelism: 2 stages on 2 gloo ranks train the tiny model (4 layers) under every schedule with the
same loss and the same updated weights as the unsplit model on the same batch; the knob's constraints; and one
pipeline trial end to end through Ray Train."""
import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainscout.spaces import ConfigError, Context, resolve
from trainscout.spaces.knobs.pipeline import CHUNKS
from trainscout.trial import engines
from trainscout.trial.models import TINY_RECIPE, gpt_neox, build_model

pytestmark = pytest.mark.timeout(300)
CONFIG = gpt_neox(64, 4, 4, vocab=512, max_pos=256)
SEQ = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: dict, save_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    recipe = TINY_RECIPE.to_dict()
    batch = torch.randint(0, 512, (8, SEQ), generator=torch.Generator().manual_seed(1))
    for schedule in CHUNKS:  # every schedule in one process group (one start of the ranks: CI time)
        torch.manual_seed(0)
        model = build_model(CONFIG, "sdpa", SEQ)
        ref = copy.deepcopy(model)
        names = {id(p): n for n, p in model.named_parameters()}
        _, plan = resolve({"pipeline_stages": 2, "pipeline_schedule": schedule, "pipeline_microbatches": 4,
                           "micro_batch_size": 2, "precision": "fp32"},
                          Context(world_size=world, num_layers=4, global_batch=8))
        engine = engines.build(plan, model, recipe, torch.device("cpu"), world, plan.grad_accum)
        loss = engine.micro_step(batch, is_last=True, scale=1.0)
        ref_loss = ref(input_ids=batch, labels=batch).loss  # the unsplit model: one full batch, one step
        ref_loss.backward()
        ref_params = dict(ref.named_parameters())
        grad_diff = max(((p.grad - ref_params[names[id(p)]].grad).abs().max()
                         / ref_params[names[id(p)]].grad.abs().max().clamp_min(1e-12)).item() for p in engine.params)
        engine.optimizer_step()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), recipe["grad_clip"])
        opt = engines.adamw(list(ref.parameters()), recipe, torch.device("cpu"))
        opt.step()
        diff = max((p.detach() - ref_params[names[id(p)]].detach()).abs().max().item() for p in engine.params)
        out[(schedule, rank)] = {"loss": None if loss is None else loss.item(), "ref_loss": ref_loss.item(),
                                 "max_grad_rel_diff": grad_diff, "max_param_diff": diff,
                                 "n_params": len(engine.params)}
        if schedule == "1f1b":  # `trainscout train`'s checkpoint: rank 0 gathers every stage's parameters
            engines.save(engine, model, names, save_dir, rank)
            if rank == 0:
                from transformers import AutoModelForCausalLM
                saved = dict(AutoModelForCausalLM.from_pretrained(save_dir).named_parameters())
                out["saved_vs_unsplit"] = max((saved[n] - p).abs().max().item() for n, p in ref_params.items())
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_stage_results(tmp_path_factory):
    with mp.Manager() as m:
        out = m.dict()
        # forked: the ranks start with this process's imports (a spawned interpreter imports torch again)
        mp.start_processes(_rank, args=(2, _free_port(), out, str(tmp_path_factory.mktemp("ckpt"))), nprocs=2,
                           join=True, start_method="fork")
        return dict(out)


def test_pipeline_checkpoint_gathers_every_stage(two_stage_results):
    assert two_stage_results["saved_vs_unsplit"] < 5e-6  # the unsplit model after the same step (bound: see below)


@pytest.mark.parametrize("schedule", list(CHUNKS))
def test_two_stage_pipeline_matches_unsplit_model(two_stage_results, schedule):
    out = {rank: two_stage_results[(schedule, rank)] for rank in range(2)}
    losses = [r["loss"] for r in out.values() if r["loss"] is not None]
    assert len(losses) == 1  # the loss lives on the rank holding the last stage
    assert losses[0] == pytest.approx(out[0]["ref_loss"], rel=1e-5)
    assert all(r["max_grad_rel_diff"] < 1e-5 for r in out.values()), out  # same gradients, every stage
    # Same AdamW step, globally clipped. Adam's first step moves a weight by lr * g / (|g| + eps), at most lr (1e-4):
    # for a gradient element near eps the float noise of a different summation order grows to ~1 % of lr (1.0e-6
    # measured), so the bound is 5 % of lr; a missed or stale stage moves its weights by up to lr.
    assert all(r["max_param_diff"] < 5e-6 for r in out.values()), out
    assert sum(r["n_params"] for r in out.values()) == len(list(build_model(CONFIG, "sdpa", SEQ).parameters()))


@pytest.mark.parametrize("settings, world, field", [
    ({"pipeline_stages": 2}, 3, "pipeline_stages"),                                         # 2 does not divide 3 ranks
    ({"pipeline_stages": 2, "pipeline_schedule": "interleaved_1f1b"}, 2, "pipeline_stages"),  # 4 parts of 2 layers
    ({"pipeline_stages": 2, "pipeline_microbatches": 2, "pipeline_schedule": "1f1b", "micro_batch_size": 16}, 2,
     "micro_batch_size"),                                                                    # 16 × 2 > 16 per rank
    ({"pipeline_stages": 4, "pipeline_microbatches": 2, "micro_batch_size": 1}, 4, "pipeline_microbatches"),  # < stages
    ({"pipeline_stages": 2, "zero_stage": 2}, 2, "pipeline_stages"),                         # one engine per trial
    ({"pipeline_schedule": "gpipe"}, 2, "pipeline_schedule"),                                # schedule without stages
])
def test_pipeline_constraints_name_the_fix(settings, world, field):
    with pytest.raises(ConfigError) as e:
        resolve(settings, Context(world_size=world, num_layers=2 if world < 4 else 4, global_batch=16))
    assert e.value.field == field and ":" in str(e.value) and "\n" not in str(e.value)


def test_pipeline_plan_splits_the_batch():
    cfg, plan = resolve({"pipeline_stages": 2, "pipeline_microbatches": 4, "micro_batch_size": 2},
                        Context(world_size=4, num_layers=4, global_batch=32))
    # 4 ranks = 2 data-parallel replicas × 2 stages: 16 sequences per replica = 2 schedule steps of 4 × 2
    assert plan.engine == "pipeline" and plan.grad_accum == 2 and plan.sequences_per_call == 8
    assert plan.engine_config == {"stages": 2, "schedule": "1f1b", "chunks": 1, "microbatches": 4}


def test_pipeline_trial_in_a_worker_group(ray_local):
    from trainscout.trial import execute, prepare
    spec = prepare("tiny", {"pipeline_stages": 2, "pipeline_microbatches": 2, "micro_batch_size": 2,
                            "precision": "fp32"},
                   device="cpu", workers=2, steps=2, warmup=1, global_batch=8)
    r = execute(spec, timeout=240)
    assert r.status == "ok", (r.error, r.stderr_tail)
    assert r.metrics["tokens_per_s"] > 0 and r.metrics["loss"] > 0
    assert r.plan.engine == "pipeline" and r.grad_accum == 2
