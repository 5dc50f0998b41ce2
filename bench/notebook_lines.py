"""Count the library's lab-notebook lines: comment and docstring lines that carry a measured number, a date, the
history of earlier work or a bench log's path (issue 58). Such text belongs in docs/ and in data tables with their
source, where a re-measurement edits data, not code.

    python bench/notebook_lines.py               # the count, its share of the library's lines, the top files
    python bench/notebook_lines.py --top 40      # more files
    python bench/notebook_lines.py --list predictor/steptime.py   # the flagged lines of one file, with what matched
    python bench/notebook_lines.py --json        # {"flagged", "lines", "share", "files": {path: count}}

Library: the .py files of the package folders (PACKAGES), tests/ and bench/ not included. Lines: every physical
line of those files. Comments are COMMENT tokens; docstrings are string statements (a STRING token that is a whole
logical line: module, class and function docstrings and bare string statements), found with the tokenize module,
so strings in code (messages, f-strings) are never read. A line is flagged once, whatever matched (KINDS).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("spaces", "trial", "predictor", "search", "store", "atlas", "analysis", "runtime", "cli")

# a number with a unit of time, memory, rate or ratio, as a measurement writes it ("15.35 ms", "53 GB/s", "1.8x")
_UNIT = (r"(?:ns|us|µs|ms|s|sec|seconds?|min|minutes?|hours?|days?|[KMGTP]i?B(?:/s)?|[kMGTP]FLOP/?s|FLOP/s|"
         r"tokens(?:/s)?|params?/s|parameters/s|steps/s|it/s|dB)")
# versions and requirements are not measurements: "torch 2.13", ">=2.6", "Gen4", "sm_90", "CUDA 12.8"
_VERSIONED = (r"(?:torch|transformers|ray|Ray|optuna|Optuna|deepspeed|DeepSpeed|accelerate|torchao|liger|liger-kernel|"
              r"python|Python|CUDA|cuda|cuDNN|NCCL|PyTorch|pandas|numpy|matplotlib|pydantic|mlflow|MLflow|wandb|"
              r"psycopg|PostgreSQL|SQLAlchemy|SQLite|YAML|Triton|triton|inductor|version|v|Gen|sm_|compute capability|"
              r"capability|release)")
# a version or a requirement ("torch 2.13", ">=2.6", "transformers 5.2x"), or a value as typed ('"9.0"')
_VERSION_BEFORE = re.compile(rf"(?:\b{_VERSIONED}[ -]?|[<>=~^]=?\s*|[\"'])$")


class _Unversioned:
    """pattern's matches that are not a version, a requirement or a quoted value (_VERSION_BEFORE)."""

    def __init__(self, pattern: str):
        self.pattern = re.compile(pattern)

    def search(self, text: str) -> bool:
        return any(not _VERSION_BEFORE.search(text[:m.start()]) for m in self.pattern.finditer(text))


KINDS = {
    # a decimal (a measured value, a ratio, an MFU)
    "number": _Unversioned(r"(?<![\w.])\d+\.\d+(?![\w.]*\.\d)(?!\.?[A-Za-z_])"),
    # a thousands-separated count ("4,764 tokens/s") or an approximate one ("~4.9 s") is a measurement's
    "count": re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\d])|~\s?\d"),
    "unit": _Unversioned(rf"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?(?:\s?{_UNIT}(?![\w/])|\s?%|x(?![\w]))"),
    "date": re.compile(r"\b20\d\d-\d\d(?:-\d\d)?\b|\bsession \d+|\bsessions? \d+"),
    # history: earlier work and where it was recorded. Bare "was"/"were"/"earlier" are not counted: the library's
    # comments use them for a run's own past ("what was kept", "an earlier trial of this search"), not its history
    "history": re.compile(r"\b(?:used to|previously|formerly|until now|predate[sd]?|the fix of|since this release|"
                          r"before this (?:knob|release|change|fix|schema|commit|rule)|issue #?\d+|"
                          r"measured on (?:an?|the|one|this) (?:[HABL]\d|GPU|CPU|box|host|NVIDIA|\d))\b|"
                          r"\(was\b|\bwas \d|(?:^|[.:;] )Before,", re.IGNORECASE),
    "bench log": re.compile(r"bench/data\b|\w\.log\b"),
}


def library_files(root: str = ROOT) -> list[str]:
    """The library's .py files, relative to root, sorted."""
    out = []
    for pkg in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(root, pkg)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".py")]
    return sorted(out)


def prose(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment and docstring line of source, one entry per physical line."""
    out: list[tuple[int, str]] = []
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    statement_start = True  # the previous significant token ended a statement (or the file starts)
    for i, tok in enumerate(toks):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
            continue
        if tok.type in (tokenize.NL, tokenize.ENCODING):
            continue
        if tok.type == tokenize.STRING and statement_start:
            nxt = next((t for t in toks[i + 1:] if t.type not in (tokenize.NL, tokenize.COMMENT)), None)
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):  # a string statement
                for k, text in enumerate(tok.string.split("\n")):
                    out.append((tok.start[0] + k, text))
        statement_start = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


def flags(text: str) -> list[str]:
    """The kinds of notebook text a comment or docstring line carries (empty: none)."""
    return [kind for kind, pattern in KINDS.items() if pattern.search(text)]


def scan(path: str) -> tuple[int, dict[int, tuple[str, list[str]]]]:
    """(physical lines, {line: (text, kinds)}) of one file."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    flagged: dict[int, tuple[str, list[str]]] = {}
    for line, text in prose(source):
        kinds = flags(text)
        if kinds:
            prev = flagged.get(line)
            flagged[line] = (text if prev is None else prev[0] + " " + text,
                             sorted(set(kinds) | set(prev[1] if prev else ())))
    return len(source.splitlines()), flagged


def count(root: str = ROOT) -> dict:
    """{"flagged", "lines", "share", "files": {path: flagged lines}} over the library."""
    total = flagged = 0
    files: dict[str, int] = {}
    for rel in library_files(root):
        n, hits = scan(os.path.join(root, rel))
        total += n
        flagged += len(hits)
        if hits:
            files[rel] = len(hits)
    return {"flagged": flagged, "lines": total, "share": flagged / total if total else 0.0,
            "files": dict(sorted(files.items(), key=lambda kv: (-kv[1], kv[0])))}


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", metavar="FILE", help="print the flagged lines of one file")
    ap.add_argument("--top", type=int, default=20, help="how many files to name (default 20)")
    ap.add_argument("--json", action="store_true", help="the count as JSON")
    a = ap.parse_args(argv)
    if a.list:
        path = a.list if os.path.isabs(a.list) else os.path.join(ROOT, a.list)
        _, hits = scan(path)
        for line, (text, kinds) in sorted(hits.items()):
            print(f"{a.list}:{line}: [{','.join(kinds)}] {text.strip()}")
        print(f"{len(hits)} flagged lines")
        return 0
    c = count()
    if a.json:
        print(json.dumps(c, indent=1))
        return 0
    print(f"{c['flagged']} of {c['lines']} library lines ({c['share']:.2%}) carry measured numbers, dates, history "
          f"or bench-log paths in comments and docstrings")
    for path, n in list(c["files"].items())[:a.top]:
        print(f"{n:5d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
