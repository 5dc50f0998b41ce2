"""Stock consumers load the exports unchanged (issue 49, item 1): training_args.json is a plain TrainingArguments
file at the installed transformers, `TrainingArguments(**json.load(f))` and `HfArgumentParser(TrainingArguments)
.parse_json_file` take it, the FSDP2 export builds without transformers' deprecation warning (fsdp given as a string),
and the version it was written for is in trainscout.json, where trainscout's own readers find it. Real measurements:
tiny on 2 gloo ranks (plain DDP, FSDP2 full_shard, FSDP2 shard_grad_op)."""
import contextlib
import json
import logging
import os
import warnings

import pytest

from trainscout.cli.main import main
from trainscout.store import Store, default_url
from trainscout.trial import run_trial

pytestmark = pytest.mark.timeout(600)
SETTINGS = {"plain": {}, "full_shard": {"fsdp": "full_shard"}, "shard_grad_op": {"fsdp": "shard_grad_op"}}


@pytest.fixture(scope="module")
def exports(tmp_path_factory, ray_local):
    """Each measurement exported in every format; {name: export folder}."""
    d = str(tmp_path_factory.mktemp("store"))
    store = Store(default_url(d))
    store.add_search("s", {"model": "tiny"})
    out = {}
    for i, (name, settings) in enumerate(SETTINGS.items()):
        rec = run_trial("tiny", {"precision": "fp32", "micro_batch_size": 4, **settings}, device="cpu", workers=2,
                        steps=2, warmup=1, global_batch=32)
        assert rec.status == "ok", rec.error
        rec.key = f"k{i}" + "0" * 30
        store.put(rec.key, rec)
        store.add_trial("s", f"t{i}", rec.key, "ok", False, rec.metrics["tokens_per_s"], rec.config)
        folder = str(tmp_path_factory.mktemp(name))
        assert main(["export", d, "--trial", rec.key, "--format", "all", "--out", folder]) == 0
        out[name] = folder
    return out


@contextlib.contextmanager
def transformers_warnings():
    """Every warning transformers gives meanwhile: its logger's records and Python warnings."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    handler, logger = Keep(level=logging.WARNING), logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield seen
        seen.extend(str(w.message) for w in caught)
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_training_args_json_is_a_plain_trainingarguments_file(exports, name, tmp_path):
    import transformers
    from transformers import HfArgumentParser, TrainingArguments
    folder = exports[name]
    path = os.path.join(folder, "training_args.json")
    with open(path, encoding="utf-8") as f:
        args = json.load(f)
    assert "transformers_version" not in args
    with contextlib.chdir(folder), transformers_warnings() as seen:  # deepspeed.json etc. are named relative to it
        built = TrainingArguments(**args)
        (parsed,) = HfArgumentParser(TrainingArguments).parse_json_file(path)
    assert [m for m in seen if "deprecated" in m.lower()] == [], seen
    assert built.per_device_train_batch_size == parsed.per_device_train_batch_size == 4
    assert built.gradient_accumulation_steps == parsed.gradient_accumulation_steps == 4
    with open(os.path.join(folder, "trainscout.json"), encoding="utf-8") as f:
        assert json.load(f)["transformers_version"] == transformers.__version__
    if name != "plain":
        assert args["fsdp"] is True and args["fsdp_config"]["reshard_after_forward"] == (name == "full_shard")
        for got in (built, parsed):
            assert got.fsdp_plugin_args["fsdp_version"] == 2
            assert got.fsdp_plugin_args["reshard_after_forward"] == (name == "full_shard")


def test_trainscouts_own_readers_take_the_plain_file_and_an_older_export(exports, tmp_path):
    """hf.training_arguments and hf.read_arguments (analysis/hf_run.py's, verify --runner hf) read the plain file;
    an export written before (transformers_version inside training_args.json, fsdp as a string) still loads."""
    from trainscout.runtime import hf
    folder = exports["shard_grad_op"]
    args = hf.training_arguments(folder, output_dir=str(tmp_path / "run"))
    assert args.fsdp_plugin_args["reshard_after_forward"] is False
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(folder):
        (old / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    written = json.loads((old / "training_args.json").read_text())
    (old / "training_args.json").write_text(json.dumps(
        {"transformers_version": "5.24.0", **written, "fsdp": "shard_grad_op"}))
    with transformers_warnings() as seen:
        again = hf.training_arguments(str(old), output_dir=str(tmp_path / "run"))
    assert [m for m in seen if "deprecated" in m.lower()] == [], seen
    assert again.fsdp_plugin_args == args.fsdp_plugin_args


def test_fsdp_spelled_for_a_transformers_without_the_flag(monkeypatch):
    """Where TrainingArguments predates fsdp=True (4.x), the strategy goes back into the string it takes."""
    from trainscout.runtime import hf
    monkeypatch.setattr(hf, "fsdp_flag", lambda: False)
    assert hf.for_installed({"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": False}})["fsdp"] \
        == "shard_grad_op"
    assert hf.for_installed({"fsdp": True, "fsdp_config": {"version": 2}})["fsdp"] == "full_shard"
    monkeypatch.setattr(hf, "fsdp_flag", lambda: True)
    got = hf.for_installed({"fsdp": "shard_grad_op offload", "fsdp_config": {"version": 2}})
    assert got == {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": False, "cpu_offload": True}}
