"""The atlas page at 10,000 rows: its weight, and how long a filter takes in headless Chromium.

    python bench/atlas_page_bench.py --rows 10000 --out /tmp/atlas10k [--screenshot docs/screenshots/atlas-10k.png]

The rows are synthetic: the shipped rows copied over and over, each copy another model name (model-sK) and its
tokens/s scaled by a seeded factor (0.5-1.5), so that grouping and filtering see 10,000 distinct rows. The page
runs each filter once when opened as atlas.html#bench and writes the times into the page, which Chromium's
--dump-dom prints (needs /usr/bin/chromium: apt-get install -y chromium).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time

CHROMIUM = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def synthetic(n: int, seed: int = 0):
    """An Atlas of n rows made from the shipped ones (see the module docstring)."""
    from trainscout.atlas import db
    base = list(db.shipped_rows())
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        r = copy.deepcopy(base[i % len(base)])
        rec = r["record"]
        rec["model"] = f"{rec['model']}-s{i // len(base)}"
        rec["trial_id"] = hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:12]
        r["key"] = hashlib.sha256(f"key:{seed}:{i}".encode()).hexdigest()[:32]
        if rec.get("status") == "ok":
            k = rng.uniform(0.5, 1.5)
            m = rec["metrics"]
            m["tokens_per_s"] *= k
            m["step_s"] /= k
            if (r.get("derived") or {}).get("mfu"):
                r["derived"]["mfu"] *= k
        rows.append(r)
    return db.Atlas([db.Layer("synthetic", "file", rows)], rows, db.shipped_model())


def chromium(args: list[str], timeout: int = 180) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                             timeout=timeout)
    return out.stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--out", required=True)
    p.add_argument("--screenshot", default=None)
    a = p.parse_args(argv)
    from trainscout.atlas import page
    t0 = time.time()
    atlas = synthetic(a.rows)
    path = page.write(atlas, a.out)
    built = time.time() - t0
    size = os.path.getsize(path)
    print(f"page: {path}: {a.rows:,} rows, {size:,} bytes ({size / a.rows:.0f} bytes a row), built in {built:.1f} s")
    if not os.path.exists(CHROMIUM[0]):
        print("no /usr/bin/chromium: the filter times need it (apt-get install -y chromium)")
        return 0
    t0 = time.time()
    dom = chromium(["--virtual-time-budget=20000", "--window-size=1400,1000", "--dump-dom",
                    "file://" + os.path.abspath(path) + "#bench"])
    times = re.search(r'<pre id="bench">([^<]*)</pre>', dom)
    count = re.search(r'id="fcount">([^<]*)<', dom)
    print(f"chromium: {times[1] if times else 'no timing in the page'}; {count[1] if count else ''} "
          f"({time.time() - t0:.1f} s with start-up)")
    if a.screenshot:
        chromium([f"--screenshot={os.path.abspath(a.screenshot)}", "--window-size=1400,1000",
                  "file://" + os.path.abspath(path)])
        print(f"screenshot: {a.screenshot}")
    return 0 if times else 1


if __name__ == "__main__":
    sys.exit(main())
