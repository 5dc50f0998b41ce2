"""The library's shape by the measures a reader feels: functions over 60 lines, private names crossing modules,
`getattr(knob, ...)` protocol reads, the `"tokens_per_s"` literal, the Knob core's members.

Usage: python bench/house_metrics.py [--list]   (--list names every offender)
tests/test_house.py holds the library to the limits printed beside each count.
"""
import argparse
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = ("spaces", "trial", "predictor", "search", "store", "atlas", "analysis", "runtime", "cli")
LIMITS = {"long_functions": 0, "private_imports": 0, "knob_getattr": 0, "tokens_per_s_files": 3, "knob_core": 15}
MAX_LINES = 60


def library_files():
    for d in LIBRARY:
        for root, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(root, f), ROOT)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def scan(path: str) -> dict:
    """One file's offenders, by measure (private names: trainscout's own, not third parties')."""
    src = open(os.path.join(ROOT, path), encoding="utf-8").read()
    tree = ast.parse(src)
    found = {"long_functions": [], "private_imports": [], "knob_getattr": [], "tokens_per_s_files": []}
    ours = set()  # names this file binds to trainscout's modules and their public names (not third parties')
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            ours.update(a.asname or a.name for a in n.names if a.name.startswith("trainscout."))
        elif isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("trainscout")):
            for a in n.names:
                if private(a.name):
                    found["private_imports"].append(f"{path}:{n.lineno} from {n.module} import {a.name}")
                else:
                    ours.add(a.asname or a.name)  # a submodule or a public name: its attributes are checked below
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_LINES:
            found["long_functions"].append(f"{path}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)")
        elif (isinstance(n, ast.Attribute) and private(n.attr) and isinstance(n.value, ast.Name)
              and n.value.id in ours):
            found["private_imports"].append(f"{path}:{n.lineno} {n.value.id}.{n.attr}")
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
              and n.args and isinstance(n.args[0], ast.Name) and "knob" in n.args[0].id.lower()):
            found["knob_getattr"].append(f"{path}:{n.lineno} {ast.unparse(n)[:80]}")
    if '"tokens_per_s"' in src or "'tokens_per_s'" in src:
        found["tokens_per_s_files"].append(path)
    return found


def knob_core() -> list[str]:
    """The members the Knob class itself declares (attributes and methods)."""
    tree = ast.parse(open(os.path.join(ROOT, "spaces", "knob.py"), encoding="utf-8").read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Knob")
    names = []
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.append(n.target.id)
        elif isinstance(n, ast.Assign):
            names += [t.id for t in n.targets if isinstance(t, ast.Name)]
    return [x for x in names if not x.startswith("__")]


def measure() -> dict:
    out = {k: [] for k in LIMITS if k != "knob_core"}
    for path in library_files():
        for k, v in scan(path).items():
            out[k] += v
    out["knob_core"] = knob_core()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    found = measure()
    worst = 0
    for k, limit in LIMITS.items():
        n = len(found[k])
        worst |= n > limit
        print(f"{k:20} {n:5}  (limit {limit})")
        if a.list:
            for x in found[k]:
                print(f"    {x}")
    return int(worst)


if __name__ == "__main__":
    sys.exit(main())
