"""Check docs/constants.csv, the measured constants' table, against the code: each row's value is the constant's.

    python bench/constants_table.py          # one line per row; exit 1 when a value differs or a name is gone

A row's `constant` is FILE:EXPRESSION (predictor/steptime.py:GPU_PCIE_BPS['H100']), evaluated in that module; its
`source` says where the number comes from (the bench/data path, the date, the GPU), so a re-measurement edits the
row and the constant, never a comment.
"""
from __future__ import annotations

import csv
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "docs", "constants.csv")


def module_of(path: str) -> str:
    """predictor/steptime.py -> trainscout.predictor.steptime (pyproject's package-dir: folders are trainscout.*)."""
    return "trainscout." + path[:-len(".py")].replace("/", ".")


def check(table: str = TABLE) -> list[str]:
    """What differs between the table and the code (empty: nothing)."""
    bad = []
    with open(table, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            path, expr = row["constant"].split(":", 1)
            try:
                got = eval(expr, vars(importlib.import_module(module_of(path))))  # noqa: S307 - the table's own names
            except Exception as e:  # noqa: BLE001 - whatever the expression raises is a difference
                bad.append(f"{row['constant']}: {type(e).__name__}: {e}")
                continue
            if float(got) != float(row["value"]):
                bad.append(f"{row['constant']}: the table says {row['value']}, the code {got!r}")
            else:
                print(f"ok  {row['constant']} = {got!r}")
    return bad


def main() -> int:
    bad = check()
    for line in bad:
        print(f"DIFFERS  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
