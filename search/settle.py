"""Settled by training: where a search's fastest measurement has a one-step verdict that does not call it the same
model (failed, marginal) and it is clearly faster than the fastest that does, the search trains both the way
`verify --quality` does, within a share of its time budget, and stores that verdict, which outranks the step."""
from __future__ import annotations

import time

from trainscout.trial import quality
from trainscout.trial.status import Status

SHARE = 0.25        # of a --time-budget the search keeps for the training comparison once it has a case for one
MARGIN = 0.05       # "clearly faster": above the best that trains the same model by more than this share
STEPS = 200         # each run's optimizer steps where the time allows
MIN_STEPS = 40      # fewer leave the interval too wide to tell a 1 % tolerance apart
RUN_S = 60.0        # a run's fixed cost beside its steps (worker group, compile, warm-up), for the plan
OPEN = (quality.FAILED, quality.MARGINAL)  # one-step verdicts a training comparison settles


def case(store, search: str, margin: float = MARGIN) -> tuple | None:
    """(fastest record, fastest good record) where the search's fastest measurement has an OPEN one-step verdict and
    no training verdict, and runs more than `margin` faster than its fastest that trains the same model; else None."""
    verified, best = store.verified(), {}
    for t in store.trials(search):
        if t["status"] != Status.OK or not t["key"]:
            continue
        rec = store.get(t["key"])
        if rec is None:
            continue
        rec.key = t["key"]
        said = quality.status(rec.metrics, verified.get(t["key"]), rec.config, rec.device)[0]
        group = "open" if said in OPEN and t["key"] not in verified else "good" if said in quality.GOOD else None
        if group and (group not in best or rec.measured.tokens_per_s > best[group].measured.tokens_per_s):
            best[group] = rec
    fast, good = best.get("open"), best.get("good")
    if fast is None or good is None or fast.measured.tokens_per_s <= good.measured.tokens_per_s * (1 + margin):
        return None
    return fast, good


def plan_steps(fast, seconds: float | None) -> tuple[int, str | None]:
    """Steps each run can train in `seconds` (None: the search has no time budget to take a share of), and why there
    are too few (None: enough).
    A run trains one micro-batch per data rank a step (verify --quality's batch); the reference is taken as twice
    the candidate's micro-batch time, a bound for the knobs that change the numerics."""
    if seconds is None:
        return 0, (f"the search has no --time-budget to take a share of: run `trainscout verify OUT --trial "
                   f"{fast.key[:12]} --quality {STEPS}`")
    micro = fast.m.get("micro_batch_s") or fast.m["step_s"]
    steps = min(STEPS, int((seconds - 2 * RUN_S) / (3 * micro))) if seconds > 2 * RUN_S else 0
    if steps < MIN_STEPS:
        return steps, (f"{seconds:.0f} s of the time budget were left, enough for {max(steps, 0)} steps of each run "
                       f"(at least {MIN_STEPS}): give a longer --time-budget, or run `trainscout verify OUT --trial "
                       f"{fast.key[:12]} --quality {STEPS}`")
    return steps, None


def settle(out: str, store, search: str, seconds: float | None, address: str | None = None,
           margin: float = MARGIN) -> dict | None:
    """Train the case's fastest against its reference (analysis.quality.verify_quality, stored with it) in at most
    `seconds`; what was done and why ({"settled": bool, ...}), None where there is no case."""
    got = case(store, search, margin)
    if got is None:
        return None
    fast, good = got
    ahead = fast.measured.tokens_per_s / good.measured.tokens_per_s - 1
    said = quality.status(fast.metrics, None, fast.config, fast.device)[0]
    head = {"key": fast.key, "good_key": good.key, "ahead": ahead, "one_step": said}
    steps, short = plan_steps(fast, seconds)
    if short:
        return head | {"settled": False, "why": short}
    from trainscout.analysis.quality import verify_quality
    t0 = time.monotonic()
    r = verify_quality(store.url, key=fast.key, steps=steps, address=address, folder=out,
                       timeout=None if seconds is None else max(60.0, seconds / 2))
    return head | {"settled": r.get("status") == "ok", "verdict": r["verdict"], "why": r.get("why"),
                   "steps": steps, "seconds": time.monotonic() - t0,
                   "loss": r.get("loss"), "speed_at_equal_loss": r.get("speed_at_equal_loss")}


def line(r: dict) -> str:
    """The summary's line for settle's answer."""
    what = (f"the fastest ({r['key'][:12]}, {r['ahead']:.0%} ahead of the fastest that trains the same model, its "
            f"one step {r['one_step']})")
    if not r["settled"] and "verdict" not in r:
        return f"  not settled by training: {what}: {r['why']}"
    return (f"  settled by training: {what} trained {r['steps']} steps against its reference in {r['seconds']:.0f} s: "
            f"{r['verdict']}" + (f" ({r['why']})" if r.get("why") else ""))


_ASKED: dict[str, tuple[float, bool]] = {}  # search -> (when case() was last asked, its answer)


def due(url: str, search: str, deadline: float | None, reserve: float) -> bool:
    """Whether the search's trials should end now to leave `reserve` seconds of its budget for settle(): inside the
    reserve, and a case exists (asked of the store at most every few seconds)."""
    if deadline is None or not reserve or time.time() < deadline - reserve:
        return False
    at, answer = _ASKED.get(search, (0.0, False))
    if time.monotonic() - at > 5.0:
        from trainscout.store import open_store
        answer = case(open_store(url), search) is not None
        _ASKED[search] = (time.monotonic(), answer)
    return answer
