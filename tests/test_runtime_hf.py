"""The runtime hook in a stock HF Trainer: a real measurement (checkpointing every 2nd layer, which
TrainingArguments cannot express) is exported; `hf.training_arguments` builds TrainingArguments of the installed
transformers with the hook's fields off, `hf.prepare` checkpoints every 2nd layer of the user's model as the trial
did, and the Trainer runs 2 optimizer steps."""
import json
import os

import pytest
import torch

from trainscout.cli.main import main
from trainscout.runtime import hf
from trainscout.store import Store, default_url
from trainscout.trial import run_trial

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, ray_local):
    d = tmp_path_factory.mktemp("hook")
    (d / "store").mkdir()
    store = Store(default_url(str(d / "store")))
    rec = run_trial("tiny", {"precision": "fp32", "activation_checkpointing": 2, "micro_batch_size": 4}, device="cpu",
                    steps=1, warmup=0, global_batch=8)
    assert rec.status == "ok", rec.error
    rec.key = "h" * 32
    store.put(rec.key, rec)
    store.checkpoint()
    out = d / "exp"
    assert main(["export", str(d / "store"), "--trial", "h", "--format", "all", "--out", str(out)]) == 0
    return str(out)


def test_the_hook_runs_the_measured_transforms_in_a_stock_trainer(export_dir, tmp_path):
    from transformers import AutoModelForCausalLM, Trainer
    exported = json.loads(open(f"{export_dir}/trainscout.json").read())
    assert exported["model_config"]["num_hidden_layers"] == 2 and exported["plan"]["checkpoint_every"] == 2
    model = hf.prepare(AutoModelForCausalLM.from_config(hf.model_config(export_dir)), export_dir)
    kinds = [type(layer).__name__ for layer in model.gpt_neox.layers]
    assert kinds == ["CheckpointWrapper", "GPTNeoXLayer"]  # every 2nd layer, from the first, as the engines do it
    ids = torch.randint(0, 512, (2, 16))
    assert model(input_ids=ids, labels=ids).logits is None  # training: no logits for accelerate to copy to fp32
    with torch.no_grad():
        assert model(input_ids=ids, labels=ids).logits.shape == (2, 16, 512)  # evaluation keeps them
    args = hf.training_arguments(export_dir, output_dir=str(tmp_path / "run"), max_steps=2)
    assert not args.gradient_checkpointing and not args.torch_compile  # the hook owns them: nothing twice
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 2
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 512, (16, 64)).tolist()]
    result = Trainer(model=model, args=args, train_dataset=data).train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))


def test_without_the_hook_the_installed_trainer_checkpoints_every_2nd_layer_itself(export_dir, tmp_path):
    """training_args.json alone, as a user without trainscout loads it: where the installed transformers has
    every-n checkpointing the stock Trainer applies it natively (and the hook list leaves it out); before that the
    export says the hook carries it. Checkpoints are saved (hourly by the measured step time), not switched off."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    args = json.loads(open(f"{export_dir}/training_args.json").read())
    import transformers
    assert "transformers_version" not in args  # a plain TrainingArguments file: trainscout.json names the version
    exported = json.loads(open(f"{export_dir}/trainscout.json").read())
    assert exported["transformers_version"] == transformers.__version__
    assert exported["launch"] == {"launcher": "python", "command": "python your_train.py"}  # plain, one rank
    assert args["save_strategy"] == "steps" and args["save_steps"] >= 1
    if not hf.native_every_n():
        assert "activation_checkpointing=2" in exported["hook"]
        return
    assert "activation_checkpointing=2" not in exported["hook"]
    assert args["activation_checkpointing_kwargs"] == {"every_n_layers": 2}
    args.update(output_dir=str(tmp_path / "run"), max_steps=1, save_strategy="no")
    model = AutoModelForCausalLM.from_config(hf.model_config(export_dir))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 512, (8, 64)).tolist()]
    Trainer(model=model, args=TrainingArguments(**args), train_dataset=data).train()
    assert [layer.gradient_checkpointing for layer in model.gpt_neox.layers] == [True, False]


def test_verify_runs_the_export_in_a_stock_trainer(export_dir, capsys):
    """trainscout verify --runner hf: the export, the hook and a stock HF Trainer in a process of their own, timed
    per optimizer step; measured against projected as for the trainscout runner."""
    store = os.path.join(os.path.dirname(export_dir), "store")
    assert main(["verify", store, "--runner", "hf", "--steps", "2", "--warmup", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["status"] == "ok", r["error"]
    assert r["runner"] == "hf" and r["world_size"] == 1 and r["measured_step_s"] > 0 and r["loss"] > 0
    assert r["ratio"] == pytest.approx(r["measured_step_s"] / r["projected_step_s"])
    assert os.path.exists(os.path.join(store, f"verify-hf-{r['key'][:12]}.json"))
    assert os.path.exists(os.path.join(r["export"], "training_args.json"))


def test_arguments_are_spelled_for_the_installed_transformers():
    fields = hf.installed_fields()
    out = hf.for_installed({"activation_checkpointing": True, "bf16": True})
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    assert out == {name: True, "bf16": True}
    # a file written by another version: its spelling of the renamed field and its version key are adapted
    for written in ("activation_checkpointing", "gradient_checkpointing"):
        [(got, value)] = hf.for_installed({written: True, "transformers_version": "4.50.0"}).items()
        assert got in fields and value is True and got in (written, name)
    with pytest.raises(ValueError, match="no field 'surely_not_a_field'"):
        hf.for_installed({"surely_not_a_field": 1})


def test_a_pipeline_measurement_is_not_exported_as_plain_ddp(tmp_path):
    """HF Trainer and accelerate have no pipeline engine: asked for by name, the format is refused (exit 2, nothing
    written); with --format all only the launch command is written, and trainscout.json says why."""
    from trainscout.analysis.export import FORMATS, export
    from trainscout.spaces import ConfigError, Context, resolve
    from trainscout.trial.models import TINY_RECIPE, resolve_model
    from trainscout.trial.records import Record
    cfg, plan = resolve({"pipeline_stages": 2, "micro_batch_size": 2, "precision": "fp32"},
                        Context(world_size=2, num_layers=2, global_batch=16))
    rec = Record.from_dict({"model": "tiny", "config": cfg, "status": "ok",
                            "model_config": resolve_model("tiny").config, "device": "cpu", "world_size": 2,
                            "plan": plan.to_dict(), "recipe": TINY_RECIPE.to_dict(), "grad_accum": plan.grad_accum,
                            "hardware": {"device": "cpu"}, "versions": {}, "metrics": {"tokens_per_s": 1.0}})
    with pytest.raises(ConfigError, match="use --format command"):
        export(rec, str(tmp_path / "hf"), ("hf",))
    assert not (tmp_path / "hf").exists()
    written = {p.rsplit("/", 1)[-1] for p in export(rec, str(tmp_path / "all"), FORMATS)}
    assert written == {"launch.sh", "trainscout.json"}
    why = json.loads((tmp_path / "all" / "trainscout.json").read_text())["not_exported"]
    assert set(why) == {"hf", "deepspeed", "accelerate"} and "trainscout train" in why["hf"]


def test_a_relative_config_json_model_searches_verifies_and_trains(tmp_path, monkeypatch, capsys, ray_local):
    """--model ./my-config.json from one directory: the search's trials (run in Ray's directories) measure it;
    verify and train, run from another directory, rebuild it from the stored config."""
    from trainscout.trial.models import resolve_model
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "my-config.json").write_text(json.dumps(resolve_model("tiny").config))
    fixed = ["--set", "precision=fp32", "--set", "micro_batch_size=4", "--set", "compile=false",
             "--set", "loss_kernel=eager", "--set", "zero_stage=0", "--set", "fsdp=off", "--set", "pipeline_stages=1",
             "--set", "activation_checkpointing=none", "--set", "attention=sdpa", "--set", "tf32=true"]
    monkeypatch.chdir(work)  # in this process, on the session's Ray (a subprocess search starts its own: 15-20 s)
    capsys.readouterr()
    assert main(["search", "--model", "./my-config.json", "--device", "cpu", "--gpus-per-trial", "1", "--trials", "1",
                 "--steps", "1", "--warmup", "0", "--global-batch", "8", "--seq-len", "64", "--out",
                 str(tmp_path / "s"), *fixed]) == 0
    assert "1 ok" in capsys.readouterr().out
    monkeypatch.chdir(elsewhere)  # the rest as the same user would run it from another directory
    assert main(["verify", str(tmp_path / "s"), "--steps", "1", "--warmup", "0"]) == 0
    assert "1 full optimizer steps" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "s"), "--best", "--format", "all", "--out", str(tmp_path / "exp")]) == 0
    assert "--model" not in (tmp_path / "exp" / "launch.sh").read_text()  # the export's stored config is the model
    capsys.readouterr()
    assert main(["train", "--config", str(tmp_path / "exp"), "--steps", "1", "--out", str(tmp_path / "ckpt"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "ok"
