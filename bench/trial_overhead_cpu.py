"""Wall time of a tiny trial on the CPU (2 gloo workers) against the time inside it: what a trial costs before and
after its steps (Ray Train's worker group, the processes' imports, the model build).
Usage: python bench/trial_overhead_cpu.py [--trials 3]   (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2 for Ray's default)"""
import argparse
import os
import time

from trainscout.trial import execute, prepare
from trainscout.trial.runner import ensure_ray

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--trials", type=int, default=3)
a = p.parse_args()
t0 = time.perf_counter()
ensure_ray()
print(f"ray up in {time.perf_counter() - t0:.1f} s; RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="
      f"{os.environ.get('RAY_TRAIN_HEALTH_CHECK_INTERVAL_S', '(trainscout: 0.2)')}")
for i in range(a.trials):
    spec = prepare("tiny", {"compile": False, "precision": "fp32"}, device="cpu", workers=2, steps=3, warmup=1)
    t = time.perf_counter()
    m = execute(spec).metrics
    print(f"trial {i}: wall {time.perf_counter() - t:.1f} s, build {m['build_s']:.1f} s, warm-up {m['warmup_s']:.2f} s, "
          f"timed {m['timed_s']:.2f} s", flush=True)
