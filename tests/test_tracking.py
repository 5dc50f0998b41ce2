"""search --track (issue 49, item 4): each trial a run of Ray Tune's own callbacks, its knobs as params, per-step
tokens/s and the final metrics, the search's name as the experiment. MLflow for real with its SQLite store in the output
folder (mlflow-skinny is in the test extra), TensorBoard's event files read back (tensorboardX comes with ray[tune]). A
real in-process search of tiny on the CPU, 2 trials, on the session's Ray."""
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


# --- a tracker that fails (issue 57, item 3) -------------------------------------------------------------------
def _silent_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (bound, then closed)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(capsys, *wanted: str) -> str:
    out, err = capsys.readouterr()
    err = err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("trainscout: error: ") and "Traceback" not in err, err
    assert "secret" not in out + err, out + err
    for w in wanted:
        assert w in err, err
    return err


def _search(out, *track: str) -> int:
    return main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--out", str(out), *track])


@pytest.mark.parametrize("uri, wanted", [
    ("http://user:secret@127.0.0.1:PORT", ["nothing answers at MLFLOW_TRACKING_URI=http://user:***@127.0.0.1:",
                                           "Connection refused"]),
    ("postgresql://user:secret@127.0.0.1:PORT/db", ["nothing answers", "postgresql://user:***@127.0.0.1:"]),
    ("garbage", ["MLFLOW_TRACKING_URI=garbage is no tracking URI", "sqlite:///PATH/mlflow.db"]),
    ("http://user:secret@127.0.0.1:12x", ["is no tracking URI", "user:***@"]),
], ids=["http-unreachable", "database-unreachable", "garbage", "bad-port"])
def test_an_mlflow_backend_that_cannot_be_reached_is_refused_in_one_line_before_anything_is_written(
        tmp_path, capsys, monkeypatch, uri, wanted):
    """MLflow's client retried an unreachable server for minutes and printed its password in a traceback: the check
    before the first trial (a TCP connect to a port nobody listens on) refuses it at once, masked, with exit 2 and
    no --out folder, so the folder can be used again."""
    import time
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.replace("PORT", str(_silent_port())))
    t0 = time.monotonic()
    assert _search(tmp_path / "s", "--track", "mlflow") == 2
    assert time.monotonic() - t0 < 20  # the check's own timeout is seconds (MLflow's retries: minutes)
    _one_line(capsys, "MLFLOW_TRACKING_URI", "(or leave --track mlflow out)", *wanted)
    assert not (tmp_path / "s").exists()


def _read_only(path) -> None:
    """path read-only, for root too (chattr +i: root ignores the mode bits); skipped where neither holds."""
    import stat
    import subprocess
    path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(path, os.W_OK) and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        path.chmod(0o755)
        pytest.skip("no read-only folder here (root, and chattr +i not permitted)")


def _writable(path) -> None:
    import subprocess
    subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755)


@pytest.mark.parametrize("case", ["read-only", "a-file"])
def test_an_unwritable_tune_folder_is_named_before_the_search_starts(tmp_path, capsys, case):
    """--track tensorboard writes its event files into the Tune folder under --out: a read-only one (or a file in
    its place) is refused naming that folder, not blamed on the results store, and nothing is added to --out."""
    out = tmp_path / "s"
    out.mkdir()
    tune = out / "tune"
    if case == "a-file":
        tune.write_text("mine\n")
    else:
        tune.mkdir()
        _read_only(tune)
    try:
        assert _search(out, "--track", "tensorboard") == 2
    finally:
        if case == "read-only":
            _writable(tune)
    err = _one_line(capsys, "--out", f"the Tune folder {tune} ", "--track tensorboard's event files",
                    "is read-only" if case == "read-only" else "is not a folder")
    assert "results store" not in err
    assert sorted(p.name for p in out.iterdir()) == ["tune"]
    assert case == "read-only" or tune.read_text() == "mine\n"


def test_wandb_is_checked_without_its_package(tmp_path, monkeypatch):
    """W&B, where no network is: an unreachable server (WANDB_BASE_URL at a port nobody listens on) and a missing
    API key are refused in one line, masked; offline mode asks no server (a unit call of the check: wandb is not
    installed here, so the CLI refuses --track wandb before it)."""
    from trainscout.search import tracking
    from trainscout.spaces import ConfigError
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SETUP_API_KEY_HOOK", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://user:secret@127.0.0.1:{_silent_port()}")
    with pytest.raises(ConfigError, match="no W&B API key.*WANDB_API_KEY.*WANDB_MODE=offline"):
        tracking.check(["wandb"], str(tmp_path / "s"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    with pytest.raises(ConfigError, match=r"nothing answers at the W&B server http://user:\*\*\*@127\.0\.0\.1:") as e:
        tracking.check(["wandb"], str(tmp_path / "s"))
    assert "secret" not in str(e.value) and len(str(e.value).splitlines()) == 1
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracking.check(["wandb"], str(tmp_path / "s"))  # no server asked
    assert not (tmp_path / "s").exists()


def test_a_tracking_store_that_dies_mid_search_costs_its_runs_not_the_search(tracked, tmp_path, monkeypatch):
    """MLflow for real: Ray Tune's MLflow callback, guarded as a search makes it, logs a trial's first result into a
    SQLite store (a copy of the tracked search's, its tables made), then the store's folder is deleted under it, as
    a full disk or a cleanup would: the next hook's failure is said once in one line, the later hooks do nothing, and
    no hook raises (an exception there ends Tune's loop). The guarded callback still pickles (Tune pickles its
    callbacks) and stays a TensorBoard logger where it is one (else Tune adds its own: two event files a trial)."""
    import io
    import shutil

    import mlflow
    import ray.cloudpickle
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune.experiment import Trial
    from ray.tune.logger import TBXLoggerCallback

    from trainscout.search.tracking import trackers
    (tmp_path / "db").mkdir()
    shutil.copy(tracked / "mlflow.db", tmp_path / "db" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    stream = io.StringIO()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlf, tbx = trackers(["mlflow", "tensorboard"], "mid", str(tmp_path / "s"), stream)
    assert isinstance(mlf, MLflowLoggerCallback) and isinstance(tbx, TBXLoggerCallback)
    assert len(ray.cloudpickle.loads(ray.cloudpickle.dumps(mlf)).__dict__) > 0
    stream.seek(0)
    stream.truncate()  # the lines saying where each tracker writes
    trial = Trial("trainable", config={"micro_batch_size": 2}, stub=True)
    mlf.setup()
    mlf.on_trial_start(iteration=0, trials=[trial], trial=trial)
    mlf.on_trial_result(iteration=1, trials=[trial], trial=trial, result={"tokens_per_s": 5.0, "training_iteration": 1})
    run = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("mid").experiment_id])
    assert [r.data.metrics["tokens_per_s"] for r in run] == [5.0] and stream.getvalue() == ""
    shutil.rmtree(tmp_path / "db")
    mlf.on_trial_result(iteration=2, trials=[trial], trial=trial, result={"tokens_per_s": 6.0, "training_iteration": 2})
    mlf.on_trial_result(iteration=3, trials=[trial], trial=trial, result={"tokens_per_s": 7.0, "training_iteration": 3})
    mlf.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    mlf.on_experiment_end(trials=[trial])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("  tracking: mlflow failed (") and "Traceback" not in lines[0], lines
    assert "readonly database" in lines[0] or "unable to open" in lines[0], lines
    assert "the search goes on" in lines[0]


def test_a_tracker_failing_at_its_start_says_so_once_with_the_password_masked(tmp_path, capsys, monkeypatch):
    """Ray Tune's MLflow callback at a server that is gone (a port nobody listens on) fails in its setup: one line,
    the URI's password masked, MLflow's own tracebacks held back, and the tracker is called no more."""
    import io

    from ray.tune.experiment import Trial

    from trainscout.search.tracking import trackers
    stream = io.StringIO()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:secret@127.0.0.1:{_silent_port()}")
    (mlf,) = trackers(["mlflow"], "gone", str(tmp_path / "s"), stream)
    mlf.setup()
    trial = Trial("trainable", config={}, stub=True)
    mlf.on_trial_start(iteration=0, trials=[trial], trial=trial)
    mlf.on_trial_complete(iteration=0, trials=[trial], trial=trial)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("  tracking: mlflow: experiment gone at http://user:***@127.0.0.1:"), lines
    assert len(lines) == 2 and lines[1].startswith("  tracking: mlflow failed ("), lines
    assert "http://user:***@127.0.0.1:" in lines[1], lines  # the failing request's URL, masked
    out, err = capsys.readouterr()
    assert "secret" not in stream.getvalue() + out + err and "Traceback" not in err, err[-2000:]
