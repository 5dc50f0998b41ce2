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
    study): status and reason, the measurement's key, the metrics, and `constraint` (> 0: infeasible). The value
    stays the tokens/s, 0 for an infeasible outcome, so TPE learns that region is bad; set_constraint gives TPE
    `constraint`, so it also knows why."""
    status = str(Status.STOPPED if result.get("status") == Status.RUNNING else result.get("status", Status.CRASH))
    attrs = {"status": status, "constraint": [0.0 if status in FEASIBLE else 1.0]}
    if result.get("error"):
        attrs["error"] = one_line(str(result["error"]), 500)
    for k in ("key", "cached", "mfu", "peak_memory_gib", "projected_days", "predicted_gib", "wall_s"):
        if result.get(k) is not None:
            attrs[k] = result[k]
    attrs[METRIC] = result.get(METRIC) or 0.0
    return attrs


def set_constraint(trial, attrs: dict) -> None:
    """Tell the sampler whether an outcome was feasible (Optuna's Trial.set_constraint, read by TPE, before the
    trial is told its value): outcome_attrs' `constraint`."""
    trial.set_constraint("infeasible", attrs["constraint"][0])
