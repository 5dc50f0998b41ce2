"""One memory rule (predictor.memory.refusal) for every caller that decides whether a configuration fits: the probe's
candidates (trial/probe.candidates), what a search that measured nothing proposes (search/nearest.nearest_fit) and
estimate's host verdict (cli/measure). No GPU: the hardware dicts are mocks of an H100 box
(named so); the models, the knobs' rules and the memory model are real."""
import json

import pytest

from trainscout.cli.main import main
from trainscout.spaces import all_knobs
from trainscout.predictor import memory
from trainscout.trial import prepare
from trainscout.predictor.memory import FIT_SHARE

# a mock of one H100 on a 32 GiB host (no GPU here): the hardware a trial is prepared for
H100 = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3 (mock)", "gpu_memory_gib": 79.2, "gpu_count": 1,
        "capability": "9.0", "cpu": "x86_64", "cpu_count": 16, "host_memory_gib": 32.0}
OFFLOAD_MAX = {"micro_batch_size": "max", "activation_offload": "on", "compile": False}


def _at(spec, mbs: int):
    """spec at a fixed micro-batch (what a search launches as micro_batch_size=mbs)."""
    return spec.replace(plan=spec.plan.replace(micro_batch_size=mbs, micro_batch_probe=False))


def test_the_probes_candidates_start_where_the_search_rule_passes_the_host_too():
    """Activation offload keeps each micro-batch's saved tensors in host memory. The probe drew its candidates by
    the GPU's line alone: Pythia-410M's micro_batch_size=max on an H100 with 32 GiB of host memory started at
    micro-batch 64 (81.6 GiB of the GPU, within its +10 %), which needs 116 GiB of host memory; the search's rule
    refuses every size above 8 (16 needs 30.6 GiB > 32 less 10 %). Now the candidates start where memory.refusal
    passes the size as a fixed micro-batch."""
    spec = prepare("pythia-410m", OFFLOAD_MAX, hw=H100)
    gpu, host = memory.gpu_capacity(H100), memory.host_capacity(H100)
    sizes = [d for d in range(spec.plan.micro_batch_size, 0, -1) if 1024 % d == 0]  # the per-rank batch's divisors
    old_first = next(m for m in sizes if memory.predict(_at(spec, m)) <= gpu * (1 + memory.MARGIN))
    assert old_first == 64 and memory.refusal(_at(spec, 64), gpu, host) is not None  # the old line let it through
    ruled = [m for m in sizes if memory.refusal(_at(spec, m), gpu, host) is None]
    assert [c["mbs"] for c in spec.probe] == [m for m in sizes if m <= ruled[0]] and ruled[0] == 8
    why, _ = memory.refusal(_at(spec, 16), gpu, host)
    assert why.startswith("predicted 30.6 GiB of host memory for the trial's 1 rank(s) > 32 GiB less 10%")
    # the trial itself, judged at micro-batch 1 (the least the probe tries), is launched
    assert memory.refusal(spec, gpu, host) is None


def test_on_a_large_host_the_probes_candidates_are_the_gpu_lines_as_before():
    """Where the host holds every size, the candidates are those the GPU's line (+10 %) does not rule out, as they
    were: Pythia-1B in bf16-mixed, no offload, on a mock H100 with 2 TiB of host memory."""
    hw = dict(H100, host_memory_gib=2048.0)
    spec = prepare("pythia-1b", {"micro_batch_size": "max", "precision": "bf16-mixed", "compile": False}, hw=hw)
    gpu = memory.gpu_capacity(hw)
    sizes = [d for d in range(spec.plan.micro_batch_size, 0, -1) if 1024 % d == 0]
    gpu_line = [m for m in sizes if memory.predict(_at(spec, m)) <= gpu * (1 + memory.MARGIN)]
    ruled = [m for m in sizes if memory.refusal(_at(spec, m), gpu, memory.host_capacity(hw)) is None]
    assert gpu_line == ruled and 1 < len(ruled) < len(sizes)  # some sizes refused, some not
    assert [c["mbs"] for c in spec.probe] == [m for m in sizes if m <= ruled[0]]


def _nearest(calibration_gib: float):
    """nearest_fit for the tiny model on a mock H100 (80 GiB, a 1 TiB host) whose calibration predicts every
    configuration at calibration_gib per rank (a = b = 0: the constant c), and the defaults' spec."""
    from trainscout.search.nearest import nearest_fit
    from trainscout.search.service import SearchArgs, validate
    from trainscout.search.start import space_defaults, spec_at
    args = SearchArgs(model="tiny", out="/tmp/unused", device="cpu", time_budget_s=300)
    space, _, hw = validate(args)
    h100 = dict(hw, device="cuda", gpu_memory_gib=80.0, gpu="NVIDIA H100 80GB HBM3 (mock)", gpu_count=1,
                capability="9.0")
    cal = {"a": 0.0, "b": 0.0, "c": calibration_gib * memory.GiB, "n": 3}
    host = 1024 * memory.GiB
    spec = spec_at(args, space, h100, space_defaults(space), micro_batch_size=1)
    return nearest_fit(args, space, h100, cal, host, []), spec, memory.gpu_capacity(h100), host, cal


def test_nothing_fits_says_so_where_the_search_rule_refuses_by_a_hair():
    """nearest_fit judged by its own share of the lines, rounded to 3 decimals: every configuration predicted at
    68.02 GiB on an 80 GiB GPU (a start point's line: 68.0) was 1.0003 -> 1.000 "of what fits", so it answered that
    the closest fits (None) while the search's rule refuses it. Now it asks memory.refusal, and agrees with it on
    either side of the line."""
    fit, spec, gpu, host, cal = _nearest(68.02)
    why, extra = memory.refusal(spec, gpu, host, cal, FIT_SHARE)
    assert why == "predicted 68.0 GiB per rank > 85% of 80 GiB" and extra["predicted_gib"] == 68.02
    assert fit is not None and fit["closest"]["gpu_gib"] == 68.02 and fit["closest"]["over"] == 1.0
    assert fit["closest"]["source"] == "the start point's defaults"
    ways = {w["how"]: w for w in fit["would_fit"]}
    assert "host" not in ways and ways["knob"]["changes"] is None  # the same prediction everywhere: nothing fits
    fit, spec, gpu, host, cal = _nearest(67.98)
    assert memory.refusal(spec, gpu, host, cal, FIT_SHARE) is None and fit is None


def test_a_trial_over_more_ranks_than_one_host_holds_is_judged_on_its_busiest_host():
    """nearest_fit's question that the trials are not asked: a trial proposed on 16 GPUs spans hosts of 8
    (NODE_GPUS), each holding its share of the host memory; the rule takes it as per_host (the whole trial on one
    host where it is not given, as a search's trials are judged)."""
    from trainscout.search.nearest import NODE_GPUS
    spec = prepare("tiny", {}, workers=16, hw=dict(H100, gpu_count=16))
    need = memory.host_need(memory.host_peak(spec))
    host = 0.75 * need / (1 - memory.MARGIN)  # over for the whole trial, within for the 8 ranks of one host
    whole = memory.refusal(spec, None, host)
    assert whole is not None and "for the trial's 16 rank(s)" in whole[0]
    assert memory.refusal(spec, None, host, per_host=NODE_GPUS) is None
    judged = memory.judge(spec, None, host, per_host=NODE_GPUS)
    assert judged["host_b"] == pytest.approx(need / 2) and judged["host"] is None and judged["gpu_b"] is None
    why = memory.host_refusal(spec, 0.4 * need / (1 - memory.MARGIN), per_host=NODE_GPUS)
    assert why.startswith(f"predicted {need / 2 / memory.GiB:.1f} GiB of host memory for 8 of the trial's 16 ranks "
                          "on each host") and why.endswith("for the whole trial)")


def _estimate(capsys, *sets: str) -> tuple[int, dict]:
    rc = main(["estimate", "--model", "pythia-410m", *[x for s in sets for x in ("--set", s)], "--host-memory",
               "32GiB", "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _estimate_spec(settings: dict):
    """The spec `trainscout estimate` builds (its GPU box: a Hopper's capability, every knob's packages)."""
    installed = frozenset(p for k in all_knobs() for p in k.runtime.packages)
    hw = {"device": "cuda", "gpu_count": 1, "gpu": None, "capability": "9.0"}
    return prepare("pythia-410m", settings, hw=hw, installed=installed)


def test_estimates_host_verdict_is_the_search_rule_for_a_probe_too(capsys):
    """estimate judged the host at the micro-batch it shows, for micro_batch_size=max the probe's largest candidate
    (128: 231 GiB of host memory under activation offload): "does NOT fit", exit 1, where a search launches the
    trial (judged at micro-batch 1) and its probe steps down to what fits. Now it is memory.refusal's verdict,
    exit 0 here (no --gpu-memory); a fixed micro-batch is judged as set, as before."""
    host = 32 * memory.GiB
    rc, got = _estimate(capsys, "micro_batch_size=max", "activation_offload=on", "compile=false")
    spec = _estimate_spec(OFFLOAD_MAX)
    assert memory.refusal(spec, None, host) is None and got["host_refusal"] is None and rc == 0
    assert memory.host_refusal(spec, host, memory.MARGIN) is not None  # the old verdict, at micro-batch 128
    assert got["host_need_gib"] > 200  # what it shows is still the largest candidate's
    rc, got = _estimate(capsys, "micro_batch_size=16", "activation_offload=on", "compile=false")
    why, _ = memory.refusal(_estimate_spec(dict(OFFLOAD_MAX, micro_batch_size=16)), None, host)
    assert got["host_refusal"] == why and rc == 1 and got["fits"] is False
