"""What an Optuna trial of a search carries of its outcome (user attributes, its constraint), and which Tune trial it
was drawn for: read by the searcher (search/study.py), a resume (searcher.recover_interrupted), optuna-dashboard and
the live table."""
from __future__ import annotations

from trainscout.store import one_line
from trainscout.trial.status import Status

from .trainable import METRIC

TUNE_ID = "tune_trial_id"  # an Optuna trial's user attribute: the Tune trial it was drawn for
# Tune trial id -> its Optuna trial's number, for the live table: one numbering everywhere (the live table, the
# report, optuna-dashboard), Optuna's (the report said #4 for Optuna's number 3)
NUMBERS: dict[str, int] = {}
FEASIBLE = (Status.OK, Status.STOPPED, Status.RUNNING)  # RUNNING: the last step ASHA saw of a stopped trial


def outcome_attrs(result: dict) -> dict:
    """What an Optuna trial carries of its outcome (user attributes, for optuna-dashboard and any tool reading the
    study): status and reason, the measurement's key, the metrics, and `constraint` (> 0: infeasible), which
    set_constraint gives TPE; an infeasible outcome's trial is FAIL or PRUNED (optuna_state), without a value."""
    status = str(Status.STOPPED if result.get("status") == Status.RUNNING else result.get("status", Status.CRASH))
    # a measurement of a configuration that trains another model (its quality gate failed): its tokens/s kept, and
    # infeasible to the sampler (TPE puts it with the worst), as it is never the best (analysis/ties.choose)
    attrs = {"status": status, "constraint": [0.0 if status in FEASIBLE and not failed_quality(result) else 1.0]}
    if result.get("error"):
        attrs["error"] = one_line(str(result["error"]), 500)
    for k in ("key", "quality", "cached", "mfu", "peak_memory_gib", "projected_days", "predicted_gib", "wall_s"):
        if result.get(k) is not None:
            attrs[k] = result[k]
    if status in FEASIBLE:
        attrs[METRIC] = result.get(METRIC) or 0.0  # an infeasible outcome has no tokens/s: none said (was 0)
    return attrs


# outcomes of a configuration that ran, or was refused, and cannot run (a measurement of the configuration, not of
# the host or the cluster): FAIL in the study, with the reason (user attributes status and error) and the constraint
# > 0. Their number is no tokens/s (COMPLETE with value 0 read as "measured 0 tokens/s" in optuna-dashboard and any
# tool reading the study); the sampler still learns from them: searcher.make_sampler's TPE reads them as infeasible.
INFEASIBLE = (Status.INVALID, Status.OOM, Status.CRASH, Status.TIMEOUT)


def failed_quality(result: dict) -> bool:
    """Whether a trial's result says its configuration trains another model: the quality status the trainable
    reports (trial.quality.status: the one-step gate, or a stored `verify --quality`) is failed."""
    from trainscout.trial.quality import FAILED
    return result.get("quality") == FAILED


def optuna_state(status: str):
    """The Optuna state of an outcome: ok COMPLETE (its tokens/s), stopped (ASHA) and pruned (predicted not to fit,
    never launched) PRUNED, invalid / oom / crash / timeout FAIL (INFEASIBLE), and any other (unscheduled, host_oom,
    node_lost, not run: nothing of the configuration was learned) FAIL."""
    import optuna
    states = optuna.trial.TrialState
    if status == Status.OK:
        return states.COMPLETE
    return states.PRUNED if status in (Status.STOPPED, Status.RUNNING, Status.PRUNED) else states.FAIL


def set_constraint(trial, attrs: dict) -> None:
    """Tell the sampler whether an outcome was feasible (Optuna's Trial.set_constraint, read by TPE, before the
    trial is told its value): outcome_attrs' `constraint`."""
    trial.set_constraint("infeasible", attrs["constraint"][0])
