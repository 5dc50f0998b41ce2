"""One reading of a failed quality verdict's settings (trial.quality.failed_settings) for the search's failed-gate
skip (search/trainable._failed_gate) and the atlas' settings to avoid (atlas/lookup._failed_settings), on a real gate
step (tiny, CPU) and a real store."""
import pytest
import torch

from trainscout.spaces import REGISTRY, Knob
from trainscout.trial import prepare, quality


class Corrupt(Knob):
    """A test plugin knob that breaks the numerics: every linear's output rounded to one bit (as test_quality's)."""

    name = "test_rule_corrupt"
    default = False
    choices = (False, True)
    stage = "modules"

    def numerics(self, value, cfg, ctx):
        return "outputs of every linear rounded to one bit" if value else None

    def apply(self, plan, value, cfg, ctx):
        if value:
            plan.knobs[self.name] = True

    def transform(self, model, plan):
        if plan.knobs.get(self.name):
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.register_forward_hook(lambda mod, args, out: torch.sign(out) * 2 ** torch.round(
                        torch.log2(out.abs().clamp_min(1e-30))))
        return model


@pytest.fixture
def corrupt():
    REGISTRY[Corrupt.name] = Corrupt()
    yield Corrupt.name
    del REGISTRY[Corrupt.name]


def test_a_failed_gates_settings_are_read_one_way_by_the_search_and_the_atlas(corrupt, tmp_path):
    """A real gate step (tiny, CPU) that fails, stored and read back as a search does (search/trainable): the search's
    reason for not measuring it and the atlas' settings to avoid (atlas/lookup) both come from
    trial.quality.failed_settings; a passed verdict names none."""
    from trainscout.atlas.lookup import _failed_settings
    from trainscout.search.trainable import _failed_gate, _known_gate
    from trainscout.store import open_store
    spec = prepare("tiny", {corrupt: True}, device="cpu", steps=1, warmup=0)
    verdict = quality.one_step(spec, torch.device("cpu"))
    assert verdict["gate"] == quality.FAILED
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    gate, known = _known_gate(store, spec)
    assert known is None and _failed_gate(spec, known) is None  # no verdict yet: run it
    store.put_quality(gate, "gate", verdict)
    _, known = _known_gate(store, spec)
    settings = quality.failed_settings(known, spec.config)
    assert set(settings) == set(spec.quality["changes"]) and settings[corrupt] is True
    why = _failed_gate(spec, known)
    assert why.startswith("not measured: " + " ".join(f"{k}={v}" for k, v in settings.items()) + " failed the quality "
                          "gate in an earlier trial (")
    assert _failed_settings({"quality": verdict}, spec.config) == settings
    passed = dict(verdict, gate=quality.PASSED)
    assert quality.failed_settings(passed, spec.config) is None and _failed_gate(spec, passed) is None
    assert _failed_settings({"quality": passed}, spec.config) is None and _failed_settings({}, spec.config) is None
