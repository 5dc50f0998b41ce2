"""One Tune trial of a search: measure (or look up) one configuration and report it to Tune.

It runs in a Ray actor that Tune reuses for the next trial (its ranks run in a warm worker group of the driver's
pool, trial.pool; a trial stopped early has its group killed), reports rank 0's throughput after every timed step
(ASHA's signal), stores the record the moment it exists, and reports infeasible outcomes (oom, invalid) as a value
of 0 so the sampler learns to avoid them (an exception would be a FAIL, which TPE ignores).
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError
from trainscout.store import StoreLost, claims, guard, measurement_key, open_store
from trainscout.trial import execute, hardware, prepare
from trainscout.trial.contention import contended
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.runner import Cancelled
from trainscout.trial.status import NOT_COUNTED, NOT_MEASURED, Status, served

from . import cluster

if TYPE_CHECKING:
    from trainscout.trial.records import Record, TrialSpec

METRIC = TOKENS_PER_S
# outcomes decided before a trial runs (refused by the rules, predicted not to fit): they cost no device time and do
# not count toward --trials (an unscheduled trial waited its time limit: it counts); FREE_RUN of them in a row end
# the search's drawing (search/study.py)
FREE = (Status.INVALID, Status.PRUNED)
FREE_RUN = 30
TRIAL_ACTOR = {"CPU": cluster.TRIAL_CPU}  # what a search's Tune trial actor holds beside its ranks (search/cluster.py)


def tune_trial(config: dict, base: dict) -> None:
    """One Tune trial: measure (or look up) one configuration and report it. A store that failed (deleted, full,
    read-only) is reported as `store_failed`, which stops the search (its driver says what was kept)."""
    from ray import tune
    try:
        _measure(config, base)
    except Exception as e:  # only a storage failure is caught; anything else is Tune's error
        why = guard.failure_of(e)
        if why is None:
            raise
        tune.report({METRIC: 0.0, "status": str(Status.CRASH), "store_failed": why, "cached": False})


def trial_spec(settings: dict, base: dict, fault: str | None = None):
    """The prepared trial of a search's settings (ConfigError where the rules refuse them)."""
    return prepare(base["model"], settings, workers=base["workers"], steps=base["steps"], warmup=base["warmup"],
                   hw=base["hardware"], seed=base["seed"], fault=fault, **base["recipe"])


def launch_refusal(spec, base: dict) -> tuple[str, dict] | None:
    """Why the memory model refuses to launch this trial, with what the record keeps of the prediction; None: launch
    it. The search's one rule (predictor.memory.refusal: its host or GPU need predicted over the capacity and the
    margin; a micro_batch_size=max probe judged at micro-batch 1), on the capacities the driver hands the trials
    (base["host"], base["memory"])."""
    from trainscout.predictor import memory
    host, mem = base.get("host") or {}, base.get("memory") or {}
    return memory.refusal(spec, mem.get("capacity"), host.get("capacity"), mem.get("calibration"))


def capacities(hw: dict, calibration: dict | None = None) -> dict:
    """What a search hands its trials to judge them by (launch_refusal): the host's memory, and the GPU's with the
    memory model's calibration where the trials have one."""
    from trainscout.predictor import memory
    out = {"host": {"capacity": memory.host_capacity(hw)}}
    if (gpu := memory.gpu_capacity(hw)) is not None:
        out["memory"] = {"capacity": gpu, "calibration": calibration}
    return out


def before_run(settings: dict, base: dict) -> tuple[str, str | None]:
    """(status, why) a trial of these settings gets before it runs: invalid where the rules refuse them, pruned
    where the memory model predicts them over the GPU's or the host's memory (launch_refusal), else ok: it would run."""
    try:
        spec = trial_spec(settings, base)
    except ConfigError as e:
        return str(Status.INVALID), str(e)
    why = launch_refusal(spec, base)
    return (str(Status.PRUNED), why[0]) if why else (str(Status.OK), None)


@dataclass
class _Answer:
    """What a trial reports of its configuration: the record, whether it was served (the store's, or another
    search's while this trial waited: note), under which key, for which spec."""
    record: Record
    cached: bool
    key: str
    spec: TrialSpec
    note: str | None = None


def _measure(config: dict, base: dict) -> None:
    """A search's trial of config: refused before it runs, answered from the store or from another search measuring
    it now, or run in a worker group and stored; reported to Tune in each case."""
    from ray import tune
    ident = base.get("store_identity") if base.get("driver_host") == socket.gethostname() else None
    store = open_store(base["storage"], expect=ident)
    trial_id = tune.get_context().get_trial_id()
    settings = {k: v for k, v in config.items() if k in base["knob_names"]}
    spec = _launchable(store, base, trial_id, settings)
    if spec is None:
        return
    # where a row of an older key scheme holds this configuration, its key (store.Store.stored_key): served from it,
    # and a new measurement of it is that key's sample
    key = store.stored_key(measurement_key(spec, base["hardware"], hardware.versions()))
    record = store.get(key)
    # never a host_oom, nor a measurement other trials shared the device of (trial.status)
    cached = record is not None and served(record.status, record.error, record.metrics)
    if not cached and (value := stopped_before(store, base["search"], settings)) is not None:
        # ASHA ended this configuration earlier in the search: TPE proposed it again; it gets the same answer
        store.add_trial(base["search"], trial_id, None, Status.STOPPED, True, value, settings)
        tune.report({METRIC: value, "status": str(Status.STOPPED), "cached": True})
        return
    # the gate's verdict where this configuration changes the numerics and an earlier trial stepped the same change
    gate, known = known_gate(store, spec) if not cached else (None, None)
    if why := failed_gate(spec, known):  # trains another model: never the best, so not run
        store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0, spec.config, error=why)
        tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "error": why,
                     "quality": known["gate"]})
        return
    answer = _Answer(record, cached, key, spec)
    if not cached:
        answer = _claimed_or_run(store, base, trial_id, answer, (gate, known), ident)
        if answer is None:
            return
    _report(store, base, trial_id, answer)


def _launchable(store, base: dict, trial_id: str, settings: dict):
    """The trial's spec (trial_spec, with the fault the schedule gives its number), or None where it is refused
    before it runs (the knobs' rules, the memory model, its time limit): recorded and reported then."""
    from ray import tune
    fault = None
    if base.get("faults"):  # tests: the fault schedule, by the trial's number in the search
        fault = base["faults"].get(base["offset"] + int(tune.get_context().get_trial_name().split("_")[1]))
    from trainscout.predictor import model_tree
    # the driver's: neither transformers imported here to read the model's sizes nor a model built to predict
    model_tree.learn(base.get("facts"))
    try:
        spec = trial_spec(settings, base, fault)
    except ConfigError as e:
        store.add_trial(base["search"], trial_id, None, Status.INVALID, False, 0.0, settings, error=str(e))
        tune.report({METRIC: 0.0, "status": str(Status.INVALID), "error": str(e), "cached": False})
        return None
    why = launch_refusal(spec, base)  # predicted over the host's or the GPU's memory: not launched
    if why:
        error, extra = why
        store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0, dict(spec.config, **extra),
                        error=error)
        tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "error": error, **extra})
        return None
    if why := _too_long(spec, base, store.trials(base["search"])):  # measured here to take longer than its limit
        store.add_trial(base["search"], trial_id, None, Status.PRUNED, False, 0.0, spec.config, error=why)
        tune.report({METRIC: 0.0, "status": str(Status.PRUNED), "cached": False, "error": why})
        return None
    return spec


def _claimed_or_run(store, base: dict, trial_id: str, answer: _Answer, gate: tuple, ident) -> _Answer | None:
    """A configuration the store does not answer: served where another search measures it now (store.claims: this
    trial waits for it), else run under the claim and stored, its gate's verdict kept (gate: known_gate's key and
    verdict). None where the trial has reported already (ASHA stopped it, or nothing was measured)."""
    claim = store.claim(answer.key, {"search": base["search"], "trial": trial_id})
    if claim.served is not None:
        note = f"measured by another search ({claims.describe(claim.other or {})}) while this trial waited " \
               f"{claim.waited_s:.0f} s"
        return _Answer(claim.served, True, answer.key, answer.spec, note)
    if why := guard.lost(store.path, ident):  # no device time for a store that is gone
        raise StoreLost(f"the results store {why} while the search ran")
    try:  # the claim is released whatever happens here (a held one would keep other searches waiting)
        answer = _run_and_store(store, base, trial_id, answer, gate[1])
    finally:
        claim.release()
    if answer is not None:
        verdict = answer.record.m.get("quality") or {}
        if gate[0] and verdict.get("gate") and not verdict.get("cached"):
            store.put_quality(gate[0], "gate", verdict)
    return answer


def _run_and_store(store, base: dict, trial_id: str, answer: _Answer, known: dict | None) -> _Answer | None:
    """Run the trial (its quality gate served where known, or held to the search's bar) and store its measurement;
    None where ASHA stopped it or nothing was measured (recorded and reported then)."""
    from ray import tune
    spec, key = answer.spec, answer.key
    if known is not None:  # one gate step per change, per store: its verdict served
        spec = spec.replace(quality=dict(spec.quality, known=dict(known, cached=True)))
    elif spec.quality and (bar := rank_bar(store, base["search"])):  # its gate only where it can rank
        spec = spec.replace(quality=dict(spec.quality, rank_bar=bar))
    record = _run_trial(spec, base, trial_id)
    if record is None:  # ASHA stopped it: the driver recorded it as stopped
        return None
    if record.status in NOT_MEASURED:  # nothing ran, or the host or the cluster lost it: no measurement
        # (never served from the store), and the sampler is told nothing
        store.add_trial(base["search"], trial_id, None, record.status, False, 0.0, spec.config, error=record.error)
        tune.report({METRIC: 0.0, "status": str(record.status), "cached": False, "error": record.error})
        return None
    if (record.placement or {}).get("split"):  # ranks on several nodes: not the one-node measurement's key
        key = store.stored_key(measurement_key(spec, base["hardware"], hardware.versions(), placement=record.placement))
    # written while the claim is held, so that a search waiting on it is served this record (released
    # first, the waiter found no record and measured the key again: 2026-12-03, test_shared_store)
    store.add_measurement(key, record)  # a second measurement of a key is kept beside the first
    return _Answer(record, False, key, spec)


def _report(store, base: dict, trial_id: str, answer: _Answer) -> None:
    """Record the trial's row and report its outcome to Tune (its quality status where a knob changes the numerics:
    a failed one sets no bar, searcher.Gated)."""
    from ray import tune
    record, key, cached = answer.record, answer.key, answer.cached
    m = record.m
    value = m.get(METRIC, 0.0) if record.ok else 0.0
    store.add_trial(base["search"], trial_id, key, record.status, cached, value, answer.spec.config, error=record.error)
    graded = None
    if record.ok and m.get("quality"):
        from trainscout.trial import quality
        graded = quality.status(m, store.quality(key, "verify"))[0]
    tune.report({METRIC: value, "status": str(record.status), "cached": cached, "error": record.error,
                 "quality": graded,
                 "projected_days": m.get("projected_days"), "mfu": m.get("mfu"), "key": key,
                 "peak_memory_gib": m.get("peak_memory_gib"), "wall_s": 0.0 if cached else (record.wall_s or 0.0),
                 "note": answer.note, "shared": contended(record)})


def _too_long(spec, base: dict, rows: list[dict]) -> str | None:
    """Why a trial is not launched: its warm-up and timed steps' tokens at the median tokens/s per rank this search
    measured would take longer than the trial's time limit (build and compile not counted: it errs towards running);
    None where they would not, or where nothing ran ok yet. A probed micro-batch (max) is judged at its first
    candidate, the largest."""
    from statistics import median

    from trainscout.trial.runner import DEFAULT_TIMEOUT
    rates = [t[TOKENS_PER_S] / base["workers"] for t in rows
             if t["status"] == Status.OK and t[TOKENS_PER_S] and not t["cached"]]  # measured here, not served
    if not rates:
        return None
    tokens = (spec.warmup_steps + spec.timed_steps) * spec.measured_accum * spec.micro_batch * \
        spec.recipe["seq_len"]
    limit = base["timeout"] or DEFAULT_TIMEOUT[spec.device]
    need = tokens / median(rates)
    if need <= limit:
        return None
    probe = " (a probed micro-batch, at its first candidate)" if spec.plan.micro_batch_probe else ""
    return (f"predicted to run past its {limit:.0f} s time limit: its {tokens:,} tokens per rank{probe} take "
            f"{need:.0f} s "
            f"at the {median(rates):,.0f} tokens/s per rank this search measured (median of {len(rates)})")


def _run_trial(spec, base: dict, trial_id: str):
    """Measure a trial (a crash again, up to max_failures times), reporting each timed step to Tune; None when
    ASHA stopped it."""
    from ray import tune
    seen = []

    def on_step(m):  # the best step so far: one slow step (noise, a late allocation) does not end a trial
        seen.append(m[TOKENS_PER_S])
        tune.report({METRIC: max(seen), "step_s": m["step_s"], "step_tokens_per_s": m[TOKENS_PER_S],  # the step's
                     "status": str(Status.RUNNING), "cached": False})  # own, for search --track
    for attempt in range(1 + base.get("max_failures", 0)):  # only a crash is measured again
        try:
            record = execute(spec, timeout=base["timeout"], storage=base["trial_dir"], address=base["address"],
                             on_step=on_step, owner=trial_id, one_node=base.get("one_node", True))
        except Cancelled:
            return None
        record = record.replace(attempt=attempt + 1, fault=spec.fault or None)
        if record.status != Status.CRASH:
            break
    return record


def counted(rows: list[dict]) -> int:
    """The trials of a search that count toward --trials: all but those refused or pruned before running (FREE) and
    those the host or the cluster lost (NOT_COUNTED: host_oom, node_lost; their state, not the configuration's)."""
    return sum(1 for t in rows if t["status"] not in FREE and t["status"] not in NOT_COUNTED)


RANK_MARGIN = 0.1  # a trial this share slower than the search's best with a good verdict cannot rank: no gate


def rank_bar(store, search: str) -> dict | None:
    """The tokens/s a trial's rank 0 must reach for its quality gate to run (trial.worker): RANK_MARGIN below the
    fastest measurement of this search that trains the same model (no numerics changed, or a good verdict); None
    where it has none."""
    from trainscout.trial import quality
    best = None
    for t in store.trials(search):
        if t["status"] == Status.OK and t["key"] and (best is None or (t[TOKENS_PER_S] or 0) > best[0]):
            rec = store.get(t["key"])
            if rec is not None and quality.status(rec.metrics, store.quality(t["key"], "verify"), rec.config,
                                                  rec.device)[0] in quality.GOOD:
                best = (t[TOKENS_PER_S], t["trial"])
    return None if best is None else {TOKENS_PER_S: best[0] * (1 - RANK_MARGIN), "best": best[0],
                                      "trial": best[1]}


def known_gate(store, spec) -> tuple[str | None, dict | None]:
    """(the gate's key, its stored verdict or None) of a configuration whose knobs change the numerics: the verdict
    is the same for every trial that changes the same on this model, GPU and versions (trial.quality.gate_key);
    (None, None) for one that changes nothing."""
    if not (spec.quality and "reference_plan" in spec.quality):
        return None, None
    from trainscout.trial import quality
    gate = quality.gate_key(spec)
    return gate, store.quality(gate, "gate")


def failed_gate(spec, known: dict | None) -> str | None:
    """Why a configuration is not measured: the knobs it changes the numerics with failed their quality gate in an
    earlier trial (known: known_gate's verdict); a failed configuration is never the best (analysis/ties.choose).
    None: run it."""
    from trainscout.trial import quality
    failed = quality.failed_settings(known, spec.config)  # the verdict's changes: the gate key's, so this spec's
    if failed is None:
        return None
    changed = " ".join(f"{k}={v}" for k, v in failed.items())
    return (f"not measured: {changed} failed the quality gate in an earlier trial ({known.get('why') or 'failed'}); "
            f"a configuration that trains another model is never the best")


def stopped_before(store, search: str, settings: dict) -> float | None:
    """The best step of an earlier trial of this search that ASHA stopped with the same settings (None: none)."""
    same = json.loads(json.dumps(settings, sort_keys=True, default=str))
    for t in store.trials(search):
        if t["status"] == Status.STOPPED and {k: t["config"].get(k) for k in same} == same:
            return t[TOKENS_PER_S] or 0.0
    return None


def fault_schedule(text: str | None) -> dict[int, str]:
    """TRAINSCOUT_FAULT_SCHEDULE (tests): "N:KIND[@RANK],..." injects a fault into the search's trial number N
    (0-based, counted over the whole search, resumes included). Off when unset."""
    from trainscout.trial import faults
    out: dict[int, str] = {}
    for item in filter(None, (i.strip() for i in (text or "").split(","))):
        n, _, kind = item.partition(":")
        try:
            faults.parse(kind)
            if not n.strip().isdigit() or not kind:
                raise ValueError
        except ValueError:
            raise ConfigError("TRAINSCOUT_FAULT_SCHEDULE", f"TRAINSCOUT_FAULT_SCHEDULE item {item!r} is not "
                              f"N:KIND[@RANK] with KIND one of {'|'.join(faults.KINDS)}: e.g. 3:oom,5:crash@1")
        out[int(n)] = kind
    return out


def space_knobs():
    """The names of all registered knobs, in all_knobs() order (a generator)."""
    from trainscout.spaces import all_knobs
    return (k.name for k in all_knobs())
