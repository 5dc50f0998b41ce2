"""Bad input to the command line, and what a user sees: one line naming the field and the fix (exit 2) before
anything starts or is written; results already measured are never lost; exit 0 means it did what was asked.
The help (what each command does, its defaults, an example), -q, -v, and --json's output alone on stdout.

Every test but one calls cli.main.main in-process and needs no Ray and no trial (validation comes first; a
resumed search whose trials are all done starts nothing). One runs a real tiny search on the CPU: interrupted
(exit 130), then resumed with more trials and --json."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from importlib.metadata import version
from types import SimpleNamespace

import optuna
import pytest
import sqlalchemy as sa

from trainscout.cli.main import main
from trainscout.search import service, trainable
from trainscout.search.service import SearchArgs, make_sampler, make_searcher, recover_interrupted, resumed, validate
from trainscout.search.space import Space
from trainscout.spaces import ConfigError, all_knobs
from trainscout.store import Store, default_url, storage_url
from trainscout.trial.records import Record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a recorded GPU store, of the schema before trials had an error column
BENCH_STORE = os.path.join(ROOT, "bench", "data", "gpu-2026-11-30-s4", "gpus1", "results.db")
SEARCH = ["search", "--model", "tiny", "--device", "cpu", "--trials", "2"]


def one_line_error(capsys, field: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("trainscout: error: ") and "Traceback" not in err, err
    assert field in err, err
    return err


def bench_store(tmp_path) -> Store:
    """A copy of a recorded GPU store (opening the tracked file would change it)."""
    path = tmp_path / "bench" / "results.db"
    path.parent.mkdir()
    shutil.copy(BENCH_STORE, path)
    return Store(default_url(str(path.parent)))


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"trainscout {version('trainscout')}\n"
    import trainscout
    import trainscout.cli
    assert trainscout.__version__ == trainscout.cli.__version__ == version("trainscout")
    assert trainscout.__file__.endswith(os.path.join("trainscout", "__init__.py"))  # a package, not a namespace


# --- help: what the tool and each command do, defaults, an example ----------------------------------------------
COMMANDS = ("knobs", "estimate", "lookup", "trial", "search", "results", "report", "atlas", "export", "verify", "train")


def help_of(capsys, monkeypatch, argv) -> str:
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal: the width of the smallest one
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_says_what_the_tool_answers_and_lists_the_commands(capsys, monkeypatch):
    text = help_of(capsys, monkeypatch, ["--help"])
    description = text.split("\n\n")[1]
    assert description.startswith("What is the fastest way to pre-train") and "days and dollars" in description
    assert "Bad input" not in text and "-q, --quiet" in text and "-v, --verbose" in text
    listed = text.split("commands:\n")[1].split("\n\n")[0].splitlines()[1:]  # after the COMMAND line
    assert [line.split()[0] for line in listed] == list(COMMANDS)  # one line each, nothing wrapped


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_help_shows_its_defaults_and_an_example(capsys, monkeypatch, command):
    text = help_of(capsys, monkeypatch, [command, "--help"])
    assert "(default: " in text, text
    assert f"example:\n  trainscout {command} " in text, text
    assert "-q, --quiet" in text  # the global flags are taken after the command too


def test_results_import_and_export_say_they_move_measurement_records(capsys, monkeypatch):
    text = " ".join(help_of(capsys, monkeypatch, ["results", "--help"]).split())
    assert "--export FILE.jsonl write every measurement record" in text and "JSON lines" in text
    assert "export command" in text
    text = " ".join(help_of(capsys, monkeypatch, ["export", "--help"]).split())
    for fmt in ("hf: training_args.json", "deepspeed: deepspeed.json", "accelerate: accelerate.yaml",
                "command: launch.sh", "all:"):
        assert fmt in text, text


# --- -q, -v, --json ------------------------------------------------------------------------------------------
def test_quiet_drops_the_hint_of_knobs_and_verbose_adds_each_knobs_module(capsys):
    assert main(["knobs"]) == 0
    assert "Set a knob with --set" in capsys.readouterr().out
    assert main(["-q", "knobs"]) == 0
    out = capsys.readouterr().out
    assert "Set a knob with --set" not in out and out.startswith("NAME") and "MODULE" not in out
    assert main(["knobs", "-v"]) == 0
    assert "trainscout.spaces.knobs." in capsys.readouterr().out


def test_quiet_and_verbose_together_are_refused(capsys):
    assert main(["-q", "knobs", "-v"]) == 2
    one_line_error(capsys, "--quiet")


@pytest.mark.parametrize("argv, given", [
    (["search", "--gpus-per", "1", "--model", "tiny", "--device", "cpu"], "--gpus-per 1"),
    (["trial", "--work", "2", "--model", "tiny"], "--work 2"),
    (["--vers"], "--vers"),
])
def test_a_prefix_of_a_flag_is_refused_not_read_as_that_flag(capsys, argv, given):
    """argparse's prefix matching is off: a flag's prefix is an unknown flag, not the flag it starts."""
    assert main(argv) == 2
    assert f"unrecognized arguments: {given}" in one_line_error(capsys, "arguments")


def finished_search(tmp_path) -> str:
    """A saved search whose 4 trials are done (a resume runs nothing, starts no Ray): 3 out of memory, 1 crashed
    (trials refused or pruned before running would not count toward --trials)."""
    out, _ = saved_search(tmp_path)
    store = Store(default_url(out))
    for i in range(3):
        store.add_trial("s", f"t{i}", None, "oom", False, 0.0, {"micro_batch_size": i},
                        error="out of memory: " + "because " * 30 + "the end")
    crash = Record(model="tiny", config={"micro_batch_size": 4}, status="crash", device="cpu", world_size=1,
                   error="RuntimeError: boom", stderr_tail="[rank0.err] Traceback ...\nRuntimeError: boom")
    store.put("c" * 32, crash)
    store.add_trial("s", "t3", "c" * 32, "crash", False, 0.0, {"micro_batch_size": 4}, error="RuntimeError: boom")
    return out


def test_quiet_search_prints_the_summary_alone(tmp_path, capsys):
    out = finished_search(tmp_path)
    assert main(["search", "--resume", out]) == 0
    loud = capsys.readouterr().out
    assert "all 4 trials done" in loud and "4 trials: 1 crash, 3 oom" in loud
    assert main(["-q", "search", "--resume", out]) == 0
    cap = capsys.readouterr()
    assert cap.out == loud[loud.index("\n4 trials:"):] and cap.err == ""  # the summary, as a search prints it
    assert main(["search", "--resume", out, "-q", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["trials"] == 4 and cap.err == ""


def test_verbose_search_prints_each_failed_trials_whole_reason_and_stderr_tail(tmp_path, capsys):
    out = finished_search(tmp_path)
    assert main(["search", "--resume", out, "-v"]) == 0
    text = capsys.readouterr().out
    assert text.count("because " * 30 + "the end") == 3  # the whole reason, not the table's 120 characters
    assert "trial t3 crash: RuntimeError: boom\n    [rank0.err] Traceback ...\n    RuntimeError: boom" in text
    assert main(["search", "--resume", out, "-v", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["trials"] == 4 and "[rank0.err]" in cap.err
    assert main(["results", out]) == 0 and "the end" not in capsys.readouterr().out  # the table's 80 characters
    assert main(["results", out, "-v"]) == 0 and capsys.readouterr().out.count("because " * 30 + "the end") == 3


@pytest.mark.parametrize("argv, rc", [
    (["knobs", "--json"], 0),
    (["estimate", "--model", "tiny", "--json"], 0),
    (["estimate", "--model", "tiny", "--gpu-memory", "1MiB", "--json"], 1),  # the exit status of the text
    (["-v", "results", "STORE", "--format", "json"], 0),
    (["search", "--resume", "STORE", "--json"], 0),
])
def test_json_output_is_alone_on_stdout(tmp_path, capsys, argv, rc):
    store = finished_search(tmp_path)
    assert main([store if a == "STORE" else a for a in argv]) == rc
    cap = capsys.readouterr()
    data = json.loads(cap.out)
    if argv[0] == "estimate":
        assert data["fits"] is (None if rc == 0 else False)


def test_a_closed_stdout_ends_without_a_traceback(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "trainscout.cli.main", "knobs", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # as `| head` does once it has read its lines
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and "Traceback" not in err, err


# --- storage: absolute, never in memory ------------------------------------------------------------------------
def test_a_relative_sqlite_storage_is_made_absolute_before_any_trial(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = SearchArgs(model="tiny", out="o", device="cpu", trials=2, storage="sqlite:///rel.db")
    validate(args)
    assert args.storage == "sqlite:///" + str(tmp_path / "rel.db")
    uri = sa.engine.make_url(storage_url("sqlite:///file:rel.db?uri=true"))
    assert uri.database == f"file:{tmp_path / 'rel.db'}" and dict(uri.query) == {"uri": "true"}
    assert storage_url("sqlite:////abs/results.db") == "sqlite:////abs/results.db"
    # other URLs as given (postgresql:// names the installed driver where SQLAlchemy's default, psycopg2, is not)
    assert storage_url("postgresql://u@h/db") in ("postgresql://u@h/db", "postgresql+psycopg://u@h/db")
    assert not (tmp_path / "o").exists() and not (tmp_path / "rel.db").exists()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared&uri=true",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_an_in_memory_storage_is_refused(tmp_path, capsys, url):
    assert main(SEARCH + ["--out", str(tmp_path / "o"), "--storage", url]) == 2
    assert "in-memory" in one_line_error(capsys, "--storage")
    assert main(["results", url, "--import", str(tmp_path / "x.jsonl")]) == 2  # the import would vanish with it
    one_line_error(capsys, "DIR")
    assert not (tmp_path / "o").exists()


# --- Ray reached before anything is written (issue 30) -----------------------------------------------------------
def _free_port() -> int:
    import socket
    with socket.socket() as s:  # bound, then closed: nothing listens on it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS", "RAY_TMPDIR"])
@pytest.mark.parametrize("command", ["search", "trial"])
def test_an_unreachable_ray_or_an_unwritable_temp_folder_is_one_line_within_seconds(tmp_path, how, command):
    """An address where nothing listens (the flag, or RAY_ADDRESS as `ray job submit` sets it) and a Ray temp folder
    that cannot be made: exit 2 with one line naming the setting, within 20 s (Ray itself retried for minutes), and
    the search wrote nothing (no results.db, no lock: a rerun there is not refused)."""
    (tmp_path / "afile").write_text("")
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, "-m", "trainscout.cli", command, "--model", "tiny", "--device", "cpu"]
    argv += ["--trials", "1", "--out", str(tmp_path / "o")] if command == "search" else []
    address = f"127.0.0.1:{_free_port()}"
    if how == "--address":
        argv += ["--address", address]
    elif how == "RAY_ADDRESS":
        env["RAY_ADDRESS"] = address
    else:
        env["RAY_TMPDIR"] = str(tmp_path / "afile" / "ray")  # under a file: nothing can be made there
    t0 = time.time()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    took = time.time() - t0
    err = res.stderr.strip()
    assert res.returncode == 2 and took < 20, (res.returncode, round(took, 1), err[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith(f"trainscout: error: {how}") and "Traceback" not in err, err
    assert ("nothing listens" in err) if how != "RAY_TMPDIR" else ("temp folder" in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


# --- the smaller ones of issue 30: refused up front, naming the fix ----------------------------------------------
def test_more_ranks_than_the_ray_cluster_can_place_are_refused_up_front(tmp_path, capsys, ray_local):
    """`--gpus-per-trial 8` on a 2-core CPU waited until the trial's timeout: each rank holds half a CPU and the
    search's trial actor one, which this cluster cannot place; refused before anything is written."""
    cpus = int(ray_local.cluster_resources()["CPU"])
    ranks = 2 * cpus + 2  # 0.5 CPU each + the trial actor's 1: more than the cluster has
    assert main(["search", "--model", "tiny", "--device", "cpu", "--trials", "1", "--gpus-per-trial", str(ranks),
                 "--global-batch", str(2 * ranks), "--out", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "--gpus-per-trial")
    assert f"has {cpus}:" in err and "or fewer" in err and not (tmp_path / "o").exists(), err
    assert main(["trial", "--model", "tiny", "--device", "cpu", "--workers", str(ranks),
                 "--global-batch", str(2 * ranks)]) == 2
    one_line_error(capsys, "--workers")


def test_a_storage_url_names_its_own_missing_driver(tmp_path, capsys):
    assert main(SEARCH + ["--out", str(tmp_path / "o"), "--storage", "mysql://u@127.0.0.1/db"]) == 2
    err = one_line_error(capsys, "--storage")
    assert "mysql driver mysqldb is missing" in err and "pip install mysqlclient" in err and "psycopg" not in err, err


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/typo.db", "sqlite:///typo.db"])
def test_a_mistyped_sqlite_url_is_refused_and_creates_nothing(tmp_path, capsys, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    for argv in (["results"], ["report"], ["export", "--best", "--out", str(tmp_path / "x")]):
        assert main([argv[0], url.format(tmp=tmp_path), *argv[1:]]) == 2
        assert "no SQLite file" in one_line_error(capsys, "DIR")
    assert os.listdir(tmp_path) == []  # no empty database made where the typo pointed


def _export_of_tiny(tmp_path) -> str:
    """An export folder of the tiny model (trainscout.json as `trainscout export` writes it, for `train`)."""
    from trainscout.trial.models import resolve_model
    folder = tmp_path / "exp"
    folder.mkdir()
    m = resolve_model("tiny")
    (folder / "trainscout.json").write_text(json.dumps({
        "model": "tiny", "model_config": m.config, "config": {"precision": "fp32", "micro_batch_size": 4},
        "recipe": m.recipe.to_dict(), "hardware": {"device": "cpu", "world_size": 1}}))
    return str(folder)


@pytest.mark.parametrize("case", ["id-beyond-vocab", "negative-id", "size-not-a-multiple", "dtype-without-data"])
def test_train_refuses_data_it_cannot_train_on_before_any_trial(tmp_path, capsys, case):
    """Token ids >= the vocabulary crashed inside the trial, a size that is not a multiple of the dtype after 23 s,
    and --data-dtype without --data was silently ignored: each is one line naming the flag, before Ray starts."""
    import numpy as np
    export, data = _export_of_tiny(tmp_path), tmp_path / "tokens.bin"
    ids = np.arange(400, dtype=np.int64) % 500  # tiny's vocabulary: 512 ids
    argv = ["train", "--config", export, "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "ckpt")]
    if case == "id-beyond-vocab":
        ids[123] = 600
        ids.astype(np.uint16).tofile(data)
        argv += ["--data", str(data)]
        want, field = "token id 600, outside the model's vocabulary of 512", "--data"
    elif case == "negative-id":
        ids[7] = -3
        ids.astype(np.int32).tofile(data)
        argv += ["--data", str(data), "--data-dtype", "int32"]
        want, field = "token id -3", "--data"
    elif case == "size-not-a-multiple":
        data.write_bytes(ids.astype(np.uint16).tobytes() + b"\0")
        argv += ["--data", str(data)]
        want, field = "not a whole number of uint16 token ids", "--data"
    else:
        argv += ["--data-dtype", "uint32"]
        want, field = "without --data", "--data-dtype"
    assert main(argv) == 2
    assert want in one_line_error(capsys, field)
    assert not (tmp_path / "ckpt").exists()


# --- output folders --------------------------------------------------------------------------------------------
def _read_only_dir(tmp_path) -> str:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(ro, os.W_OK):  # root writes anyway: a read-only mount then, where there is one
        ro.chmod(0o755)
        ro.rmdir()
        if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):
            return "/proc/sys/trainscout-test"
        pytest.skip("no read-only folder here (root, and no read-only mount)")
    return str(ro / "sub")


@pytest.mark.parametrize("command", [SEARCH, ["export", "SRC", "--best"], ["report", "SRC"],
                                     ["train", "--config", "SRC"]], ids=["search", "export", "report", "train"])
@pytest.mark.parametrize("case", ["file", "under-a-file", "empty", "read-only"])
def test_bad_out_folders_exit_2_before_anything_runs(tmp_path, capsys, command, case):
    afile, ro = tmp_path / "afile", tmp_path / "ro"
    afile.write_text("mine\n")
    out = {"file": str(afile), "under-a-file": str(afile / "sub"), "empty": ""}.get(case)
    out = _read_only_dir(tmp_path) if out is None else out
    argv = [str(tmp_path / "nosuch") if a == "SRC" else a for a in command]
    try:
        rc = main(argv + ["--out", out])
    finally:
        if ro.exists():
            ro.chmod(0o755)
    assert rc == 2
    one_line_error(capsys, "--out")
    assert afile.read_text() == "mine\n"  # nothing written, nothing created
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["afile"] + (["ro"] if ro.exists() else []))
    assert not ro.exists() or not any(ro.iterdir())


def test_a_new_search_into_a_folder_holding_a_search_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out, name, argv in ((tmp_path / "s", "s", ["--out", str(tmp_path / "s")]),
                            (tmp_path / "runs" / "search", "search", [])):  # the default folder too
        out.mkdir(parents=True)
        store = Store(default_url(str(out)))
        store.add_search(name, asdict(SearchArgs(model="tiny", out=str(out), device="cpu", trials=2)))
        store.add_trial(name, "t1", None, "invalid", False, 0.0, {"zero_stage": 0}, error="why")
        before = sorted(os.listdir(out))
        assert main(SEARCH[:-1] + ["4", "--set", "zero_stage=1"] + argv) == 2
        err = one_line_error(capsys, "--out")
        assert f"--resume {out if argv else 'runs/search'}" in err and "another --out" in err, err
        assert sorted(os.listdir(out)) == before and len(store.trials(name)) == 1


# --- resume: what it may change -------------------------------------------------------------------------------
def saved_search(tmp_path, **kw) -> tuple[str, SearchArgs]:
    out = tmp_path / "s"
    out.mkdir()
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1, 2]\n")
    args = SearchArgs(model="tiny", out=str(out), device="cpu", trials=4, space=str(space), steps=1, warmup=0,
                      sets={"compile": "false"}, recipe={"global_batch": 4}, **kw)
    validate(args)  # as a search saves them: absolute paths, the space file's content
    Store(default_url(str(out))).add_search("s", asdict(args))
    return str(out), args


@pytest.mark.parametrize("flags, field", [
    (["--model", "pythia-14m"], "--model"),
    (["--set", "compile=true"], "--set"),
    (["--set", "compile=false", "--set", "tf32=false"], "--set"),
    (["--space", "OTHER"], "--space"),
    (["--steps", "3"], "--steps"),
    (["--warmup", "1"], "--warmup"),
    (["--seed", "7"], "--seed"),
    (["--device", "auto"], "--device"),
    (["--gpus-per-trial", "2"], "--gpus-per-trial"),
    (["--timeout", "30"], "--timeout"),
    (["--global-batch", "8"], "--global-batch"),
    (["--trials", "3"], "--trials"),                          # fewer than the search was started with
    (["--out", "ELSEWHERE"], "--out"),
])
def test_resume_refuses_settings_that_differ_from_the_saved_ones(tmp_path, capsys, flags, field):
    out, _ = saved_search(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text("micro_batch_size: [1, 4]\n")
    flags = [str(other) if f == "OTHER" else str(tmp_path / "x") if f == "ELSEWHERE" else f for f in flags]
    assert main(["search", "--resume", out, *flags]) == 2
    one_line_error(capsys, field)
    assert Store(default_url(out)).trials("s") == []


def test_resume_takes_more_trials_and_the_same_settings_and_says_so(tmp_path):
    out, args = saved_search(tmp_path)
    same = {"model": "tiny", "device": "cpu", "space": args.space, "sets": {"compile": "false"}, "steps": 1,
            "recipe": {"global_batch": 4}, "trials": 6, "time_budget_s": 90.0}
    resumed_args, notes = resumed(asdict(args), out, same, done=3)
    assert resumed_args.trials == 6 and resumed_args.time_budget_s == 90.0 and resumed_args.model == "tiny"
    assert notes == ["--trials 4 -> 6: 3 to go", "a time budget of 90 s for this run"]
    (tmp_path / "space.yaml").write_text("micro_batch_size: [1, 2, 4]\n")  # edited since: the search keeps its own
    resumed_args, _ = resumed(asdict(args), out, {}, done=3)
    assert resumed_args.space_content == {"micro_batch_size": [1, 2]}
    with pytest.raises(ConfigError, match="--space"):
        resumed(asdict(args), out, {"space": args.space}, done=3)


def test_resume_of_a_finished_search_runs_nothing_and_json_is_alone_on_stdout(tmp_path, capsys):
    out, args = saved_search(tmp_path)
    store = Store(default_url(out))
    for i in range(4):
        store.add_trial("s", f"t{i}", None, "timeout", False, 0.0, {"micro_batch_size": i}, error="too slow")
    assert main(["search", "--resume", out, "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["trials"] == 4  # nothing but the JSON on stdout
    assert "all 4 trials done" in cap.err and "4 trials: 4 timeout" in cap.err
    # refused and pruned trials do not count toward --trials: these 4 leave 3 to go
    for i, status in enumerate(("invalid", "pruned", "invalid")):
        store.add_trial("s2", f"u{i}", None, status, False, 0.0, {}, error="refused")
    store.add_trial("s2", "u3", None, "ok", False, 1.0, {})
    assert service.counted(store.trials("s2")) == 1


# --- one search per folder at a time ---------------------------------------------------------------------------
HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
time.sleep(120)
"""


def hold(folder) -> subprocess.Popen:
    """Another process holding a folder's search lock, as a running search's driver does."""
    os.makedirs(folder, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", HOLDER, os.path.join(folder, service.LOCK_FILE)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_search_on_a_folder_while_one_runs_is_refused(tmp_path, capsys):
    out, _ = saved_search(tmp_path)
    holders = [hold(out), hold(tmp_path / "new")]
    try:
        for argv in (["search", "--resume", out], SEARCH + ["--out", str(tmp_path / "new")]):
            assert main(argv) == 2
            err = one_line_error(capsys, "--out")
            assert "in use by a running search (pid " in err and "another --out" in err, err
    finally:
        for p in holders:
            p.kill()
            p.wait()
    os.close(service.hold_folder(out))  # the kernel dropped the lock with its holder (SIGKILL)
    assert Store(default_url(out)).trials("s") == [] and os.listdir(tmp_path / "new") == [service.LOCK_FILE]


# --- numbers that were accepted and meant something else ------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**64)])
def test_a_seed_outside_the_samplers_range_is_refused(tmp_path, capsys, seed):
    assert main(SEARCH + ["--out", str(tmp_path / "o"), "--seed", seed]) == 2
    one_line_error(capsys, "--seed")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="--seed"):
        validate(SearchArgs(model="tiny", out=str(tmp_path / "o"), device="cpu", trials=2, seed=int(seed)))


def test_a_store_left_with_an_unusable_seed_can_be_resumed_with_one(tmp_path, capsys):
    out, args = saved_search(tmp_path)
    Store(default_url(out)).update_search("s", dict(asdict(args), seed=-1))  # as an older version saved it
    assert main(["search", "--resume", out]) == 2
    assert "give an integer from 0" in one_line_error(capsys, "--seed")
    resumed_args, _ = resumed(dict(asdict(args), seed=-1), out, {"seed": 5}, done=0)
    assert resumed_args.seed == 5


@pytest.mark.parametrize("argv", [SEARCH + ["--timeout", "0"], ["trial", "--model", "tiny", "--timeout", "0"],
                                  ["train", "--config", "x", "--timeout", "0"], SEARCH + ["--timeout", "-5"],
                                  ["verify", "x", "--timeout", "0"]],
                         ids=["search", "trial", "train", "negative", "verify"])
def test_timeout_0_is_refused_not_read_as_the_default(tmp_path, capsys, argv):
    assert main(argv + (["--out", str(tmp_path / "o")] if argv[0] in ("search", "train") else [])) == 2
    assert "positive number of seconds" in one_line_error(capsys, "--timeout")


@pytest.mark.parametrize("size", ["0", "0GiB", "-1GiB", "inf", "infGiB", "nanGB", "80000000000", "1e3GB", "80 GiBs",
                                  ""])
def test_gpu_memory_needs_a_positive_size_with_a_unit(capsys, size):
    assert main(["estimate", "--model", "tiny", f"--gpu-memory={size}"]) == 2
    one_line_error(capsys, "--gpu-memory")


def test_gpu_memory_with_a_unit_is_checked_against(capsys):
    assert main(["estimate", "--model", "tiny", "--gpu-memory", "80GiB"]) == 0
    assert "fits in 80.0 GiB" in capsys.readouterr().out
    assert main(["estimate", "--model", "tiny", "--gpu-memory", "1 MiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


@pytest.mark.timeout(60)  # a FIFO that is opened blocks forever: the test would hang, not fail
@pytest.mark.parametrize("argv, field", [
    (SEARCH + ["--space", "FIFO"], "--space"),
    (["search", "--model", "FIFO", "--device", "cpu", "--trials", "2"], "--model"),
    (["trial", "--model", "FIFO"], "--model"),
    (["estimate", "--model", "FIFO"], "--model"),
    (["results", "STORE", "--import", "FIFO"], "--import"),
    (["train", "--config", "FIFO"], "--config"),
    (["train", "--config", "STORE", "--data", "FIFO"], "--data"),
    (["report", "STORE", "--prices", "FIFO"], "--prices"),
])
def test_a_pipe_as_an_input_file_is_refused(tmp_path, capsys, monkeypatch, argv, field):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "store").mkdir()
    argv = [str(tmp_path / "fifo") if a == "FIFO" else str(tmp_path / "store") if a == "STORE" else a for a in argv]
    assert main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "search" else [])) == 2
    assert "not a regular file" in one_line_error(capsys, field)
    with pytest.raises(ConfigError, match="--space"):  # the service refuses it too (a search started from Python)
        service.read_space(str(tmp_path / "fifo"))


# --- results --import ----------------------------------------------------------------------------------------
def _good_record(tmp_path) -> dict:
    return next(m for m in bench_store(tmp_path).measurements() if m.ok).to_dict()


def _unset(d, path):
    d = json.loads(json.dumps(d))
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if last in node:
        del node[last]
    return d


def _set(d, path, value):
    d = json.loads(json.dumps(d))
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[last] = value
    return d


BAD_RECORDS = {
    "ok-without-metrics": (lambda r: _set(r, "metrics", None), "without metrics.tokens_per_s"),
    "ok-metrics-missing": (lambda r: _unset(r, "metrics"), "without metrics.tokens_per_s"),
    "ok-without-step": (lambda r: _unset(r, "metrics.step_s"), "without metrics.step_s"),
    "tokens-text": (lambda r: _set(r, "metrics.tokens_per_s", "fast"), "metrics.tokens_per_s"),
    "tokens-nan": (lambda r: _set(r, "metrics.tokens_per_s", math.nan), "metrics.tokens_per_s"),
    "ok-without-plan": (lambda r: _unset(r, "plan"), "plan and recipe"),
    "recipe-steps-text": (lambda r: _set(r, "recipe.total_steps", "many"), "recipe.total_steps"),
    "status-unknown": (lambda r: _set(r, "status", "great"), "status"),
    "config-list": (lambda r: _set(r, "config", [1, 2]), "config"),
    "hardware-list": (lambda r: _set(r, "hardware", ["h200"]), "hardware"),
    "world-size-text": (lambda r: _set(r, "world_size", "two"), "world_size"),
    "key-number": (lambda r: _set(r, "key", 5), "no key"),
    "no-model": (lambda r: _unset(r, "model"), "no model"),
    "a-list": (lambda r: [r], "not a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_import_refuses_a_malformed_record_and_writes_nothing(tmp_path, capsys, case):
    mutate, why = BAD_RECORDS[case]
    good = _good_record(tmp_path)
    lines = [good, mutate(dict(good, key="f" * 32))]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["results", str(tmp_path / "s"), "--import", str(path)]) == 2
    err = one_line_error(capsys, "--import")
    assert "line 2" in err and why in err, err
    assert Store(default_url(str(tmp_path / "s"))).measurements() == []  # not even the good first line


def test_an_imported_measurement_can_be_exported(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(_good_record(tmp_path)) + "\n")
    assert main(["results", str(tmp_path / "s"), "--import", str(path)]) == 0
    assert main(["results", str(tmp_path / "s"), "--import", str(path)]) == 0  # again: merged, not duplicated
    assert capsys.readouterr().out.splitlines()[-1] == "imported 0 measurements, 1 already present"
    assert main(["export", str(tmp_path / "s"), "--best", "--format", "command", "--out", str(tmp_path / "e")]) == 0
    assert (tmp_path / "e" / "launch.sh").exists()


# --- why a trial did not run: the live table, the store, `results` ------------------------------------------------
def tiny_space() -> Space:
    """micro_batch_size x activation_checkpointing (4 configurations), every other knob at its default."""
    domains = {"micro_batch_size": (1, 2), "activation_checkpointing": ("none", "full")}
    return Space({k.name: k.default for k in all_knobs() if k.name not in domains}, domains)


def test_the_live_table_shows_why_a_trial_did_not_run(capsys):
    printer = service.Printer(tiny_space(), sys.stderr, total=4, ranks=2)  # --json: the table goes to stderr
    printer.t0 -= 60  # the search started a minute ago
    trial = SimpleNamespace(trial_id="0123456789ab", config={"micro_batch_size": 1, "activation_checkpointing": "full"})
    printer(trial, {"status": "invalid", service.METRIC: 0.0, "error": "offload_params=true needs zero_stage=3 (got "
                    "0): set zero_stage=3 or offload_params=false\nsecond line"})
    printer(trial, {"status": "ok", service.METRIC: 100.0, "error": None, "projected_days": 2.0, "wall_s": 20.0})
    cap = capsys.readouterr()
    assert cap.out == ""
    header, invalid, progress1, ok, progress2 = cap.err.splitlines()
    assert "invalid" in invalid and "(offload_params=true needs zero_stage=3 (got 0): set zero_stage=3" in invalid
    assert "second line" not in cap.err and ok.endswith("activation_checkpointing=full")  # no reason for an ok trial
    # the progress line after each row: done/total (a trial refused before running does not count toward --trials),
    # elapsed, ETA from the pace so far, best, device-seconds held
    assert progress1.split() == ["0/4", "trials", "(+1", "refused,", "pruned", "or", "lost,", "not",
                                 "counted),", "1m00s", "elapsed,", "ETA", "-,", "best", "-,", "0", "GPU-s", "measured"]
    assert "1/4 trials (+1 refused" in progress2 and "ETA 3m00s" in progress2 and "best 100 tok/s" in progress2
    assert "40 GPU-s measured" in progress2  # 20 s x 2 ranks


class FakeContext:
    def get_trial_id(self):
        return "t0001"

    def get_trial_name(self):
        return "trial_0_t0001"


def test_an_invalid_trial_keeps_its_reason_in_the_store_and_in_results(tmp_path, capsys, monkeypatch):
    import ray.tune

    from trainscout.trial import hardware
    reports = []
    monkeypatch.setattr(ray.tune, "get_context", lambda: FakeContext())
    monkeypatch.setattr(ray.tune, "report", lambda m: reports.append(m))
    url = default_url(str(tmp_path))
    base = {"model": "tiny", "workers": 1, "steps": 1, "warmup": 0, "hardware": hardware.fingerprint("cpu", 1),
            "seed": 0, "recipe": {}, "storage": url, "search": "s", "timeout": 5, "address": None,
            "trial_dir": str(tmp_path / "trials"), "knob_names": list(service.space_knobs()), "faults": {}, "offset": 0}
    store = Store(url)
    store.add_search("s", {})
    trainable.tune_trial({"zero_stage": 0, "offload_params": True}, base)  # refused before launch
    [row] = store.trials("s")
    assert row["status"] == "invalid" and "offload_params" in row["error"] and reports[-1]["error"] == row["error"]
    rec = Record(model="tiny", config={"micro_batch_size": 2}, status="ok", device="cpu", world_size=1,
                 metrics={"tokens_per_s": 1234.5, "step_s": 0.5})
    store.put("k" * 32, rec)
    store.add_trial("s", "t0002", "k" * 32, "ok", False, 1234.5, {"micro_batch_size": 2})
    assert main(["results", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-1] == "error" and "offload_params=true needs zero_stage=3" in table[1]
    assert main(["results", str(tmp_path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["world_size"] for r in rows] == ["", "1"]  # an integer, not 1.0, beside a row without a record
    assert "offload_params" in rows[0]["error"]
    assert main(["results", str(tmp_path), "--format", "json"]) == 0
    assert [r["world_size"] for r in json.loads(capsys.readouterr().out)] == [None, 1]


def test_an_older_store_is_read_as_it_is_and_gains_the_error_column_on_write(tmp_path, capsys):
    store = bench_store(tmp_path)
    def columns():
        return {c["name"] for c in sa.inspect(store.engine).get_columns("trainscout_search_trials")}
    assert "error" not in columns()
    [name, *_] = store.searches()
    assert all(t["error"] is None for t in store.trials(name))
    assert main(["results", str(tmp_path / "bench")]) == 0 and "error" in capsys.readouterr().out
    assert "error" not in columns()  # reading changed nothing
    store.add_trial(name, "new", None, "invalid", False, 0.0, {}, error="refused: fix it")
    assert "error" in columns() and {t["trial"]: t for t in store.trials(name)}["new"]["error"] == "refused: fix it"


def test_results_refuses_a_status_no_trial_has_and_filters_by_one_in_any_case(tmp_path, capsys):
    """--status nonsense printed "no trials" (exit 0) as if the store were empty: now refused, naming the statuses."""
    store = bench_store(tmp_path)
    statuses = {t["status"] for name in store.searches() for t in store.trials(name)}
    assert main(["results", str(tmp_path / "bench"), "--status", "nonsense"]) == 2
    err = one_line_error(capsys, "--status")
    assert "'nonsense' is not a trial status" in err and "ok, oom, timeout" in err and "host_oom" in err
    assert main(["results", str(tmp_path / "bench"), "--status", "OK", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert "ok" in statuses and len(statuses) > 1 and rows and {r["status"] for r in rows} == {"ok"}
    name = store.searches()[0]
    store.add_trial(name, "killed", None, "host_oom", False, 0.0, {}, error="the host's memory monitor")
    store.add_trial(name, "big", None, "oom", False, 0.0, {}, error="CUDA out of memory")
    assert main(["results", str(tmp_path / "bench"), "--status", "oom", "--format", "json"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)} == {"oom"}  # oom is not host_oom


def test_results_filters_by_one_gpu_kind_exactly(tmp_path, capsys):
    """--gpu H20 matched the H200's rows (a substring): a kind is one kind exactly, else refused naming the kinds."""
    bench_store(tmp_path)
    assert main(["results", str(tmp_path / "bench"), "--gpu", "H200", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["gpu"] for r in rows} == {"NVIDIA H200"}
    assert main(["results", str(tmp_path / "bench"), "--gpu", "H20", "--format", "json"]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() in ("", "[]") and "H200" not in cap.out  # an H20 measured nothing here
    assert main(["results", str(tmp_path / "bench"), "--gpu", "H2000"]) == 2
    assert "not known as a GPU kind" in one_line_error(capsys, "--gpu")


# --- resume: configurations already measured are not drawn again (no Ray, no GPU) ---------------------------------
def test_a_resumed_search_does_not_draw_a_measured_configuration_again(tmp_path):
    """A resumed sampler starts its seed's draws again (a 4-trial search, killed and resumed, ended with 2 distinct
    configurations), and TPE proposes its best again. A draw of a configuration the study measured is skipped and
    replaced by a random one not measured - here even with the very same seed - and a trial the killed driver left
    RUNNING counts as measured where the store holds its row."""
    space, url = tiny_space(), default_url(str(tmp_path))
    store = Store(url)
    ostorage = optuna.storages.RDBStorage(url)

    def draw(searcher, tid, value=None):
        searcher.suggest(tid)
        params = json.dumps(searcher.drawn[tid].params, sort_keys=True)
        if value is not None:
            searcher.on_trial_complete(tid, {service.METRIC: value, "status": "ok"})  # as a trial reports
            store.add_trial("s", tid, None, "ok", False, value, {})
        return params

    first = make_searcher(space, "s", ostorage, make_sampler(1, 4))
    a1 = draw(first, "a1", 10.0)
    draw(first, "a2")  # the driver is killed while a2 runs: nothing stored, left RUNNING
    a3 = draw(first, "a3")  # a3 ended and was stored, but the driver died before telling Optuna
    store.add_trial("s", "a3", None, "ok", False, 30.0, {})
    cut = []
    assert recover_interrupted(ostorage, "s", store, cut) >= 3  # the study's trials, draws skipped already included
    by_tune = {t.user_attrs[service.TUNE_ID]: t for t in optuna.load_study(study_name="s", storage=ostorage).trials}
    # what the driver prints of it (the live table never showed a2): its number, its settings, how long it ran
    assert [(c["number"], c["steps"]) for c in cut] == [(by_tune["a2"].number, 0)], cut
    assert cut[0]["params"] == by_tune["a2"].params and cut[0]["params"] and 0 <= cut[0]["seconds"] < 600
    assert by_tune["a2"].state == optuna.trial.TrialState.FAIL and by_tune["a2"].user_attrs["status"] == "not run"
    assert by_tune["a3"].state == optuna.trial.TrialState.COMPLETE and by_tune["a3"].value == 30.0
    assert by_tune["a3"].constraints == {"infeasible": 0.0}  # TPE knows it was feasible

    plain = optuna.create_study(sampler=make_sampler(1, 4), direction="maximize")
    space.sample(plain.ask())
    assert json.dumps(plain.trials[0].params, sort_keys=True) == a1  # the replay, without the check
    again = make_searcher(space, "s", ostorage, make_sampler(1, 4))  # the same seed: the worst case
    b1 = draw(again, "b1", 40.0)
    b2 = draw(again, "b2", 50.0)
    assert len({a1, a3, b1, b2}) == 4  # every configuration of the space, each once
    study = optuna.load_study(study_name="s", storage=ostorage)
    skipped = [t for t in study.trials if "skipped" in t.user_attrs]
    assert skipped and all(t.state == optuna.trial.TrialState.PRUNED for t in skipped)  # nothing failed (was FAIL)
    explored = [t.state for t in study.trials if "explore" in t.user_attrs]
    assert explored == [optuna.trial.TrialState.COMPLETE] * len(skipped)
    n = len(study.trials)
    assert draw(again, "b3", 60.0) in {a1, a3, b1, b2}  # none left: the repeat is handed to Tune at once (the
    assert len(optuna.load_study(study_name="s", storage=ostorage).trials) == n + 1  # store answers it), no redraw


# --- one real tiny search: Ctrl-C, then --resume with more trials and --json -------------------------------------
FIXED = ["--set", "optimizer_state=fp32", "--set", "activation_offload=off", "--set", "optimizer_impl=auto",
         "--set", "compile=false", "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "tf32=true",
         "--set", "attention=sdpa", "--set", "sdpa_backend=math", "--set", "precision=fp32", "--set", "fsdp=off"]


def test_a_trial_the_time_budget_ends_is_shown_with_its_settings(tmp_path, capsys, ray_local, monkeypatch):
    """A trial still running when the budget ran out has no record and no row in the live table: the driver says
    which it was, for how long it ran, and its settings (a 2m23s MoE trial on the H100 was shown nowhere)."""
    monkeypatch.setenv("TRAINSCOUT_FAULT_SCHEDULE", "0:hang")  # trial 0 stops making progress at its first step
    out = tmp_path / "s"
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--global-batch", "4",
               "--time-budget", "15", "--out", str(out), *FIXED])  # counted from main's start: the trial starts
    cap = capsys.readouterr()
    err = cap.err
    cut = [line for line in cap.out.splitlines() if line.startswith("  trial 0: ended by the time budget after ")]
    assert len(cut) == 1 and "before its first timed step; no record, not counted: " in cut[0], cap.out[-3000:]
    assert "micro_batch_size=" in cut[0]
    assert rc == 1 and err.strip().splitlines()[-1].startswith("trainscout: error: this run of s ended no trial")
    study = optuna.load_study(study_name="s", storage=default_url(str(out)))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL]


@pytest.mark.timeout(1500)
def test_a_search_interrupted_then_resumed_with_more_trials(tmp_path, capsys, ray_local):
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1, 2]\nactivation_checkpointing: [none, full]\n")
    out = tmp_path / "s"
    argv = ["search", "--model", "tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--global-batch", "4",
            "--seed", "1", "--space", str(space), "--out", str(out), *FIXED]
    returned = threading.Event()

    def ctrl_c_after_the_first_trial():  # only while the search's own handler is installed (Tune is running)
        store = None
        while not returned.wait(0.1):
            if store is None and (out / "results.db").exists():
                store = Store(default_url(str(out)))
            handler = getattr(signal.getsignal(signal.SIGINT), "__qualname__", "")
            if store is not None and store.trials("s") and handler.startswith("catch_interrupt"):
                os.kill(os.getpid(), signal.SIGINT)
                return
    threading.Thread(target=ctrl_c_after_the_first_trial, daemon=True).start()
    try:
        rc = main(argv + ["--trials", "3"])
    finally:
        returned.set()
    cap = capsys.readouterr()
    assert rc == 130, cap.err[-3000:]
    store = Store(default_url(str(out)))
    before = store.trials("s")
    n = len(before)  # a warm worker's trial takes well under a second: Ctrl-C may land after the second
    assert 1 <= n < 3, before
    ended = "1 trial ended and is kept" if n == 1 else f"{n} trials ended and are kept"
    assert (f"interrupted: {ended} in the store; continue with: trainscout search --resume {out}"
            in cap.err), cap.err[-3000:]
    study = optuna.load_study(study_name="s", storage=default_url(str(out)))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]  # one was left per Ctrl-C

    t0 = time.time()
    assert main(["search", "--resume", str(out), "--trials", "4", "--json"]) == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)  # the JSON alone on stdout
    assert summary["trials"] == 4 and "interrupted" not in summary
    assert f"resuming s: --trials 3 -> 4: {4 - n} to go" in cap.err and "best tok/s" in cap.err, cap.err[-3000:]
    after = store.trials("s")
    assert len(after) == 4 and after[:n] == before  # what was measured before Ctrl-C is kept as it was
    configs = {(t["config"]["micro_batch_size"], t["config"]["activation_checkpointing"]) for t in after}
    assert len(configs) == 4, after  # the resume drew no configuration again (all 4 of the space)
    study = optuna.load_study(study_name="s", storage=default_url(str(out)))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    ok = [m for m in store.measurements() if m.ok]
    assert ok, [t["status"] for t in after]
    for m in ok:  # the mean per-token loss of a step, not divided by the accumulation (2 or 4 micro-batches here)
        assert m.grad_accum >= 2 and 0.8 * math.log(512) < m.metrics["loss"] < 1.5 * math.log(512), m.metrics["loss"]

    assert main(["results", str(out), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4 and {r["world_size"] for r in rows} <= {"1", ""} and "error" in rows[0]
    print(f"resume of {4 - n} trials: {time.time() - t0:.0f} s")

    # a time budget for a resume: a run that ends no trial says why and does not exit 0 (it exited 0 with 0 trials
    # and left a RUNNING one); one long enough runs trials (the space is measured in full: the store answers them)
    assert main(["search", "--resume", str(out), "--trials", "6", "--time-budget", "0.01"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("trainscout: error: this run of s ended no trial: the time budget") and "longer" in err, err
    assert main(["search", "--resume", str(out), "--trials", "6", "--time-budget", "20"]) == 0
    capsys.readouterr()
    assert len(store.trials("s")) > 4
    study = optuna.load_study(study_name="s", storage=default_url(str(out)))
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                          ("1h 30m 10s", 5410), ("1.5h", 5400), ("600", 600)])
def test_time_budgets_in_the_forms_people_type(text, seconds):
    from trainscout.cli.flags import duration
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "1m1h", "30mm", "1h30", "-5m", "abc"])
def test_a_time_budget_that_is_not_one_is_refused_naming_the_forms(text, capsys):
    assert main(["search", "--model", "tiny", "--device", "cpu", f"--time-budget={text}"]) == 2
    assert "1h30m" in capsys.readouterr().err


def test_a_renamed_search_folder_is_resumed_under_the_search_s_name(tmp_path, capsys):
    """`--resume` of a folder renamed since the search started said "no search recorded there": its store's one search
    is the one to continue (here refused for asking fewer trials than it has, the check after it was found)."""
    bench_store(tmp_path)
    moved = tmp_path / "renamed"
    (tmp_path / "bench").rename(moved)
    assert main(["search", "--resume", str(moved), "--trials", "1"]) == 2
    assert "is fewer than the search's 4" in one_line_error(capsys, "--trials")


def test_a_measurement_imported_beside_a_search_is_listed_by_results(tmp_path, capsys):
    """An imported measurement was hidden from `results` (and the report) in a store with a search, while
    `export --best` could write it: every measurement is listed, those no search ran without a search name."""
    store = bench_store(tmp_path)
    other = Store(f"sqlite:///{os.path.join(ROOT, 'bench', 'data', 'gpu-2026-11-30-s4', 'kernels', 'results.db')}")
    lines = tmp_path / "pooled.jsonl"
    other.export_jsonl(str(lines))
    assert main(["results", str(tmp_path / "bench"), "--import", str(lines)]) in (0, 1)  # 1: some refused, said
    capsys.readouterr()
    imported = {m.key for m in store.measurements()} - {t["key"] for n in store.searches() for t in store.trials(n)}
    assert imported
    assert main(["results", str(tmp_path / "bench"), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    listed = {r["key"]: r for r in rows}
    assert imported <= set(listed) and all(listed[k]["search"] is None for k in imported)
