"""The package's import graph: no cycle, counting imports inside functions too (where a cycle hides), and the
exports write JSON without importing torch."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("analysis", "cli", "runtime", "search", "spaces", "trial")


def _modules() -> dict[str, str]:
    """trainscout module name -> file, as pyproject's package-dir maps the top-level folders."""
    out = {}
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                    name = ".".join(["trainscout", *(rel[:-1] if rel[-1] == "__init__" else rel)])
                    out[name] = os.path.join(d, f)
    return out


def import_graph() -> dict[str, set[str]]:
    """Edges module -> trainscout modules it imports anywhere in its body (relative imports resolved)."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            graph[mod] |= {t for t in targets if t in mods and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["trainscout.trial.worker"]  # the walk found the package and its imports
    # a package __init__ importing its own submodules is not a cycle; anything else is
    found = [c for c in cycles(graph) if not all(m.startswith(min(c, key=len) + ".") or m == min(c, key=len) for m in c)]
    assert found == []


def test_exports_and_the_runtime_module_import_no_torch():
    code = ("import sys; import trainscout.analysis.export, trainscout.runtime, trainscout.trial.engines, "
            "trainscout.trial.memory; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
