"""The seed paper's table from the atlas (issue 46 item 4, issue 47 item 5): per GPU kind, one GPU, the Pythia sizes
and the Llama-shaped Hub config.json files, each with the atlas's answer as `trainscout lookup` gives it: the measured
best (what `export --best` would write: quality and ties respected) or a PREDICTED row, its tokens/s, MFU (matmul-v1),
days and rent for the recipe (300 B tokens, global batch 1,024), and the configuration. Nothing is measured here.

    python bench/seed_table_atlas.py                 # H200 and H100, markdown on stdout (docs/RESULTS.md's tables)
    python bench/seed_table_atlas.py --gpu H100
"""
import argparse
import os

from trainscout.atlas import db
from trainscout.atlas.lookup import lookup

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHIA = ("pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b", "pythia-6.9b", "pythia-12b")
LLAMA = tuple(os.path.join(HERE, "models", "hub", f) for f in
              ("llama-3.2-1b.json", "llama-3.2-3b.json", "mistral-7b-v0.3.json", "llama-3.1-8b.json"))


def row(atlas, model: str, gpu: str, host_gib: float) -> str:
    got = lookup(atlas, model, gpu=gpu, gpus=1, host_memory_gib=host_gib)
    measured = next((g["rows"] for g in got["measured"] if g["rows"]), [])
    best = next((r for r in measured if r.get("best")), None)  # a failed quality verdict is never the best
    status, beside = "measured", ""
    if best is None and measured:
        r = measured[0]
        beside = f"; measured {r['tokens_per_s']:,.0f} ({r['describe']}) failed its quality verdict"
    elif best is not None and got["predicted"] and got["predicted"].get("rows"):  # measured at another batch only
        beside = f"; measured {best['tokens_per_s']:,.0f} ({best['describe']})"
        best = None
    if best is None and got["predicted"] and got["predicted"].get("rows"):
        best, status = got["predicted"]["rows"][0], "PREDICTED"
    name = got["model"]
    if best is None:
        why = "; ".join((got["predicted"] or {}).get("notes") or got["notes"])[:160] or "nothing fits one GPU"
        return f"| {name} | does not fit | | | | {why} |"
    quality = best.get("quality")
    q = f"; quality {quality[0]}" if isinstance(quality, (list, tuple)) and quality[0] not in ("same",) else ""
    mfu = f"{best['mfu']:.3f}" if best.get("mfu") else "-"
    rent = f"${best['rent_usd']:,.0f}" if best.get("rent_usd") else "-"
    return (f"| {name} | {status} {best['tokens_per_s']:,.0f} | {mfu} | {best['projected_days']:,.1f} | {rent} | "
            f"{best['describe']}{q}{beside} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="append", help="GPU kinds (default: H200 and H100)")
    ap.add_argument("--host-memory-gib", type=float, default=128.0)
    a = ap.parse_args()
    atlas = db.load(None)
    for gpu in a.gpu or ["H200", "H100"]:
        print(f"\nOne {gpu}, {a.host_memory_gib:g} GiB of host (`python bench/seed_table_atlas.py --gpu {gpu}`):\n")
        print("| model | tokens/s | MFU | days | rent | best configuration |")
        print("|---|---|---|---|---|---|")
        for model in PYTHIA + LLAMA:
            print(row(atlas, model, gpu, a.host_memory_gib), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
