"""The package's import graph, counting imports inside functions too (where a cycle hides): no cycle between modules,
none between the top-level folders, and the exports write JSON without importing torch.

The folders are layered; a folder imports only folders below it (lowest first):

    spaces    the knobs, ConfigError, what a knob reads of a model config (spaces/model_config.py: sizes)
    runtime   applying the knobs to a model (prepare_model)
    trial     running and measuring one configuration: models, engines, records
    predictor the memory, step-time and FLOP models over the model's module tree, in trial's layer: it reads the
              engines' and the models' declarations, and a trial's probe, derive and dtype check read it
    store     the results store, share files and their row format (store/row_format.py)
    analysis  tables, costs, ties, exports, the report
    atlas     the shipped measurements, predictions, lookup and its page
    search    the search service (Ray Tune + Optuna)
    cli       the command line, on top

A piece two folders share lives in the lower one (the higher one imports it, or re-exports it under its old name)."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("analysis", "atlas", "cli", "predictor", "runtime", "search", "spaces", "store", "trial")  # every folder
LAYERS = ("spaces", "runtime", "trial", "store", "analysis", "atlas", "search", "cli")  # lowest first: the docstring's
LAYER_OF = {"predictor": "trial"}  # a folder in another's layer (the docstring's)


def _modules(folders=PACKAGES) -> dict[str, str]:
    """trainscout module name -> file, as pyproject's package-dir maps the top-level folders."""
    out = {}
    for pkg in folders:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                    name = ".".join(["trainscout", *(rel[:-1] if rel[-1] == "__init__" else rel)])
                    out[name] = os.path.join(d, f)
    return out


def imports(mods: dict[str, str]):
    """(module, its file, line, imported trainscout name) of every import anywhere in a module's body: `import
    trainscout.X`, `from trainscout.X import y` (as trainscout.X.y where that is a module of mods), relative imports
    resolved against the module's package."""
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
            for t in targets:
                if t == "trainscout" or t.startswith("trainscout."):
                    yield mod, path, node.lineno, t


def import_graph() -> dict[str, set[str]]:
    """Edges module -> trainscout modules it imports anywhere in its body (relative imports resolved)."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for mod, _, _, t in imports(mods):
        if t in mods and t != mod:
            graph[mod].add(t)
    return graph


def folder_graph() -> dict[tuple[str, str], list[str]]:
    """(folder, folder it imports) -> where: "file:line" of each such import, over every module of LAYERS' folders."""
    edges: dict[tuple[str, str], list[str]] = {}
    for mod, path, line, t in imports(_modules(PACKAGES)):
        a, b = (LAYER_OF.get(f, f) for f in (mod.split(".")[1], (t.split(".") + [""])[1]))
        if b in LAYERS and b != a:
            where = edges.setdefault((a, b), [])
            if f"{os.path.relpath(path, ROOT)}:{line}" not in where:  # one per line, not per imported name
                where.append(f"{os.path.relpath(path, ROOT)}:{line}")
    return edges


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


def a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One closed path through a strongly connected component: [a, b, ..., a]."""
    start, inside = comp[0], set(comp)
    path, seen = [start], {start}
    while True:  # every node of the component reaches start, so walking towards it ends there
        here = path[-1]
        nxt = [w for w in sorted(graph[here]) if w in inside]
        if start in nxt and len(path) > 1:
            return path + [start]
        step = next((w for w in nxt if w not in seen and _reaches(graph, w, start, inside)), start)
        if step == start:
            return path + [start]
        path.append(step)
        seen.add(step)


def _reaches(graph, a, b, inside) -> bool:
    todo, seen = [a], {a}
    while todo:
        v = todo.pop()
        if v == b:
            return True
        for w in graph[v] & inside - seen:
            seen.add(w)
            todo.append(w)
    return False


def _edge_text(edges, a, b) -> str:
    where = edges[a, b]
    return f"  {a} -> {b}: {', '.join(where[:6])}" + (f" (+{len(where) - 6} more)" if len(where) > 6 else "")


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["trainscout.trial.worker"]  # the walk found the package and its imports
    # a package __init__ importing its own submodules is not a cycle; anything else is
    found = [c for c in cycles(graph) if not all(m.startswith(min(c, key=len) + ".") or m == min(c, key=len)
                                                 for m in c)]
    assert found == []


def test_no_import_cycle_between_the_top_level_folders():
    edges = folder_graph()
    assert ("cli", "search") in edges and ("trial", "spaces") in edges  # the walk found the folders and their imports
    graph = {f: {b for a, b in edges if a == f} for f in LAYERS}
    found = []
    for comp in cycles(graph):
        path = a_cycle(graph, comp)
        on_path = list(zip(path, path[1:]))
        others = [(a, b) for a, b in sorted(edges) if a in comp and b in comp and (a, b) not in on_path]
        found.append(f"folders {', '.join(comp)} import each other, e.g. {' -> '.join(path)}:\n"
                     + "\n".join(_edge_text(edges, a, b) for a, b in on_path)
                     + ("\n  the other imports among them:\n" + "\n".join(_edge_text(edges, a, b) for a, b in others)
                        if others else ""))
    assert not found, "\n".join(found)


def test_a_folder_imports_only_the_folders_below_it():
    """The layering of this module's docstring: every import between folders goes down LAYERS."""
    edges = folder_graph()
    up = [_edge_text(edges, a, b) for a, b in sorted(edges) if LAYERS.index(b) > LAYERS.index(a)]
    assert not up, f"imports up the layering {' < '.join(LAYERS)}:\n" + "\n".join(up)


def test_exports_and_the_runtime_module_import_no_torch():
    code = ("import sys; import trainscout.analysis.export, trainscout.runtime, trainscout.trial.engines, "
            "trainscout.predictor.memory; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
