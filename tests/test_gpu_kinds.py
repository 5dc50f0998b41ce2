"""GPU kinds by exact identity (trial/gpus.py): a GPU name as torch, nvidia-smi or a user writes it is one known
kind, its variants (SXM, PCIe, NVL, memory sizes) kinds of their own, or no kind; lookup and estimate answer for
the kind asked, never another GPU sharing a substring of its name, and refuse a name that is no kind. The shipped
atlas (H200 and H100 SXM measurements), no GPU."""
from __future__ import annotations

import json

import pytest

from trainscout.cli.main import main
from trainscout.spaces import ConfigError
from trainscout.predictor import steptime
from trainscout.trial import gpus


@pytest.mark.parametrize("name, kind", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("H100", "H100"), ("h100-sxm", "H100"), ("H100 SXM5 80GB", "H100"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("h100_pcie", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"), ("H200 SXM 141GB", "H200"), ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA H20", "H20"), ("h20", "H20"), ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA RTX A6000", "A6000"), ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla V100-SXM2-16GB", "V100 16GB"), ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
])
def test_a_reported_or_typed_name_is_its_own_kind(name, kind):
    assert gpus.gpu_kind(name) == kind


@pytest.mark.parametrize("name", [
    "T4", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a MIG slice is not its GPU
    "H100 40GB", "NVIDIA H800 PCIe", "Quadro RTX 6000", "NVIDIA H20 141GB", "H100 PCIe NVL", "GPU", "", None,
])
def test_a_name_that_is_no_kind_is_none_not_the_kind_it_contains(name):
    assert gpus.gpu_kind(name) is None and gpus.gpu_peak_tflops(name) is None and gpus.gpu_facts(name) is None


def test_every_kind_is_reached_by_its_parts_alone_and_has_datasheet_figures():
    """Contract over the table: each kind's model word with each form and memory size it takes (or none, where it
    is the kind a bare name means) is that kind and no other; its figures are positive and sourced."""
    assert len(gpus.BY_NAME) == len(gpus.KINDS)
    for k in gpus.KINDS:
        assert gpus.gpu_kind(k.name) == k.name
        forms = list(k.forms) + ([None] if k.bare_form else [])
        sizes = list(k.memory_gb) + ([None] if k.bare_memory else [])
        for model in k.models:
            for form in forms:
                for size in sizes:
                    name = " ".join(x for x in ("NVIDIA", model, form, size and f"{size}GB") if x)
                    assert gpus.gpu_kind(name) == k.name, name
        assert k.bf16_tflops > 0 and k.memory_gib > 0 and k.hbm_tbps > 0 and k.source
        assert steptime.GPU_HBM_TBPS[k.name] == k.hbm_tbps


def test_the_variants_carry_their_own_figures():
    assert gpus.gpu_peak_tflops("NVIDIA H100 PCIe") == 756.0 and gpus.gpu_peak_tflops("NVIDIA H100 NVL") == 835.0
    assert gpus.gpu_peak_tflops("H20") == 148.0 < gpus.gpu_peak_tflops("NVIDIA H200")
    assert steptime._lookup(steptime.GPU_HBM_TBPS, "NVIDIA H100 PCIe", None) == 2.0
    assert steptime._lookup(steptime.GPU_HBM_TBPS, "NVIDIA H100 80GB HBM3", None) == 3.35
    assert gpus.gpu_facts("NVIDIA A100-SXM4-40GB")[0] < gpus.gpu_facts("NVIDIA A100-SXM4-80GB")[0]


@pytest.mark.parametrize("gpu", ["H20", "H100 PCIe"])
def test_lookup_of_a_variant_never_measured_is_its_own_prediction_not_a_measured_kinds_rows(capsys, gpu):
    """lookup --gpu H20 answered with the H200's measured rows, --gpu 'H100 PCIe' with the H100 SXM's: now neither
    kind's rows answer; the prediction is for the kind asked, at its own datasheet peak."""
    assert main(["lookup", "--model", "pythia-1b", "--gpu", gpu, "--gpus", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["measured"] == []
    rows = got["predicted"]["rows"]
    assert rows and all(r["gpu"] == gpu and r["status"] == "predicted" for r in rows)
    assert any(f"{gpu} was never measured" in n for n in got["predicted"]["notes"])
    from trainscout.predictor import flops
    from trainscout.trial.models import resolve_model
    r = rows[0]
    fpt = flops.count(resolve_model("pythia-1b").config).per_token(r["tokens_per_step"] // r["global_batch"])
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * fpt / (gpus.gpu_peak_tflops(gpu) * 1e12))  # its own peak


def test_lookup_by_a_reported_name_answers_with_that_kinds_measurements(capsys):
    assert main(["lookup", "--model", "pythia-1b", "--gpu", "NVIDIA H100 80GB HBM3", "--gpus", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["measured"] and {g["gpu"] for g in got["measured"]} == {"H100"}


@pytest.mark.parametrize("gpu", ["T4", "H100 MIG 1g.10gb", "H100 40GB"])
def test_lookup_of_a_name_that_is_no_kind_is_refused_naming_the_known_kinds(capsys, gpu):
    assert main(["lookup", "--model", "pythia-1b", "--gpu", gpu]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"--gpu {gpu}: not known as a GPU kind" in err and "H100 PCIe" in err and "H20" in err


def test_a_measured_gpu_that_is_no_kind_is_asked_for_by_its_exact_name_only():
    measured = ("NVIDIA GeForce RTX 5090",)
    assert gpus.asked_kind("nvidia geforce rtx 5090", "--gpu", measured) == "NVIDIA GeForce RTX 5090"
    with pytest.raises(ConfigError) as e:
        gpus.asked_kind("RTX 50", "--gpu", measured)
    assert e.value.field == "--gpu" and "NVIDIA GeForce RTX 5090" in str(e.value)


def test_estimate_takes_a_variants_own_facts_and_refuses_a_name_that_is_no_kind(capsys):
    assert main(["estimate", "--model", "pythia-160m", "--gpu", "H100 NVL", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["assumed"]["gpu_known"] is True and got["assumed"]["capability"] == "9.0"
    assert main(["estimate", "--model", "pythia-160m", "--gpu", "H100 PCIe NVL"]) == 2
    assert "--gpu H100 PCIe NVL: not known as a GPU kind" in capsys.readouterr().err
