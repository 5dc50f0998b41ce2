"""Results table and exports on real measurements (tiny model, 2 gloo workers): the HF export builds
TrainingArguments and trains 2 Trainer steps; the DeepSpeed export passes DeepSpeed's own config parser."""
import io
import json
import os

import pytest
import torch

from trainscout.cli.main import main
from trainscout.store import Store, default_url
from trainscout.trial import run_trial
from trainscout.trial.models import resolve_model

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, ray_local):
    """A store with three real measurements (plain, ZeRO-2 + optimizer offload, FSDP2) and one invalid trial, as a
    search writes them."""
    d = str(tmp_path_factory.mktemp("out"))
    store = Store(default_url(d))
    store.add_search("s", {"model": "tiny"})
    for i, settings in enumerate([{"precision": "fp32"},
                                  {"precision": "fp32", "zero_stage": 2, "offload_optimizer": True},
                                  {"precision": "fp32", "fsdp": "full_shard"}]):
        rec = run_trial("tiny", {**settings, "micro_batch_size": 4}, device="cpu", workers=2, steps=2, warmup=1,
                        global_batch=32)
        assert rec.status == "ok", rec.error
        key = f"k{i}" + "0" * 30
        rec.key = key
        store.put(key, rec)
        store.add_trial("s", f"t{i}", key, "ok", False, rec.metrics["tokens_per_s"], rec.config)
    store.add_trial("s", "t9", None, "invalid", False, 0.0, {"precision": "fp16-mixed"},
                    error="precision=fp16-mixed needs a CUDA GPU: set precision=fp32 or bf16-mixed")
    store.checkpoint()
    return d


def test_load_gives_one_row_per_trial_with_knobs_and_metrics(store_dir):
    from trainscout.analysis import table
    df = table.load(store_dir)
    assert len(df) == 4 and set(df["status"]) == {"ok", "invalid"}
    ok = df[df["status"] == "ok"]
    assert (ok["tokens_per_s"] > 0).all() and set(ok["zero_stage"]) == {0, 2} and (ok["micro_batch_size"] == 4).all()
    invalid = df[df["status"] == "invalid"]
    assert invalid["tokens_per_s"].isna().all()
    assert invalid["error"].tolist() == ["precision=fp16-mixed needs a CUDA GPU: set precision=fp32 or bf16-mixed"]


def test_results_cli_formats(store_dir, capsys):
    assert main(["results", store_dir, "--status", "ok", "--sort", "tokens_per_s", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and rows[0]["tokens_per_s"] >= rows[1]["tokens_per_s"] >= rows[2]["tokens_per_s"]
    assert main(["results", store_dir, "--format", "csv"]) == 0
    assert capsys.readouterr().out.count("\n") == 5  # header + 4 trials
    assert main(["results", store_dir, "--sort", "nope"]) == 2


def test_hf_export_trains_two_steps(store_dir, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments
    out = tmp_path / "exp"
    assert main(["export", store_dir, "--trial", "k0", "--format", "all", "--out", str(out)]) == 0
    args = json.loads((out / "training_args.json").read_text())
    assert "transformers_version" not in args  # not a field: trainscout.json names the version it was written for
    provenance = json.loads((out / "trainscout.json").read_text())
    assert (provenance["model"] == "tiny" and provenance["versions"]["torch"]
            and provenance["hardware"]["device"] == "cpu")
    args.update(max_steps=2, output_dir=str(tmp_path / "run"))
    targs = TrainingArguments(**args)
    assert targs.per_device_train_batch_size == 4 and targs.gradient_accumulation_steps == 4
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**resolve_model("tiny").config))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 512, (32, 64)).tolist()]
    result = Trainer(model=model, args=targs, train_dataset=data).train()
    assert result.global_step == 2
    assert (out / "accelerate.yaml").exists() and "accelerate launch" in (out / "launch.sh").read_text()


def test_deepspeed_export_passes_deepspeeds_parser_and_accelerates_launch_checks(store_dir, tmp_path):
    """deepspeed.json leaves train_batch_size to the launch (micro-batch x accumulation x world size), so DeepSpeed
    takes it on any GPU count; accelerate.yaml leaves the precision to that file (accelerate refuses both), and the
    export ran accelerate's own launch checks on it."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import yaml
    from deepspeed.runtime.config import DeepSpeedConfig
    out = tmp_path / "ds"
    assert main(["export", store_dir, "--trial", "k1", "--format", "all", "--out", str(out)]) == 0
    cfg = json.loads((out / "deepspeed.json").read_text())
    assert "train_batch_size" not in cfg
    parsed = DeepSpeedConfig(cfg)
    assert parsed.zero_optimization_stage == 2 and parsed.gradient_accumulation_steps == 4
    assert parsed.zero_config.offload_optimizer.device == "cpu"
    assert parsed.train_batch_size == 4 * 4  # one rank here: micro-batch x accumulation
    acc = yaml.safe_load((out / "accelerate.yaml").read_text())
    assert acc["distributed_type"] == "DEEPSPEED" and "mixed_precision" not in acc
    assert acc["deepspeed_config"]["deepspeed_config_file"] == "deepspeed.json"  # relative: the folder can move


def test_fsdp2_export_is_fsdp2_for_the_installed_consumers(store_dir, tmp_path, capsys):
    """An FSDP2 measurement: TrainingArguments of the installed transformers build FSDP2 (5.x), or the export says
    training_args.json alone would run FSDP1 there and names the launch that runs FSDP2; accelerate.yaml asks for
    FSDP2 and passed accelerate's own launch checks at export time."""
    import yaml
    from transformers import TrainingArguments
    out = tmp_path / "fsdp"
    assert main(["export", store_dir, "--trial", "k2", "--format", "all", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    args = json.loads((out / "training_args.json").read_text())
    built = TrainingArguments(**{**args, "output_dir": str(tmp_path / "run")})
    notes = json.loads((out / "trainscout.json").read_text())["notes"]
    if (getattr(built, "fsdp_plugin_args", None) or {}).get("fsdp_version") == 2:
        assert notes == []
    else:
        assert "runs FSDP1" in notes[0] and "runs FSDP1" in printed
    acc = yaml.safe_load((out / "accelerate.yaml").read_text())
    assert acc["distributed_type"] == "FSDP" and acc["fsdp_config"]["fsdp_version"] == 2 and acc["num_processes"] == 2


RANKS = """
import os
from trainscout.runtime import hf
args = hf.training_arguments(".", output_dir=os.environ["OUT"], report_to="none")
# one write per rank: print's pieces, unbuffered, interleaved across the two ranks ("rankrank 0 of 2 cpu")
os.write(1, f"rank {os.environ.get('RANK', '0')} of {args.world_size} {args.device.type}\\n".encode())
"""


def test_an_export_says_how_to_launch_it_and_its_folder_can_move(store_dir, tmp_path, capsys):
    """Every export prints and writes how to launch it (the rule: README), launch.sh is executable, no file of the
    folder holds an absolute path (DeepSpeed's file is named relative to it), so the folder moves; its
    training_args.json names the transformers it was written for, and stdout points to hf.training_arguments. The
    2-rank CPU accelerate.yaml launches 2 processes (accelerate's MULTI_CPU started one without mpirun)."""
    import shutil
    import subprocess
    import sys

    import transformers

    from trainscout.runtime import hf
    for key in ("k0", "k1", "k2"):  # plain DDP, DeepSpeed ZeRO-2 + offload, FSDP2: each on 2 CPU ranks
        out = tmp_path / key
        assert main(["export", store_dir, "--trial", key, "--format", "all", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert f"launch (from {out}): accelerate launch --config_file accelerate.yaml your_train.py" in printed
        assert f"written for transformers {transformers.__version__}: load it with " \
               f"trainscout.runtime.hf.training_arguments({str(out)!r})" in printed, printed
        exported = json.loads((out / "trainscout.json").read_text())
        assert exported["launch"]["launcher"] == "accelerate"
        assert os.access(out / "launch.sh", os.X_OK)
        assert "accelerate launch --config_file" in (out / "launch.sh").read_text()
        for f in out.iterdir():
            text = f.read_text()
            assert str(tmp_path) not in text and str(store_dir) not in text, (f.name, text[:500])
        moved = tmp_path / "moved" / key
        shutil.move(str(out), str(moved))
        if key == "k1":  # inline: a stock TrainingArguments(**json) runs from any folder
            inline = json.loads((moved / "training_args.json").read_text())["deepspeed"]
            assert inline == json.loads((moved / "deepspeed.json").read_text())
            assert hf.read_arguments(str(moved))["deepspeed"] == inline
            import contextlib
            with contextlib.chdir(tmp_path):  # not the export's folder: a relative "deepspeed.json" was refused here
                stock = transformers.TrainingArguments(**json.loads((moved / "training_args.json").read_text()))
            assert stock.deepspeed == inline and stock.hf_deepspeed_config.config["zero_optimization"]["stage"] == 2
    folder = tmp_path / "moved" / "k0"
    (folder / "ranks.py").write_text(RANKS)
    import socket
    with socket.socket() as sock:  # a free port: another run's ranks on this box may hold accelerate's 29500
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate.yaml",
                          "--main_process_port", str(port), "ranks.py"], cwd=folder, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OUT=str(tmp_path / "run")))
    ranks = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank"))
    assert res.returncode == 0 and ranks == ["rank 0 of 2 cpu", "rank 1 of 2 cpu"], (ranks, res.stderr[-2000:])


def test_export_needs_best_or_trial(store_dir, tmp_path, capsys):
    assert main(["export", store_dir, "--format", "hf", "--out", str(tmp_path / "x")]) == 2
    assert main(["export", store_dir, "--trial", "zzz", "--format", "hf", "--out", str(tmp_path / "x")]) == 2
    assert main(["results", str(tmp_path / "nothing-here")]) == 2
    assert main(["export", store_dir, "--best", "--format", "all", "--out", str(tmp_path / "b")]) == 0
    # a DeepSpeed config of a measurement that ran without DeepSpeed: refused with the fix, nothing written
    assert main(["export", store_dir, "--trial", "k0", "--format", "deepspeed", "--out", str(tmp_path / "d")]) == 2
    assert "use --format hf, accelerate or command" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_results_round_trip_between_stores(store_dir, tmp_path, capsys):
    """export -> import into a fresh store: the same measurements, marked imported; a second import adds none."""
    f = tmp_path / "pool.jsonl"
    assert main(["results", store_dir, "--export", str(f)]) == 0
    fresh = tmp_path / "other"
    assert main(["results", str(fresh), "--import", str(f)]) == 0
    assert main(["results", str(fresh), "--import", str(f)]) == 0
    out = capsys.readouterr().out
    assert "imported 3 measurements, 0 already present" in out and "imported 0 measurements, 3 already present" in out
    src = {m.key: m.to_dict() for m in Store(default_url(store_dir)).measurements()}
    dst = {m.key: m.to_dict() for m in Store(default_url(str(fresh))).measurements()}
    assert src.keys() == dst.keys()
    for k in src:
        assert dst[k]["source"] == "imported:pool.jsonl"
        assert {**dst[k], "source": None} == {**src[k], "source": None}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f.read_text().replace("\n", "\n{\"not\": \"a record\"}\n", 1))  # a good line, then a bad one
    third = tmp_path / "third"
    assert main(["results", str(third), "--import", str(bad)]) == 2
    assert Store(default_url(str(third))).measurements() == []  # nothing written half-way


def test_verify_runs_full_steps_against_the_projection(store_dir, capsys):
    """verify re-measures a stored configuration with every micro-batch of every step (nothing extrapolated)."""
    assert main(["verify", store_dir, "--trial", "k0", "--steps", "3", "--warmup", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["status"] == "ok" and r["steps"] == 3 and r["measured_step_s"] > 0
    assert r["ratio"] == pytest.approx(r["measured_step_s"] / r["projected_step_s"])
    assert r["seed_method_ratio"] == pytest.approx(r["seed_method_step_s"] / r["measured_step_s"])
    assert os.path.exists(os.path.join(store_dir, f"verify-{r['key'][:12]}.json"))
    assert main(["verify", store_dir, "--trial", "nope"]) == 2
    # a shorter step than the recipe's: the measurement's projection at that batch, (A' - A) micro-batches fewer
    rec = next(m for m in Store(default_url(store_dir)).measurements() if m.key == r["key"])
    per_step = rec.recipe["global_batch"] // rec.grad_accum
    assert main(["verify", store_dir, "--trial", "k0", "--steps", "2", "--warmup", "1", "--json",
                 "--global-batch", str(per_step)]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["status"] == "ok" and short["global_batch"] == per_step != short["recipe_global_batch"]
    from trainscout.trial import metrics  # derived at A' = 1 as step_s was at A: the last micro-batch + optimizer
    assert short["projected_step_s"] == pytest.approx(metrics.project_at(rec.m["phases"], 1))
    assert short["recipe_projected_step_s"] == rec.m["step_s"] and short["measured_step_s"] > 0
    assert main(["verify", store_dir, "--trial", "k0", "--global-batch", str(per_step + 1)]) == 2
    assert f"give a multiple of {per_step}" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["k0", "k1"])  # plain (DDP on 2 ranks) and ZeRO-2
def test_train_with_an_export_on_a_token_file(store_dir, tmp_path, key, capsys):
    """search -> export -> train: real tokens from a memmap, a transformers checkpoint at the end that loads."""
    import numpy as np
    from transformers import AutoModelForCausalLM
    exp, out = tmp_path / "exp", tmp_path / "ckpt"
    assert main(["export", store_dir, "--trial", key, "--format", "all", "--out", str(exp)]) == 0
    data = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 512, 64 * 200, dtype=np.uint16).tofile(data)
    assert main(["train", "--config", str(exp), "--steps", "3", "--data", str(data), "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["status"] == "ok" and r["metrics"]["loss"] > 0 and r["data"] == str(data)
    trained = AutoModelForCausalLM.from_pretrained(out)
    from trainscout.trial.models import build_model
    torch.manual_seed(0)  # the worker's initial weights: same seed, same builder
    initial = dict(build_model(resolve_model("tiny").config, "sdpa", 64).named_parameters())
    moved = [(p - initial[n]).abs().max().item() for n, p in trained.named_parameters()]
    assert len(moved) == len(initial) and 0 < max(moved) < 0.1  # 3 AdamW steps of lr 1e-4 from the same start
    assert main(["train", "--config", str(exp), "--data", str(tmp_path / "missing.bin")]) == 2
    assert main(["train", "--config", str(tmp_path)]) == 2


def test_what_the_hook_is_worth_comes_from_the_stores_measurements(h200_grid):
    """The H200 grid (bench/data/grid-h200): for a measurement whose loss kernel only the hook applies, the export
    names the measured twin a stock Trainer would run instead (loss_kernel=eager, the rest equal) and its ratio."""
    from trainscout.analysis.export import hook_costs, hook_only
    from trainscout.analysis.table import store_of
    ms = store_of(h200_grid).measurements()
    found = 0
    for rec in (m for m in ms if m.ok and m.config.get("loss_kernel") == "compiled"):
        cost = hook_costs(rec, hook_only(rec), ms)["loss_kernel=compiled"]
        if cost is None:
            continue
        twin = next(m for m in ms if m.key == cost["key"])
        assert twin.config == dict(rec.config, loss_kernel="eager") and cost["without"] == "loss_kernel=eager"
        assert cost["ratio"] == twin.m["tokens_per_s"] / rec.m["tokens_per_s"]
        found += 1
    assert found >= 3


def test_results_of_a_store_of_measurements_alone(capsys, h200_grid):
    """bench/data/grid-h200 holds 64 measurements and no search rows: results lists them (it said "no trials")."""
    assert main(["results", h200_grid, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 64 and {r["status"] for r in rows} >= {"ok"} and all(r["key"] for r in rows)


# --- ties (issue 30): the simplest of the configurations within the measured noise of the fastest ------------------
def _measured(settings: dict, tokens_per_s: float, spread: float, key: str):
    """A stored measurement of tiny on one CPU rank, as a trial's record holds it (prepared for real, not run)."""
    from trainscout.trial import hardware, prepare
    from trainscout.trial.records import Record
    hw = hardware.fingerprint("cpu", 1)
    spec = prepare("tiny", dict(settings, precision="fp32", micro_batch_size=4), workers=1, hw=hw)
    step = spec.tokens_per_step / tokens_per_s
    m = {"tokens_per_s": tokens_per_s, "step_s": step, "measured_step_s": step, "micro_batch_s": step / 4,
         "last_micro_batch_s": step / 4, "optimizer_s": 0.001, "step_spread": spread, "rank_spread": 0.0,
         "steps_s": [step * (1 - spread / 2), step, step * (1 + spread / 2)], "slowest_rank": 0, "n_params": 1,
         "flops_per_token": 1.0, "gpu": None, "peak_tflops": None, "mfu": None, "projected_days": 1.0,
         "gpu_hours": 0.0, "peak_rss_mib": [900.0], "peak_memory_gib": 0.9, "build_s": 1.0, "warmup_s": 1.0,
         "timed_s": 3 * step, "compared_timed_s": 0.0, "alloc_retries": None, "seed_method_step_s": step, "loss": 6.0,
         "micro_batch_size": 4}
    return Record(trial_id=key[:12], model=spec.model, model_config=spec.model_config, device="cpu", world_size=1,
                  config=spec.config, plan=spec.plan, recipe=spec.recipe, grad_accum=spec.grad_accum,
                  measured_accum=spec.measured_accum, timed_steps=3, started_at="2026-12-02T00:00:00+00:00",
                  wall_s=10.0, versions={"torch": "x"}, hardware=spec.hardware, status="ok", metrics=m, key=key)


def test_a_tie_within_the_measured_noise_goes_to_the_simplest_and_is_shown(tmp_path, capsys):
    """FSDP shard_grad_op on one rank measured 0.7 % faster than the same configuration without FSDP, within the
    2 % the two measurements spread: the best is the one without FSDP (a plain `python` launch, the plain engine),
    and the search's summary, results, report and `export --best` say so. A configuration 5 % slower is no tie."""
    from trainscout.analysis import ties
    from trainscout.search.service import summarize
    fsdp = _measured({"fsdp": "shard_grad_op"}, 10070.0, 0.02, "f" * 32)
    plain = _measured({}, 10000.0, 0.02, "p" * 32)
    slow = _measured({"activation_checkpointing": "full"}, 9500.0, 0.02, "s" * 32)
    choice = ties.choose([slow, fsdp, plain])
    assert choice.best.key == plain.key and choice.fastest.key == fsdp.key and choice.is_tie
    assert [r.key for r in choice.tied] == [fsdp.key, plain.key] and choice.noise == 0.02
    assert "launched with python, not accelerate" in choice.line() and "0.7% slower" in choice.line()
    assert ties.choose([fsdp, _measured({}, 9700.0, 0.02, "q" * 32)]).best.key == fsdp.key  # 3.7 % apart: no tie
    steady = _measured({"fsdp": "shard_grad_op"}, 10070.0, 0.005, "g" * 32)
    assert ties.choose([steady, _measured({}, 9900.0, 0.005, "r" * 32)]).best.key == steady.key  # 1.7 % > 0.5 %

    out = tmp_path / "tie"
    out.mkdir()
    store = Store(default_url(str(out)))
    store.add_search("tie", {"model": "tiny"})
    for i, rec in enumerate((slow, fsdp, plain)):
        store.put(rec.key, rec)
        store.add_trial("tie", f"t{i}", rec.key, "ok", False, rec.metrics["tokens_per_s"], rec.config)
    summary = summarize(store, "tie", io.StringIO(), out=str(out))
    assert summary["best"][0]["key"] == plain.key and summary["tie"]["fastest"] == fsdp.key
    assert main(["results", str(out)]) == 0
    assert f"best: {plain.key}; the best is the simplest of 2 configurations" in capsys.readouterr().out
    assert main(["export", str(out), "--best", "--format", "hf", "--out", str(tmp_path / "exp")]) == 0
    printed = capsys.readouterr().out
    assert json.loads((tmp_path / "exp" / "trainscout.json").read_text())["key"] == plain.key
    assert "note: the best is the simplest of 2" in printed and "launch (from" in printed
    assert "python your_train.py" in printed
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rank 1 (tie)" in text and "rank 2 (tie)" in text and "The best is the simplest of 2" in text
    assert "The best is the simplest of 2" in (out / "report.html").read_text()


def test_the_summary_splits_what_trials_cost_outside_their_steps_into_the_parts_they_time():
    """A search's "where it went" line: torch.compile's own seconds apart from the probe and warm-up steps (records
    since 2026-12-05), the two together in older records."""
    from trainscout.search.summary import overhead_parts
    recs = [_measured({}, 10000.0, 0.02, str(i) * 32) for i in range(2)]
    for r, compile_s in zip(recs, (4.0, 6.0)):
        r.metrics.update(build_s=8.0, model_s=1.0, compile_s=compile_s, warmup_s=0.5, gate_s=2.0)
    line = overhead_parts(recs, [12.0, 14.0])
    assert line.startswith("model and engine 1.0 s, torch.compile 5.0 s, probe or warm-up steps 2.5 s, quality gate "
                           "2.0 s in 2 of 2, the rest 2.5 s")
    for r, handoff in zip(recs, (0.2, 0.4)):  # records since session 21 split the rest
        r.metrics.update(handoff_s=handoff, reset_s=0.5, gc_s=0.7, autotune_s=1.0)
    assert "probe or warm-up steps 2.5 s (inductor autotuning new kernels 1.0 s)" in overhead_parts(recs, [12.0, 14.0])
    assert ("the rest 2.5 s (hand-off: Ray, a worker group's start or a stopped trial's last step 0.3, the reset "
            "after 0.5, in the trial otherwise 1.7), Python's garbage collector ran 0.7 s within the trial's parts"
            ) in overhead_parts(recs, [12.0, 14.0])
    del recs[0].metrics["compile_s"]
    assert "compile and probe or warm-up steps 7.5 s" in overhead_parts(recs, [12.0, 14.0])


def test_load_gives_each_column_the_same_dtype_in_every_store(store_dir, tmp_path):
    """mfu was object dtype on a CPU store (None throughout: nlargest raised) and micro_batch_size int64 in one store,
    float or text in another: metrics are float64 and a knob's column has its domain's dtype in every store."""
    from trainscout.analysis import table
    other = Store(default_url(str(tmp_path)))
    other.add_search("o", {"model": "tiny"})
    other.add_trial("o", "t1", None, "invalid", False, 0.0, {"precision": "fp16-mixed"}, error="refused")
    other.add_trial("o", "t2", None, "pruned", False, 0.0, {"micro_batch_size": "max", "zero_stage": 1}, error="big")
    frames = [table.load(store_dir), table.load(str(tmp_path)), table.load_resolved(store_dir)]
    for df in frames:
        assert df["mfu"].dtype == "float64" and df["tokens_per_s"].dtype == "float64"
        df.nlargest(2, "mfu")  # raised TypeError on object dtype
        assert df["micro_batch_size"].dtype == object and str(df["zero_stage"].dtype) == "Int64"
        assert str(df["compile"].dtype) == "boolean"
    assert frames[0]["micro_batch_size"].dropna().tolist() == [4, 4, 4]  # the values as stored, numbers here
    assert frames[1]["micro_batch_size"].dropna().tolist() == ["max"]


def test_the_projection_at_another_global_batch_is_derived_as_the_step_was():
    """verify --global-batch compared full steps of A' micro-batches with step_s + (A' - A) x the median
    micro-batch. step_s is the median over steps of each step's projection, the micro-batch the median over all of
    them: their difference, times A - A', was 4.5 % of an 8-micro-batch step for a 0.3 % one at A = 128. The
    projection now derives the step at A' from the record's phases exactly as runner.derive derives step_s at A
    (checked against derive itself on the same raw phases), and an older record without phases gets
    (A' - 1) x micro-batch + last + optimizer."""
    from trainscout.analysis.verify import step_at
    from trainscout.trial import metrics, prepare
    from trainscout.trial.records import RankResult
    from trainscout.trial.runner import derive
    # each step's first micro-batch faster (after the optimizer step there is no gradient to add to), the others
    # drifting by 1 % a step: the median of the steps' medians (0.102) is not the median of all of them (0.101)
    steps = [{"micro": [0.090, 0.100 + 0.001 * k, 0.100 + 0.001 * k, 0.120], "optim": 0.030, "total": 0.0,
              "host_first_micro": 0.09} for k in range(5)]
    rank = RankResult(rank=0, steps=steps, micro_batch_size=2, grad_accum=128, measured_accum=4, build_s=1.0,
                      warmup_s=1.0, timed_s=1.0, peak_rss_mib=1.0)
    hw = {"device": "cpu", "cpu": "x", "cpu_count": 2}
    at = {gb: prepare("tiny", {"micro_batch_size": 2}, hw=hw, global_batch=gb, measure_accum=4) for gb in (256, 16)}
    assert at[256].grad_accum == 128 and at[16].grad_accum == 8
    m = derive(at[256], 1000, [rank])
    want = derive(at[16], 1000, [rank])["step_s"]  # what a measurement at 16 sequences projects from these phases
    assert step_at(m, 8) == pytest.approx(want, rel=1e-12)
    before = m["step_s"] + (8 - 128) * m["micro_batch_s"]
    assert before / want - 1 == pytest.approx(120 * 0.001 / want, rel=1e-6) and before / want > 1.13  # +13.9 %
    old = {k: v for k, v in m.items() if k != "phases"}
    assert step_at(old, 8) == pytest.approx(7 * m["micro_batch_s"] + m["last_micro_batch_s"] + m["optimizer_s"])
    assert metrics.project_at(m["phases"], 128) == pytest.approx(m["step_s"])


def test_a_failed_quality_verdict_is_named_and_never_best_while_anything_else_ran(tmp_path, capsys):
    """On an H100 (2026-12-06) a cold search's fastest Mistral-7B configuration (fp8 over bf16 weights) failed its
    one-step gate (embed_tokens' gradient 0.554x the reference's); the summary called it best, rank 1, and `export
    --best` would have written it. Now the fastest configuration that does not fail is best, everywhere (summary,
    results, export --best), and the failed one is named beside it; a verify --quality failure counts the same."""
    from trainscout.analysis import ties
    from trainscout.search.service import summarize
    from trainscout.trial import quality
    fast = _measured({}, 12000.0, 0.01, "a" * 32)
    fast.metrics["quality"] = {"gate": quality.FAILED, "why": "model.embed_tokens.weight's gradient is 0.554x",
                               "changes": ["fp8"]}
    ok = _measured({"activation_checkpointing": "full"}, 9000.0, 0.01, "b" * 32)
    assert ties.choose([fast, ok]).best.key == ok.key
    assert ties.choose([fast]).best.key == fast.key  # nothing else ran: it is what there is, marked
    assert ties.choose([ok, fast], {ok.key: {"verdict": quality.FAILED, "steps": 500, "why": "loss +3 %"}}) \
        .best.key == fast.key  # no clean one: the gate-failed fastest again (both failed)

    out = tmp_path / "qf"
    out.mkdir()
    store = Store(default_url(str(out)))
    store.add_search("qf", {"model": "tiny"})
    for i, rec in enumerate((fast, ok)):
        store.put(rec.key, rec)
        store.add_trial("qf", f"t{i}", rec.key, "ok", False, rec.metrics["tokens_per_s"], rec.config)
    stream = io.StringIO()
    summary = summarize(store, "qf", stream, out=str(out))
    assert [b["key"] for b in summary["best"]] == [ok.key]
    assert summary["passed_over"][0]["key"] == fast.key
    assert "not best (quality failed): 12,000 tokens/s" in stream.getvalue()
    assert main(["export", str(out), "--best", "--format", "hf", "--out", str(tmp_path / "exp")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "exp" / "trainscout.json").read_text())["key"] == ok.key
    from trainscout.analysis.report.analysis import analyse
    a = analyse(str(out))  # the report agrees: the failed one is ranked last, and its tie line is export's choice
    assert list(a.best["key"]) == [ok.key, fast.key] and a.tie.best.key == ok.key


def test_an_export_of_a_first_record_leaves_out_settings_that_are_no_knob_any_more(tmp_path, capsys):
    """A store of the first records (bench/data/...-s4/kernels) holds compile_mode, no knob today: its export carried
    it and `trainscout train` refused it as an unknown knob. It is left out of the export's config, with a note."""
    import shutil

    from trainscout.spaces import current
    store = tmp_path / "kernels"
    store.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shutil.copy(os.path.join(root, "bench", "data", "gpu-2026-11-30-s4", "kernels", "results.db"), store)
    assert main(["export", str(store), "--best", "--format", "hf", "--out", str(tmp_path / "best")]) == 0
    exported = json.loads((tmp_path / "best" / "trainscout.json").read_text())
    assert "compile_mode" not in exported["config"]
    assert any(n.startswith("compile_mode=default left out: ") for n in exported["notes"])
    from trainscout.spaces import get
    kept, notes = current({**exported["config"], "compile_mode": "default"})  # what `trainscout train` runs
    assert [get(k).name for k in kept] == list(kept) and len(notes) == 1  # every one a knob: none unknown


def test_train_runs_an_older_export_holding_a_retired_setting_and_says_so(store_dir, tmp_path, capsys):
    """An export written before compile_mode was retired holds it in its config: `trainscout train` refused it as an
    unknown knob; it trains, with one note saying the setting was left out and why."""
    exp = tmp_path / "exp"
    assert main(["export", store_dir, "--trial", "k0", "--format", "hf", "--out", str(exp)]) == 0
    exported = json.loads((exp / "trainscout.json").read_text())
    exported["config"]["compile_mode"] = "default"  # as a first record's export wrote it
    (exp / "trainscout.json").write_text(json.dumps(exported))
    capsys.readouterr()
    assert main(["train", "--config", str(exp), "--steps", "1", "--out", str(tmp_path / "ckpt"), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out.strip().splitlines()[-1])["status"] == "ok"
    notes = [ln for ln in cap.err.splitlines() if "compile_mode" in ln]
    assert notes == ["trainscout: note: compile_mode=default left out: torch.compile's mode: every compiled trial ran "
                     "its default, and `compile` says whether one was compiled"], cap.err[-2000:]
