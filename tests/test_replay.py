"""bench/replay.py with the real Ray Tune + Optuna + ASHA on a small grid this test writes itself (bench/grid.py's
enumeration and CSV writer, invented measurements): invariants only, nothing from real measurements."""
import json
import os
import subprocess
import sys

import pytest

from trainscout.search.space import Space
from trainscout.spaces import Context, all_knobs
from trainscout.trial import prepare
import bench_script  # tests/bench_script.py

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
grid = bench_script.load("grid")

# 2 ranks, micro-batch x pipeline stages: micro-batch 8 x 4 pipeline micro-batches does not divide the per-rank
# batch of 16, an invalid configuration the sampler can propose; 3 valid ones
SPACE = {"compile": False, "zero_stage": 0, "tf32": True, "attention": "sdpa", "activation_checkpointing": "none",
         "fsdp": "off", "precision": "fp32", "pipeline_schedule": "1f1b", "pipeline_microbatches": 4,
         "micro_batch_size": [4, 8], "pipeline_stages": [1, 2]}


def write_grid(path, fast=(4, 1)):
    hw = {"device": "cpu", "world_size": 2, "cpu": "test", "cpu_count": 2}
    kw = dict(workers=2, steps=3, warmup=1, hw=hw, seed=0)
    base = prepare("tiny", {}, **kw)
    ctx = Context(world_size=2, device="cpu", num_layers=int(base.model_config["num_hidden_layers"]),
                  global_batch=base.recipe["global_batch"])
    fixed = {k.name: k.default for k in all_knobs() if k.name not in SPACE}  # knobs added later stay out of it
    space = Space.build({**fixed, **SPACE}, {}, ctx)
    rows = grid.enumerate_rows(space, "tiny", hw, kw)
    for r in rows:
        if r["status"] != "invalid":  # one configuration dominates at every step; the others are alike, so ASHA
            # stops none of them and no configuration is charged twice (the grid's total bounds the replay's spend)
            v = 10_000.0 if (r["config"]["micro_batch_size"], r["config"]["pipeline_stages"]) == fast else 1_000.0
            r.update(status="ok", tokens_per_s=v, step_tokens_per_s=f"{v * 0.9};{v};{v * 1.1}", wall_s=10.0,
                     timed_s=3.0, gpu_s=20.0, peak_memory_gib=0.5)
    meta = {"model": "tiny", "device": "cpu", "workers": 2, "steps": 3, "warmup": 1, "seed": 0, "recipe": {},
            "hardware": hw, "space": space.describe(), "installed": []}
    grid.write_csv(str(path), meta, rows)
    return rows


def replay(*args, script="replay.py"):
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args],
                          capture_output=True, text=True, timeout=280, cwd=ROOT)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The replay of test_replay_finds_the_dominating_row_within_the_grid_total (the file's last test) on a grid
    written here, started when the file's first test starts: it runs while the bad-input commands do (its Ray's
    start is mostly waiting). (rows, Popen, the JSON's path, read() -> (stdout, stderr) once it ended, from files:
    no pipe to fill while nothing reads it)."""
    root = tmp_path_factory.mktemp("replay")
    csv_path, out = root / "grid.csv", root / "replay.json"
    rows = write_grid(csv_path)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "replay.py"), "--csv", str(csv_path), "--seeds",
                          "2", "--json", str(out)], stdout=open(root / "out", "w"), stderr=open(root / "err", "w"),
                         cwd=ROOT)

    def read():
        p.wait(timeout=280)
        return (root / "out").read_text(), (root / "err").read_text()
    yield rows, p, out, read
    if p.poll() is None:
        p.kill()
        p.wait()


@pytest.mark.parametrize("script,args,flag", [
    ("replay.py", ["--csv", "/nonexistent/grid.csv"], "--csv"),
    ("replay.py", ["--csv", "x.csv", "--seeds", "0"], "--seeds"),
    ("replay.py", ["--csv", "x.csv", "--tolerance", "1.5"], "--tolerance"),
    ("replay.py", ["--seeds", "2"], "--csv"),
    ("replay.py", ["--csv", __file__], "--csv"),  # not a grid CSV
    ("grid.py", ["--model", "tiny", "--csv", "x.csv", "--space", "/nonexistent.yaml", "--dry-run"], "--space"),
    ("grid.py", ["--model", "tiny", "--csv", "x.csv", "--workers", "0"], "--gpus-per-trial"),
    ("grid.py", ["--model", "tiny", "--csv", "x.csv", "--shard", "2/2", "--dry-run"], "--shard"),
    ("replay.py", ["--csv", "bench/data/grid-h200-160m.csv"], "--csv"),  # 8 rows not measured: names --set
    ("replay.py", ["--csv", "bench/data/grid-h200-160m.csv", "--set", "tf32=false"], "--set"),  # not searched
    ("replay.py", ["--csv", "bench/data/grid-h200-160m.csv", "--set", "micro_batch_size=8"], "--set"),
])
def test_bad_input_is_one_line_naming_the_flag(replayed, script, args, flag):
    res = replay(*args, script=script)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and flag in res.stderr


def test_replay_finds_the_dominating_row_within_the_grid_total(replayed):
    rows, p, out, read = replayed  # (started with the file's first test)
    assert sorted(r["status"] for r in rows) == ["invalid", "ok", "ok", "ok"]
    stdout, stderr = read()
    assert p.returncode == 0, stderr[-3000:]
    assert stdout.strip().splitlines()[-1].startswith("| grid.csv |")  # the table comes last
    data = json.loads(out.read_text())
    assert data["grid_gpu_s"] == 60.0 and data["best_tokens_per_s"] == 10_000.0
    assert [s["seed"] for s in data["seeds"]] == [0, 1]
    for s in data["seeds"]:
        assert s["found"] and s["tokens_per_s"] == 10_000.0
        assert 0 < s["gpu_s"] <= data["grid_gpu_s"] and 0 < s["fraction"] <= 1
        assert s["trials"] == sum(s["counts"].values()) >= 1
