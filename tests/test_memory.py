"""The memory model: its terms move the way the engines hold memory, its calibration recovers a known linear
relation, and `trainscout estimate` answers without a GPU (exit 1 when it does not fit, 2 on bad input)."""
import json

import pytest

from trainscout.cli.main import main
from trainscout.trial import memory, prepare

HW = {"device": "cuda", "gpu_count": 8, "gpu": "NVIDIA H200"}


def spec(settings, workers=1, model="pythia-410m"):
    return prepare(model, settings, workers=workers, hw=dict(HW, gpu_count=workers))


def states(c):
    return c["weights"] + c["gradients"] + c["optimizer"] + c["buffers"]


def test_terms_follow_the_engines():
    mb = {"micro_batch_size": 4}
    plain, z1, z3 = (memory.components(spec(dict(mb, **s), workers=4))
                     for s in ({}, {"zero_stage": 1}, {"zero_stage": 3}))
    assert states(z3) < states(z1) < states(plain)
    off = memory.components(spec(dict(mb, zero_stage=2, offload_optimizer=True), workers=4))
    assert off["optimizer"] == 0 and states(off) < states(z1)
    fsdp4 = memory.components(spec(dict(mb, fsdp="full_shard"), workers=4))
    fsdp1 = memory.components(spec(dict(mb, fsdp="full_shard")))
    assert states(fsdp4) < states(fsdp1)
    none, full, every2 = (memory.components(spec(dict(mb, activation_checkpointing=a)))
                          for a in ("none", "full", 2))
    assert full["activations"] < every2["activations"] < none["activations"]
    big = memory.components(spec({"micro_batch_size": 8}))
    assert big["activations"] == pytest.approx(2 * none["activations"]) and big["logits"] == 2 * none["logits"]
    fused = memory.components(spec({"micro_batch_size": 4, "loss_kernel": "compiled"}))  # no fp32 copy of the logits
    assert fused["logits"] == pytest.approx(none["logits"] / 5) and fused["activations"] == none["activations"]
    pp = {"micro_batch_size": 4, "pipeline_stages": 2, "pipeline_microbatches": 8}
    gpipe = memory.components(spec(dict(pp, pipeline_schedule="gpipe"), workers=2))
    one_f1b = memory.components(spec(dict(pp, pipeline_schedule="1f1b"), workers=2))
    assert one_f1b["activations"] < gpipe["activations"] and states(one_f1b) < states(plain) * 1.01


def test_calibration_recovers_a_linear_relation():
    settings = [{"micro_batch_size": m, "zero_stage": z, "activation_checkpointing": a}
                for m in (2, 4, 8) for z in (0, 1) for a in ("none", "full")]
    specs = [spec(s, workers=2) for s in settings]
    truth = {"a": 1.1, "b": 0.8, "c": 2.0 * memory.GiB}
    pairs = [(sp, memory.predict(sp, truth)) for sp in specs]
    fit = memory.fit(pairs)
    assert fit["a"] == pytest.approx(1.1, rel=1e-3) and fit["b"] == pytest.approx(0.8, rel=1e-3)
    assert fit["c"] == pytest.approx(truth["c"], rel=1e-3) and fit["n"] == len(pairs)
    assert memory.fit(pairs[:2]) is None  # too few: the analytic sum is used


def test_estimate_cli(capsys):
    assert main(["estimate", "--model", "pythia-1b", "--set", "micro_batch_size=8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["predicted_gib"] > sum(r["components_gib"].values())  # + the workspace allowance
    assert main(["estimate", "--model", "pythia-1b", "--set", "micro_batch_size=128", "--gpu-memory", "80GiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["estimate", "--model", "pythia-160m", "--gpu-memory", "80GiB"]) == 0
    for bad, field in ((["--gpu-memory", "lots"], "--gpu-memory"), (["--set", "zero_stage=4"], "zero_stage"),
                       (["--set", "pipeline_stages=2"], "pipeline_stages")):
        assert main(["estimate", "--model", "pythia-160m", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert field in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * 2**30), ("141GB", 141e9), ("512 MiB", 512 * 2**20)])
def test_sizes(text, expected):
    assert memory.parse_size(text) == expected


def test_host_memory_is_predicted_and_refuses_what_the_host_cannot_hold():
    """The host term (issue 18): ZeRO offload keeps the optimizer on the host, a CPU trial keeps everything there.
    The Pythia-6.9B ZeRO-2 + optimizer offload trial that was killed for host memory on the H200 box (125 GB) is
    refused before launch; the same model without offload, and a tiny CPU trial, are not."""
    from trainscout.trial import memory, prepare
    hw = {"device": "cuda", "gpu_count": 1, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.7, "capability": "9.0"}
    offload = prepare("pythia-6.9b", {"zero_stage": 2, "offload_optimizer": True, "micro_batch_size": 8,
                                      "activation_checkpointing": "full"}, workers=1, hw=hw)
    plain = prepare("pythia-6.9b", {"activation_checkpointing": "full", "micro_batch_size": 4}, workers=1, hw=hw)
    comp = memory.host_peak(offload)
    assert comp["offload"] > comp["build"] > 0 and "offload" not in memory.host_peak(plain)
    why = memory.host_refusal(offload, 125e9)
    assert why and "host memory" in why and "offload" in why
    assert memory.host_refusal(plain, 125e9) is None
    cpu_big = prepare("pythia-14m", {"micro_batch_size": 128}, device="cpu", workers=2)  # the Pythia recipe on a CPU
    assert memory.host_refusal(cpu_big, 24e9)
    assert memory.host_refusal(prepare("tiny", {}, device="cpu", workers=2), 24e9) is None
