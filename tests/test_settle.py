"""A search's fastest measurement whose one-step verdict is open (failed, marginal) and that runs clearly ahead of its
fastest good one is settled by training both (search/settle.py), within a share of the time budget; a comparison
whose loss interval straddles the tolerance says inconclusive (analysis/quality.compare)."""
import pytest

from trainscout.analysis.quality import TOLERANCE, compare
from trainscout.search import settle
from trainscout.store.store import Store
from trainscout.trial import execute, prepare, quality
from trainscout.trial.status import Status

pytestmark = pytest.mark.timeout(600)


def _curve(level: float, n: int = 50, wobble: float = 0.0) -> list[float]:
    return [level + (wobble if i % 2 else -wobble) for i in range(n)]


def test_a_comparison_that_cannot_tell_says_inconclusive():
    ref = _curve(3.0)
    assert compare([_curve(3.0)], [ref])["verdict"] == quality.VERIFIED
    assert compare([_curve(3.0 * (1 + 3 * TOLERANCE))], [ref])["verdict"] == quality.FAILED
    # a mean just above the tolerance with a window whose blocks swing far around it
    noisy = [3.0 * (1 + TOLERANCE * 1.2) + (0.3 if (i // 1) % 2 else -0.3) for i in range(50)]
    r = compare([noisy], [ref])
    assert r["verdict"] == quality.INCONCLUSIVE and "too short or too noisy" in r["why"]
    lo, hi = r["loss"]["ci95"]
    assert lo <= TOLERANCE < hi
    assert quality.status({}, {"verdict": quality.INCONCLUSIVE, "steps": 10})[0] == quality.INCONCLUSIVE


def _measured(store: Store, search: str, trial: str, settings: dict, gate: str | None = None, speedup: float = 1.0):
    """A real CPU trial of tiny stored as the search's; its one-step verdict set to `gate` and its tokens/s scaled by
    `speedup` where given (the states settle decides on; the trial and the training after it are real)."""
    rec = execute(prepare("tiny", dict({"micro_batch_size": 4, "compile": False}, **settings), device="cpu",
                          workers=1, steps=2, warmup=1, global_batch=8, measure_accum=2), timeout=300)
    assert rec.ok, rec.error
    if gate:
        rec.metrics["quality"] = dict(rec.metrics["quality"], gate=gate)
    rec.metrics["tokens_per_s"] *= speedup
    key = f"k-{trial}"
    store.add_measurement(key, rec)
    store.add_trial(search, trial, key, Status.OK, False, rec.metrics["tokens_per_s"], rec.config)
    return key


def test_the_fastest_with_an_open_verdict_is_settled_by_training(tmp_path, ray_local, monkeypatch, quality_tokens):
    out = tmp_path / "s"
    quality_tokens(out)  # the corpus' tokens the training reads, made once for the session
    store = Store(f"sqlite:///{out / 'results.db'}")
    good = _measured(store, "s", "t0", {})  # bf16-mixed: changes nothing, the same model
    fast = _measured(store, "s", "t1", {"precision": "fp32"}, gate=quality.FAILED, speedup=1.5)
    got = settle.case(store, "s")
    assert got and got[0].key == fast and got[1].key == good
    assert settle.case(store, "s", margin=100.0) is None  # not clearly faster at that margin

    # too little of the budget left, or none given: said, nothing trained
    short = settle.settle(str(out), store, "s", seconds=30.0)
    assert short["settled"] is False and "--time-budget" in short["why"] and "not settled" in settle.line(short)
    assert settle.settle(str(out), store, "s", seconds=None)["settled"] is False
    assert store.quality(fast, "verify") is None

    monkeypatch.setattr(settle, "STEPS", settle.MIN_STEPS)  # the shortest comparison settle runs
    r = settle.settle(str(out), store, "s", seconds=900.0)
    assert r["settled"] and r["steps"] == settle.MIN_STEPS and r["one_step"] == quality.FAILED
    assert r["verdict"] in (quality.VERIFIED, quality.FAILED, quality.INCONCLUSIVE)
    stored = store.quality(fast, "verify")
    assert stored["verdict"] == r["verdict"] and stored["steps"] == settle.MIN_STEPS
    # the training verdict outranks the step's: the status the summary and the export read
    rec = store.get(fast)
    assert quality.status(rec.metrics, stored, rec.config, rec.device)[0] == r["verdict"]
    assert (out / f"verify-quality-{fast[:12]}.json").exists()
    assert settle.case(store, "s") is None  # settled once
    assert "settled by training" in settle.line(r)
