"""The quality gate (trial/quality.py): a configuration whose knobs change the numerics against its reference, one
step from the same weights and batch; and what counts as the reference."""
import pytest
import torch

from trainscout.spaces import REGISTRY, Knob
from trainscout.spaces.roles import Numerics, Runtime
from trainscout.trial import execute, prepare, quality


class Rounds(Numerics):
    def why(self, value, cfg, ctx):
        return "outputs of every linear rounded to one bit" if value else None


class RoundsOutputs(Runtime):
    def transform(self, model, plan):
        if plan.knobs.get(Corrupt.name):
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.register_forward_hook(lambda mod, args, out: torch.sign(out) * 2 ** torch.round(
                        torch.log2(out.abs().clamp_min(1e-30))))
        return model


class Corrupt(Knob):
    """A test plugin knob that breaks the numerics: every linear's output rounded to a power of two (one bit)."""

    name = "test_corrupt"
    default = False
    choices = (False, True)
    runtime = RoundsOutputs(stage="modules")
    numerics = Rounds()

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.knobs[self.name] = True


@pytest.fixture
def corrupt():
    REGISTRY[Corrupt.name] = Corrupt()
    yield Corrupt.name
    del REGISTRY[Corrupt.name]


def test_a_knob_that_corrupts_the_numerics_fails_the_gate(corrupt):
    spec = prepare("tiny", {corrupt: True}, device="cpu", steps=1, warmup=0)
    assert spec.quality["changes"] == {corrupt: "outputs of every linear rounded to one bit"}
    assert spec.quality["reference"] == {corrupt: False}
    got = quality.one_step(spec, torch.device("cpu"))
    assert got["gate"] == quality.FAILED and got["op_sqnr_db"] < quality.THRESHOLD_DB, got
    assert "output SQNR" in got["why"] and got["worst_op"]
    assert quality.status({"quality": got})[0] == quality.FAILED


def test_fp32_against_bf16_autocast_passes_the_gate_in_a_real_trial(ray_local):
    spec = prepare("tiny", {"precision": "fp32", "micro_batch_size": 4}, device="cpu", steps=2, warmup=1)
    assert set(spec.quality["changes"]) == {"precision"}  # tf32 changes nothing on the CPU
    r = execute(spec)
    assert r.ok, r.error
    q = r.m["quality"]
    # bf16 autocast's rounding against fp32: linear outputs ~50 dB, all gradients ~45 dB, the loss within 0.01 %
    assert q["gate"] == quality.PASSED and q["op_sqnr_db"] > 35 and q["grad_sqnr_db"] > 30, q
    assert q["loss_rel_diff"] < 1e-3
    assert q["reference"] == {"precision": "bf16-mixed"} and q["seconds"] > 0
    status, why = quality.status(r.m)
    assert status == quality.PASSED and "dB" in why


def test_the_reference_drops_what_only_the_changed_knobs_allowed():
    from trainscout.trial.runner import context
    cfg = {"zero_stage": 2, "offload_optimizer": True, "precision": "bf16-mixed", "fp8": "off"}
    ctx = context(prepare("tiny", {}, device="cpu").model_config, 16, 1, {"device": "cuda", "capability": "9.0"})
    changed = quality.changes(cfg, ctx)
    assert set(changed) == {"zero_stage"}
    ref = quality.reference(cfg, changed)
    assert ref["zero_stage"] == 0 and ref["offload_optimizer"] is False
    assert quality.differences(cfg, ref) == {"zero_stage": 0, "offload_optimizer": False}


def test_statuses():
    assert quality.status({"tokens_per_s": 1.0})[0] == quality.SAME
    assert quality.status({"quality": {"changes": {"fp8": "x"}, "why": "out of memory"}}) == \
        (quality.UNVERIFIED, "out of memory")
    verified = {"verdict": quality.VERIFIED, "steps": 500, "why": None}
    assert quality.status({"quality": {"gate": quality.FAILED}}, verified)[0] == quality.VERIFIED


def test_a_search_marks_its_bests_and_verify_quality_trains_both_on_real_text(tmp_path, ray_local, capsys,
                                                                            quality_tokens):
    """CLI end to end (in this process, on the session's Ray): a 2-trial CPU search of tiny with precision=fp32 fixed
    (a numerics change: the first trial takes the gate, the second is served the stored verdict), --quality strict;
    then verify --quality 24 trains it and its bf16 reference on the shipped corpus; the summary then says verified."""
    import json

    from trainscout.cli.main import main
    from trainscout.search.service import summarize
    from trainscout.store import Store, default_url
    out = tmp_path / "q"
    rc = main(["search", "--model", "tiny", "--device", "cpu", "--gpus-per-trial", "1", "--steps", "2", "--warmup", "1",
               "--trials", "2", "--out", str(out), "--set", "compile=false", "--set", "zero_stage=0", "--set",
               "fsdp=off", "--set", "loss_kernel=eager", "--set", "precision=fp32", "--set", "pipeline_stages=1",
               "--set", "micro_batch_size=8",  # verify trains 24 steps of its micro-batch: enough text to learn
               "--quality", "strict"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "quality: passed: one step against its reference (precision)" in printed, printed
    assert "--quality 500" in printed  # what to run to train both
    store = Store(default_url(str(out)))
    gates = [r.m["quality"] for r in store.measurements() if r.ok]
    assert gates and all(q["gate"] == quality.PASSED for q in gates)
    assert len(gates) < 2 or any(q.get("cached") for q in gates)  # one gate step per change in a search
    quality_tokens(out)  # the corpus' tokens, made once for the session
    assert main(["verify", str(out), "--quality", "24", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["status"] == "ok" and r["verdict"] == quality.VERIFIED, r
    assert r["reference"] == {"precision": "bf16-mixed"} and r["epochs"] < 1
    curve = r["curves"]["reference"]
    assert len(curve) == 24 and sum(curve[-4:]) < sum(curve[:4]) - 0.2  # it learns the text (lr 1e-4: slowly)
    assert abs(r["loss"]["rel_diff"]) < 0.01 and r["speed"]["ratio"] > 0
    assert (out / f"verify-quality-{r['key'][:12]}.json").exists()
    summary = summarize(store, "q", open("/dev/null", "w"), out=str(out))
    assert summary["best"][0]["quality"] == quality.VERIFIED


def test_the_gate_compiles_nothing():
    """Its step runs the transforms' torch.compile eager: a graph for the gate's batch alone would cost a compile
    per trial (the loss, compiled at 2 sequences, where the trial's steps run another micro-batch)."""
    from trainscout.trial import probe
    spec = prepare("tiny", {"precision": "fp32", "compile": True, "loss_kernel": "compiled"}, device="cpu", steps=1,
                   warmup=0)
    assert spec.plan.loss_kernel == "compiled" and "precision" in spec.quality["changes"]
    before = probe.compile_seconds()
    got = quality.one_step(spec, torch.device("cpu"))
    assert got["gate"] == quality.PASSED, got
    assert probe.compile_seconds() == before


def test_a_lean_gate_step_gives_the_same_loss_and_gradients():
    """The gate's step as a large model takes it on a GPU (each decoder layer recomputed in the backward, each
    gradient moved to the host as it is accumulated: a 7B's reference step ran out of an H100's memory without)
    gives the same loss and gradients as the plain step, here on the CPU in fp32."""
    from trainscout.spaces import Plan
    spec = prepare("tiny", {"precision": "fp32"}, device="cpu", steps=1, warmup=0)
    plan = Plan.from_dict(spec.quality["reference_plan"])
    batch = torch.randint(0, 128, (quality.GATE_BATCH, spec.recipe["seq_len"]),
                          generator=torch.Generator().manual_seed(0))
    cpu = torch.device("cpu")
    loss, grads, _, layers = quality.loss_and_grads(spec, spec.plan, batch, cpu, lean=False)
    lean_loss, lean_grads, _, _ = quality.loss_and_grads(spec, spec.plan, batch, cpu, lean=True, host_grads=True)
    assert lean_loss == loss and lean_grads.keys() == grads.keys() and len(grads) > 10
    for n, g in grads.items():
        assert torch.allclose(lean_grads[n], g, rtol=1e-5, atol=1e-7), n
    steps = quality.step_changes(lean_grads, grads, layers)
    assert steps["why"] is None and abs(steps["layer_grad_gain"] - 1) < 1e-4, steps
    assert plan.precision == "bf16-mixed"  # the reference the gate would compare against (not run here)


def test_a_failed_gates_settings_are_read_one_way_by_the_search_and_the_atlas(corrupt, tmp_path):
    """One reading of a failed verdict's settings (trial.quality.failed_settings). A real gate step (tiny, CPU) that
    fails, stored and read back as a search does (search/trainable): the search's reason for not measuring it and the
    atlas' settings to avoid (atlas/lookup) both come from trial.quality.failed_settings; a passed verdict names
    none."""
    from trainscout.atlas.lookup import gate_failed_settings
    from trainscout.search.trainable import failed_gate, known_gate
    from trainscout.store import open_store
    spec = prepare("tiny", {corrupt: True}, device="cpu", steps=1, warmup=0)
    verdict = quality.one_step(spec, torch.device("cpu"))
    assert verdict["gate"] == quality.FAILED
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    gate, known = known_gate(store, spec)
    assert known is None and failed_gate(spec, known) is None  # no verdict yet: run it
    store.put_quality(gate, "gate", verdict)
    _, known = known_gate(store, spec)
    settings = quality.failed_settings(known, spec.config)
    assert set(settings) == set(spec.quality["changes"]) and settings[corrupt] is True
    why = failed_gate(spec, known)
    assert why.startswith("not measured: " + " ".join(f"{k}={v}" for k, v in settings.items()) + " failed the quality "
                          "gate in an earlier trial (")
    assert gate_failed_settings({"quality": verdict}, spec.config) == settings
    passed = dict(verdict, gate=quality.PASSED)
    assert quality.failed_settings(passed, spec.config) is None and failed_gate(spec, passed) is None
    assert gate_failed_settings({"quality": passed}, spec.config) is None
    assert gate_failed_settings({}, spec.config) is None
