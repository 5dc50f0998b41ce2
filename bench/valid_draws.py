"""How many draws of the default space a search could hand to its trials: random draws of the knobs' domains (what the
sampler drew before its draws were valid by construction) against the search's own sampler over its space, each
judged as its trial would judge it before running (search/trainable.before_run: ok, pruned by memory, invalid by the
rules). No GPU needed: the box is described (search/dry_run.gpu_box).

    python bench/valid_draws.py --draws 200 --box H100:1 bench/models/hub/llama-3.2-1b.json ...

Prints one row per model and box: the shares of each verdict for both, and milliseconds per draw.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def shares(model: str, kind: str, gpus: int, draws: int, blind: bool, seed: int = 0) -> tuple[dict, float]:
    import optuna

    from trainscout.search.args import SearchArgs, space_for
    from trainscout.search.dry_run import gpu_box, trial_base
    from trainscout.search.searcher import make_sampler
    from trainscout.search.space import Space
    from trainscout.search.trainable import before_run
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    hw = gpu_box(kind, gpus)
    args = SearchArgs(model=model, out="unused", gpus_per_trial=gpus)
    space, _ = space_for(args, hw)
    if blind:  # the same domains, drawn without the rules
        space = Space(space.fixed, space.domains)
    base = trial_base(args, hw)
    sampler = optuna.samplers.RandomSampler(seed=seed) if blind else make_sampler(seed, draws)
    study = optuna.create_study(sampler=sampler)
    got = {"ok": 0, "pruned": 0, "invalid": 0}
    t0 = time.perf_counter()
    for _ in range(draws):
        got[before_run(space.sample(study.ask()), base)[0]] += 1
    return got, (time.perf_counter() - t0) / draws * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--box", action="append", default=None, help="KIND:GPUS, repeatable (default H100:1)")
    a = p.parse_args()
    print(f"{'model':24} {'box':8} {'random: ok/pruned/invalid, ms':>32} {'search: ok/pruned/invalid, ms':>32}")
    for model in a.models:
        for box in a.box or ["H100:1"]:
            kind, gpus = box.split(":")
            row = []
            for blind in (True, False):
                got, ms = shares(model, kind, int(gpus), a.draws, blind)
                row.append(f"{got['ok']:>8}/{got['pruned']:>8}/{got['invalid']:>8} {ms:5.0f}")
            print(f"{os.path.basename(model)[:24]:24} {box:8} {row[0]:>32} {row[1]:>32}", flush=True)


if __name__ == "__main__":
    main()
