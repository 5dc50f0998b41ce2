"""The best of several measured configurations: the fastest, unless simpler ones are within its measured noise.

A sharding engine on one GPU can measure a hair faster than the same configuration without it, within the noise,
and its export then needs more than a plain `python` script (docs/analysis.md). The rule:

- Measurements of the same model, recipe, hardware and rank count compare. A configuration B ties the fastest A
  when (tokens/s of A - tokens/s of B) / tokens/s of A <= the noise, the larger of the two measurements' step
  spreads (metrics.step_spread: (slowest - fastest) / median of the timed steps), at most TIE_CAP.
- Among A and those tied with it, the best is the simplest and most portable, compared in this order: the launcher
  its export needs (python < torchrun < accelerate < trainscout train: export.launch, from the engine and the
  ranks), the engine's portability (plain < FSDP2 < DeepSpeed < pipeline: Engine.portability), the number of
  settings only trainscout's runtime hook applies (export.hook_only), the number of knobs set away from their
  defaults; then the faster. Nothing here names a knob: simplicity comes from the plan's engine and the export.
- A measurement taken with other trials sharing its CPU or GPU (trial.contention.contended) is ranked only where
  no clean measurement is ok; one whose quality verdict is failed (the one-step gate, or `verify --quality`, which
  outranks it: trial.quality.status) only where nothing else is ok: it does not train the same model as its
  reference (docs/analysis.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainscout.trial.contention import contended
from trainscout.trial.records import Record

TIE_CAP = 0.03  # a tie is never called across more than this (a noisy measurement does not make everything equal)


@dataclass
class Choice:
    """The best configuration of a set of measurements, and the tie it was chosen from."""

    best: Record
    fastest: Record
    tied: list[Record] = field(default_factory=list)  # within the noise of the fastest, the fastest included
    noise: float = 0.0  # the tolerance the tie was called with (fraction of the fastest's tokens/s)

    @property
    def is_tie(self) -> bool:
        return self.best.key != self.fastest.key

    def line(self) -> str:
        """One sentence on the choice (empty when the fastest is the best)."""
        if not self.is_tie:
            return ""
        slower = 1 - self.best.measured.tokens_per_s / self.fastest.measured.tokens_per_s
        return (f"the best is the simplest of {len(self.tied)} configurations within the measured noise "
                f"({self.noise:.1%}) of the fastest: {self.best.key[:12]} ({why_simpler(self.best, self.fastest)}), "
                f"{slower:.1%} slower than {self.fastest.key[:12]}, a tie (rule: README, ties)")


def comparable(a: Record, b: Record) -> bool:
    """Whether two measurements can be ranked against each other: same model, recipe, hardware and ranks."""
    hw = lambda r: {k: (r.hardware or {}).get(k) for k in ("gpu", "cpu", "gpu_memory_gib")}  # noqa: E731
    return (a.model == b.model and a.model_config == b.model_config and a.recipe == b.recipe and a.device == b.device
            and a.world_size == b.world_size and hw(a) == hw(b))


def noise(a: Record, b: Record) -> float:
    """The tolerance between two measurements: the larger step spread, at most TIE_CAP."""
    return min(TIE_CAP, max(a.m.get("step_spread") or 0.0, b.m.get("step_spread") or 0.0))


def simplicity(rec: Record) -> tuple:
    """Smaller is simpler and more portable (the module docstring's order)."""
    from trainscout.spaces import all_knobs
    from trainscout.trial import engines

    from .export import hook_only, launch
    engine = engines.get(rec.plan.engine if rec.plan else "ddp")
    set_away = sum(1 for k in all_knobs() if k.name in rec.config and rec.config[k.name] != k.default)
    return (engines.LAUNCHERS.index(launch(rec)["launcher"]), engine.portability, len(hook_only(rec)), set_away)


def why_simpler(best: Record, other: Record) -> str:
    """What makes `best` simpler than `other`, in words (the first criterion that differs)."""
    from .export import hook_only, launch
    a, b = simplicity(best), simplicity(other)
    if a[0] != b[0]:
        return f"launched with {launch(best)['launcher']}, not {launch(other)['launcher']}"
    if a[1] != b[1]:
        return f"the {best.plan.engine} engine, not {other.plan.engine}"
    if a[2] != b[2]:
        return f"{a[2]} setting(s) only trainscout's hook applies, not {b[2]} ({', '.join(hook_only(other))})"
    if a[3] != b[3]:
        return f"{a[3]} knobs away from their defaults, not {b[3]}"
    return "as simple, and faster"


def choose(records: list[Record], verified: dict | None = None) -> Choice | None:
    """The best of the ok measurements among `records` (None: none ok): the fastest, or the simplest of those within
    its noise (the rule above). Records not comparable with the fastest are left out of the tie. verified: the
    store's `verify --quality` verdicts by key (Store.verified)."""
    ok = [r for r in records if r.ok and (r.measured.tokens_per_s or 0) > 0]
    if not ok:
        return None
    # measurements other trials shared the CPU or GPU of (trial.contention) rank only where no clean one is ok
    ok = [r for r in ok if not contended(r)] or ok
    ok = [r for r in ok if not failed(r, verified)] or ok
    fastest = max(ok, key=lambda r: r.measured.tokens_per_s)
    if not fastest.plan:  # a record without its plan (an older import) has nothing to judge simplicity by
        return Choice(best=fastest, fastest=fastest, tied=[fastest])
    top = fastest.measured.tokens_per_s
    tied = [r for r in ok if r.plan and comparable(r, fastest)
            and (top - r.measured.tokens_per_s) / top <= noise(fastest, r)]
    best = min(tied, key=lambda r: (simplicity(r), -r.measured.tokens_per_s))
    return Choice(best=best, fastest=fastest, tied=sorted(tied, key=lambda r: -r.measured.tokens_per_s),
                  noise=max(noise(fastest, r) for r in tied))


def failed(rec: Record, verified: dict | None = None) -> bool:
    """Whether the record's quality verdict is failed: its one-step gate, or its `verify --quality` (which outranks
    the gate)."""
    from trainscout.trial import quality
    return quality.status(rec.metrics, (verified or {}).get(rec.key), rec.config, rec.device)[0] == quality.FAILED
