"""search --track: Ray Tune's own logger callbacks (MLflow, W&B, TensorBoard), each Tune trial a run."""
from __future__ import annotations

import os


def trackers(kinds, name: str, out: str, stream) -> list:
    """Ray Tune's logger callbacks for search --track (cli.searches.tracking checked their packages): each Tune trial
    a run, its config (the knobs) as params, each report's numbers as metrics (per timed step: the best step so far,
    tokens_per_s, and the step's own, step_tokens_per_s; at the end the record's tokens/s, MFU, peak memory, days),
    the search's name as the experiment (MLflow) or project (W&B). Where each writes is said on stream."""
    out_abs = os.path.abspath(out)
    made = []
    for kind in kinds:
        if kind == "mlflow":
            from ray.air.integrations.mlflow import MLflowLoggerCallback
            # default: a SQLite file in the output folder (MLflow 3.x refuses its ./mlruns file store unless told)
            uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(out_abs, 'mlflow.db')}"
            made.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name=name, tags={"trainscout_search": name}))
            where = f"mlflow: experiment {name} at {secrets_masked(uri)}"
        elif kind == "wandb":
            from ray.air.integrations.wandb import WandbLoggerCallback
            made.append(WandbLoggerCallback(project=name))
            where = f"wandb: project {name}" + (" (offline)" if os.environ.get("WANDB_MODE") == "offline" else "")
        else:
            from ray.tune.logger import TBXLoggerCallback
            made.append(TBXLoggerCallback())
            where = f"tensorboard: tensorboard --logdir {os.path.join(out_abs, 'tune')}"
        print(f"  tracking: {where}", file=stream, flush=True)
    return made


def secrets_masked(uri: str) -> str:
    from trainscout.store import secrets
    return secrets.masked(uri)
