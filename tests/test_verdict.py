"""Should I keep searching? The rule (analysis/verdict.py) on made-up trials for each branch, on a copy of the H200
grid, and on the store of a real tiny CPU search (Ray Tune + Optuna + ASHA, in this process)."""
import pytest

from trainscout.analysis import report
from trainscout.spaces import fmt
from trainscout.analysis.verdict import DIMINISHING, ENOUGH, KEEP, of_search, space_of, verdict

pytestmark = pytest.mark.timeout(900)


def ok(tps, spread=0.01, **config):
    return {"status": "ok", "tokens_per_s": tps, "step_spread": spread, "config": config}


def test_most_trials_stopped_or_invalid_is_never_a_reason_to_stop():
    """5 of 6 trials stopped or invalid (the store the old hint read "stop" on): keep searching, and why."""
    trials = [ok(100.0), {"status": "stopped", "tokens_per_s": 40.0}, {"status": "stopped", "tokens_per_s": 30.0},
              {"status": "invalid"}, {"status": "invalid"}, {"status": "stopped", "tokens_per_s": 20.0}]
    v = verdict(trials, {"micro_batch_size": ["4", "8"]})
    assert v.word == KEEP and "too few measured" in v.why
    assert (v.measured, v.trials, v.not_measured) == (1, 6, {"stopped": 3, "invalid": 2})
    line = v.line()
    assert "1 of 6 trials measured (not measured: 3 stopped, 2 invalid)" in line
    assert "unexplored: 2 values of the search's space never measured (micro_batch_size=4|8)" in line


def test_each_branch_of_the_rule():
    flat = [ok(100.0 + i % 2, micro_batch_size="8") for i in range(8)]  # the best moves 1 %: within 2 % noise
    flat = [dict(t, step_spread=0.02) for t in flat]
    assert verdict(flat, {"micro_batch_size": ["8"]}).word == ENOUGH
    v = verdict(flat, {"micro_batch_size": ["4", "8"]})
    assert v.word == DIMINISHING and v.unexplored == {"micro_batch_size": ["4"]}
    assert verdict(flat, None).word == DIMINISHING  # no space known: never "enough"
    rising = [ok(100.0 + 10 * i, micro_batch_size="8") for i in range(8)]
    v = verdict(rising, {"micro_batch_size": ["8"]})
    assert v.word == KEEP and v.window == 5 and v.gain == pytest.approx(170 / 120 - 1)
    assert v.per_trial == pytest.approx(v.gain / 5)
    assert "best +41.7% over the last 5 measured (+8.33% per trial)" in v.line()
    # repeated measurements of a key widen the noise band where they spread more than the steps
    noisy = [dict(t, tokens_per_s_spread=0.5) for t in rising]
    v = verdict(noisy, {"micro_batch_size": ["8"]})
    assert v.noise == 0.5 and "repeated measurements" in v.noise_from and v.word == ENOUGH


def test_the_h200_grid_copy(h200_grid):
    """64 real H200 measurements (no search): the best came at the 31st, nothing since rose beyond the noise."""
    a = report.analyse(h200_grid)
    [(search, v)] = a.verdicts
    assert search is None and v.word == ENOUGH, v.line()
    assert (v.measured, v.trials, v.not_measured) == (63, 64, {"oom": 1})
    assert v.gain == 0.0 and 0.005 < v.noise < 0.03 and v.unexplored == {}
    assert v.line() in report.summary(a)
    html = report.render_html(a)
    assert "Verdict: enough" in html and "63 of 64 trials measured" in html


def test_a_real_tiny_search(tmp_path, ray_local, capsys):
    """A real 4-trial CPU search: its summary and its report say keep searching (fewer than 6 measured), with the
    searched space's never-measured values read from its Optuna study."""
    from test_search import search_here, store_of
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [4, 8]\nactivation_checkpointing: [none, full]\nprecision: bf16-mixed\n")
    out = tmp_path / "tiny"
    assert search_here(out, "--trials", "4", "--seed", "1", "--space", str(space)) == 0
    printed = capsys.readouterr().out
    store = store_of(out)
    v = of_search(store, "tiny")
    assert v.word == KEEP and "too few measured" in v.why
    assert v.line() in printed  # a pipe: one line
    assert set(space_of(store, "tiny")["micro_batch_size"]) == {"4", "8"}
    oks = [t for t in store.trials("tiny") if t["status"] == "ok"]
    for knob, values in v.unexplored.items():  # never measured: no ok trial ran them
        assert not set(values) & {fmt(t["config"].get(knob)) for t in oks}, (knob, values)
    a = report.analyse(str(out))
    assert a.verdicts[0][1].word == KEEP and "verdict: keep searching" in report.summary(a)
    # the same real rows under a shorter window: the rule reads them all the same way
    rows = [{"status": t["status"], "tokens_per_s": t["tokens_per_s"], "config": t["config"]}
            for t in store.trials("tiny")]
    oks = [r["tokens_per_s"] for r in rows if r["status"] == "ok"]
    if len(oks) >= 2:
        short = verdict(rows, None, window=1, min_measured=2)
        assert short.gain == pytest.approx(max(oks) / max(oks[:-1]) - 1)
        assert short.word == (KEEP if short.gain > short.noise else DIMINISHING)
