"""search --track (issue 49, item 4): each trial a run of Ray Tune's own callbacks, its knobs as params, per-step
tokens/s and the final metrics, the search's name as the experiment. MLflow for real with its SQLite store in the output folder (mlflow-skinny
is in the test extra), TensorBoard's event files read back (tensorboardX comes with ray[tune]). A real in-process
search of tiny on the CPU, 2 trials, on the session's Ray."""
import glob
import os
import struct

import pytest

from trainscout.cli.main import main

pytestmark = pytest.mark.timeout(600)
FIXED = ["--set", "optimizer_state=fp32", "--set", "activation_offload=off", "--set", "optimizer_impl=foreach",
         "--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
         "--set", "attention=sdpa", "--set", "sdpa_backend=math", "--set", "precision=fp32", "--set", "fsdp=off"]


def events(path: str) -> list:
    """The Event protos of a TensorBoard event file (TFRecord: length, its CRC, the record, its CRC)."""
    from tensorboardX.proto import event_pb2
    out = []
    with open(path, "rb") as f:
        while header := f.read(12):
            (n,) = struct.unpack("<Q", header[:8])
            out.append(event_pb2.Event.FromString(f.read(n)))
            f.read(4)
    return out


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("tracked") / "s"
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "0", "--global-batch", "8",
               "--trials", "2", "--space", os.path.join(str(out.parent), "space.yaml"), "--out", str(out),
               "--track", "mlflow", "--track", "tensorboard", *FIXED]) if (out.parent / "space.yaml").write_text(
        "micro_batch_size: [1, 2]\nactivation_checkpointing: [none]\n") else None
    assert rc == 0
    return out


def test_mlflow_has_a_run_per_trial_with_knobs_and_metrics(tracked, capsys):
    import mlflow
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tracked / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("s")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2, [r.data.params for r in runs]
    assert {r.data.params["micro_batch_size"] for r in runs} == {"1", "2"}  # the knobs as params
    from trainscout.store import Store, default_url
    status = {str(t["config"]["micro_batch_size"]): t["status"] for t in Store(default_url(str(tracked))).trials("s")}
    assert "ok" in status.values(), status
    for run in runs:
        assert run.data.params["precision"] == "fp32" and run.data.tags.get("trainscout_search") == "s"
        steps = client.get_metric_history(run.info.run_id, "step_tokens_per_s")
        assert 1 <= len(steps) <= 2 and all(m.value > 0 for m in steps), steps  # one per timed step (ASHA may stop)
        final = run.data.metrics
        assert final["tokens_per_s"] > 0, final
        if status[run.data.params["micro_batch_size"]] == "ok":  # ran to its end (not stopped by ASHA at a step)
            assert final["peak_memory_gib"] > 0 and final["projected_days"] > 0, final  # the record's metrics


def test_tensorboard_event_files_hold_each_trials_steps(tracked):
    files = glob.glob(str(tracked / "tune" / "*" / "*" / "events.out.tfevents.*"))
    assert len(files) == 2, files
    for path in files:
        tags = [v.tag for e in events(path) if e.HasField("summary") for v in e.summary.value]
        assert 1 <= tags.count("ray/tune/step_tokens_per_s") <= 2, set(tags)  # per timed step (ASHA may stop it)
        assert "ray/tune/tokens_per_s" in tags


def test_a_tracker_whose_package_is_missing_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--out", str(tmp_path / "s"),
                 "--track", "wandb"]) == 2
    err = capsys.readouterr().err
    assert "--track wandb needs the wandb package" in err and "trainscout[wandb]" in err
    assert not (tmp_path / "s").exists()
