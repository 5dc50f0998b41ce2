"""Wall time of a tiny trial on the CPU (2 gloo workers) against the time inside it: what a trial costs before and
after its steps, in fresh worker processes and in a reused group (trial.pool), and what each measured.
Usage: python bench/trial_overhead_cpu.py [--trials 5]"""
import argparse
import statistics
import time

from trainscout.trial import execute, prepare
from trainscout.trial.ray_cluster import ensure_ray

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--trials", type=int, default=5)
a = p.parse_args()
t0 = time.perf_counter()
ensure_ray()
print(f"ray up in {time.perf_counter() - t0:.1f} s")
rows = {True: [], False: []}
for i in range(a.trials):
    for reuse in (False, True):  # interleaved: the box's state is the same for both
        spec = prepare("tiny", {"compile": False, "precision": "fp32"}, device="cpu", workers=2, steps=3, warmup=1)
        t = time.perf_counter()
        r = execute(spec, reuse=reuse)
        m, wall = r.metrics, time.perf_counter() - t
        rows[reuse].append((wall, m["tokens_per_s"]))
        print(f"trial {i} {'reused' if r.reused else 'fresh '} ({r.reused}): wall {wall:.2f} s, build "
              f"{m['build_s']:.2f} s, warm-up {m['warmup_s']:.2f} s, timed {m['timed_s']:.2f} s, "
              f"{m['tokens_per_s']:,.0f} tokens/s", flush=True)
warm = rows[True][1:]  # the first reused trial starts the group
for name, rs in (("fresh", rows[False]), ("reused", warm)):
    print(f"{name}: median wall {statistics.median(w for w, _ in rs):.2f} s, "
          f"median {statistics.median(t for _, t in rs):,.0f} tokens/s over {len(rs)} trials")
