"""lookup, estimate and search agree (issue 45 item 4, issue 46 item 2): what lookup puts first for a model never
measured is a configuration `trainscout search` would run on that box: it fits the GPU by `trainscout estimate`
and the host by the rule the search prunes its trials by (predictor.memory.host_refusal); memory savers are chosen by
predicted step time (sharding over the ranks before offload where the GPUs hold it), in lookup and in the search's
start points alike. No GPU: the Mistral-7B-v0.3 config.json as published (bench/models/hub), the real memory and
step-time models, the shipped atlas."""
import dataclasses
import json
import os

import pytest

from trainscout.atlas import db, lookup
from trainscout.cli.main import main
from trainscout.spaces import fmt
from trainscout.predictor import memory, steptime
from trainscout.trial import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISTRAL = os.path.join(ROOT, "bench", "models", "hub", "mistral-7b-v0.3.json")  # the published config.json
H100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 80.0, "gpu_count": 1, "capability": "9.0"}


def estimate(config: dict, gpus: int, capacity_gib: float, capsys) -> dict:
    """`trainscout estimate` of a configuration as lookup gives it (--json), with its exit status."""
    sets = [x for k, v in config.items() for x in ("--set", f"{k}={fmt(v)}")]
    rc = main(["estimate", "--model", MISTRAL, *sets, "--workers", str(gpus), "--gpu-memory", f"{capacity_gib}GiB",
               "--json"])
    return dict(json.loads(capsys.readouterr().out), rc=rc)


def test_lookups_first_answer_is_what_a_search_would_run_on_one_h100_with_128_gib(capsys):
    """The finding: lookup answered ZeRO-2 + optimizer offload first (123 GiB of host memory), which the search on
    that box refused (> 126 GiB less 10 %). Now its first answer fits the GPU by estimate and the host by the
    search's rule. Nothing that keeps fp32 master weights fits one H100 and 128 GiB: its first answer is pure bf16
    weights and states (precision=bf16, a saver that changes the numerics: taken only where no other fits; measured
    on an H100 at 55.4 GiB, estimate 56.8)."""
    atlas = db.load([])
    answer = lookup.lookup(atlas, MISTRAL, gpu="H100", gpus=1, gpu_memory_gib=80.0, host_memory_gib=128.0)
    # the atlas holds session 23's cold search of this model on an H100: its one measured configuration (pure bf16
    # with FP8) failed its quality gate, so lookup predicts too, pure bf16 without the FP8 that failed
    measured = answer["measured"][0]["rows"]
    assert measured[0]["config"]["precision"] == "bf16" and not any(r["best"] for r in measured)
    told = answer["predicted"]["rows"][0]["config"]
    assert told["precision"] == "bf16" and told["fp8"] != "tensorwise", told
    # as for a model never measured: predicted from the other models' rows
    others = dataclasses.replace(atlas, rows=[r for r in atlas.rows if r["record"]["model"] != "mistral-7b-v0.3"])
    first = lookup.predicted(others, lookup.target_of(MISTRAL), "H100", 1, None, lookup.price_table(), 80.0,
                             128.0)["rows"][0]
    assert first["host_memory_gib"] <= 113
    got = estimate(first["config"], first["gpus"], 80.0, capsys)
    assert got["rc"] == 0 and got["fits"] is True and got["predicted_gib"] <= 80.0
    spec = prepare(MISTRAL, first["config"], workers=first["gpus"], hw=dict(H100, gpu_count=first["gpus"]),
                   installed=frozenset({"torchao", "liger_kernel", "flash_attn"}))
    assert memory.host_refusal(spec, 128 * memory.GiB, memory.MARGIN) is None  # the search's own rule
    # pure bf16: the saver added ("[to fit: precision=bf16]"), or as a model measured with it ran (OLMo-2-7B's rows,
    # Llama-3.2-3B's on the H100)
    assert first["gpus"] == 1 and first["config"]["precision"] == "bf16"
    pure = {r["record"]["model"] for r in atlas.rows if r["record"]["config"].get("precision") == "bf16"}
    assert "[to fit: precision=bf16" in first["describe"] or first["from"] in pure, first
    # the offload the finding saw is refused for the host, and says so
    off = prepare(MISTRAL, {"zero_stage": 2, "offload_optimizer": True, "activation_checkpointing": "full",
                            "micro_batch_size": 1}, hw=H100, installed=frozenset())
    assert memory.host_refusal(off, 128 * memory.GiB, memory.MARGIN)
    sets = [x for k, v in off.config.items() if k in ("zero_stage", "offload_optimizer", "activation_checkpointing",
                                                      "micro_batch_size") for x in ("--set", f"{k}={fmt(v)}")]
    assert main(["estimate", "--model", MISTRAL, *sets, "--gpu-memory", "80GiB", "--host-memory", "128GiB",
                 "--json"]) == 1  # estimate says the same with the box's host memory: exit 1, and why
    got = json.loads(capsys.readouterr().out)
    assert got["predicted_gib"] < 80 and got["host_refusal"].startswith("predicted 123.0 GiB of host memory")


def test_on_eight_h200s_lookup_puts_sharding_first_not_offload():
    """The finding: on 8 H200s lookup answered ZeRO-2 with optimizer offload (228 GiB of host memory) where FSDP
    over 8 ranks fits; savers had been tried in a fixed order, offload before sharding."""
    answer = lookup.lookup(db.load([]), MISTRAL, gpu="H200", gpus=8, host_memory_gib=1024.0)
    first = answer["predicted"]["rows"][0]
    c = first["config"]
    assert first["gpus"] == 8
    assert c.get("fsdp", "off") != "off" or c.get("zero_stage") == 3
    assert not c.get("offload_optimizer") and not c.get("offload_params")
    assert all(not r["config"].get("offload_optimizer") for r in answer["predicted"]["rows"])  # none slower wins


def test_offload_costs_step_time_over_pcie_and_the_hosts_memory():
    """The step-time model counts offload: ZeRO-2 + optimizer offload is slower than ZeRO-2 alone by the PCIe and
    host traffic the model states (their bytes) make, and parameter offload slower again."""
    hw = dict(H100, gpu_count=8)
    at = dict(micro_batch_size=4, activation_checkpointing="full")
    plain = prepare(MISTRAL, dict(at, zero_stage=2), workers=8, hw=hw, installed=frozenset())
    opt = prepare(MISTRAL, dict(at, zero_stage=2, offload_optimizer=True), workers=8, hw=hw, installed=frozenset())
    both = prepare(MISTRAL, dict(at, zero_stage=3, offload_optimizer=True, offload_params=True), workers=8, hw=hw,
                   installed=frozenset())
    assert steptime.offload_s(plain) == 0.0
    n = memory.counts(memory.with_config(opt).model_config)["N"]
    expected = (opt.plan.grad_accum * 2 + 2) * n / 8 / steptime.pcie_bps(opt) + n * steptime.CPU_ADAM_BYTES / \
        steptime.HOST_MEMORY_BPS
    assert steptime.offload_s(opt) == pytest.approx(expected)
    # the GPU's optimizer step (steptime.optimizer_s) goes to the host with the states
    assert steptime.optimizer_s(plain) > 0 and steptime.optimizer_s(opt) == 0.0
    assert steptime.step_s(opt) == pytest.approx(steptime.step_s(plain) - steptime.optimizer_s(plain) + expected)
    assert steptime.offload_s(both) > steptime.offload_s(opt)


def test_search_start_point_takes_the_fastest_saver_that_fits(tmp_path):
    """search/start.py's start point on 8 x 80 GiB GPUs: the defaults (DDP) do not fit, and of the savers that do
    (FSDP2, ZeRO with offload, ...) the one predicted fastest is added: sharding, not offload; the note names each
    saver's predicted step."""
    from trainscout.search.service import SearchArgs, fits, space_defaults, validate
    args = SearchArgs(model=MISTRAL, out=str(tmp_path), device="cpu", trials=4, gpus_per_trial=1)
    space, _, hw = validate(args)
    args.gpus_per_trial = 8
    gpu = dict(hw, **dict(H100, gpu_count=8))
    notes = []
    point = fits(args, space, gpu, None, space_defaults(space), notes, host=1024 * memory.GiB)
    assert point.get("fsdp", "off") != "off" and not point.get("offload_optimizer"), notes
    assert "the fastest taken" in notes[0] and "offload_optimizer=true" in notes[0]


def test_estimate_handles_fp8_and_the_fused_linear_loss(capsys):
    """estimate refused them (no GPU capability, no liger-kernel here): it estimates for the GPU box. fp8 keeps a
    third less of the layers' activations, the fused linear loss one chunk of logits."""
    base = {"fsdp": "full_shard", "micro_batch_size": 4, "compile": True}
    plain = estimate(base, 8, 80.0, capsys)
    fp8 = estimate(dict(base, fp8="tensorwise"), 8, 80.0, capsys)
    fused = estimate(dict(base, loss_kernel="fused_linear"), 8, 80.0, capsys)
    assert plain["rc"] == fp8["rc"] == fused["rc"] == 0
    assert fp8["components_gib"]["activations"] < 0.7 * plain["components_gib"]["activations"]
    assert fused["components_gib"]["logits"] < 0.25 * plain["components_gib"]["logits"]
    assert fp8["assumed"]["capability"] == "9.0" and not fp8["assumed"]["gpu_known"]
    assert main(["estimate", "--model", MISTRAL, "--set", "fp8=tensorwise", "--gpu", "A100"]) == 2  # no FP8 there
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fp8" in err and "capability" in err
