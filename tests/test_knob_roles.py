"""The knob protocol covers every role a knob plays (issue 28): search/, analysis/ and cli/ name no knob and read
what they need from a knob's roles (spaces/roles.py: Search's start, savers, micro_batch, column, demo; Export's
fields and hook_only), so a knob from a plugin gets every role without a library file edited."""
import ast
import contextlib
import io
import json
import os
import pathlib

import pytest

from trainscout.spaces import REGISTRY, ConfigError, Knob, all_knobs, register
from trainscout.spaces.roles import Costs, Export, Search

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("search", "analysis", "cli", "atlas")  # atlas/: issue 47 (82 knob names there before, 0 after)
# (file, knob name) -> how often it may appear there, and why. Only names that are not the knob there.
ALLOWED = {
    # transformers' TrainingArguments fields spelled as the knobs are: HF_ORDER, the order training_args.json lists
    # its fields in (the knobs' own fields come from their Export.fields)
    ("analysis/export.py", "activation_checkpointing"): 1,
    # the same field in HF_ORDER, and set to None where a GPU measurement's arguments are checked on a machine
    # without a GPU (TrainingArguments refuses tf32 there)
    ("analysis/export.py", "tf32"): 2,
}


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.add(id(first.value))
    return out


def knob_names_in(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for each knob name the code uses: a string that is a name or starts `name=` (a key, a setting),
    an identifier (variable, argument, keyword, attribute; not an attribute of an imported module: re.compile).
    Docstrings, comments and prose that mentions a knob are documentation, not uses."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value.strip()
            name = next((n for n in names if text == n or text.startswith(n + "=")), None)
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, (ast.arg, ast.keyword)):
            name = node.arg
        elif isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id in modules):
            name = node.attr
        if name in names:
            out.append((node.lineno, name))
    return sorted(out)


def test_the_scan_finds_code_uses_and_leaves_documentation():
    names = {"fp8", "compile", "micro_batch_size"}
    code = '''
"""A module docstring on fp8 and compile."""
import re
def f(cfg, plan, micro_batch_size=1):  # fp8 in a comment
    """micro_batch_size in a docstring."""
    a = cfg["micro_batch_size"]
    b = dict(cfg, compile=True)
    c = plan.compile
    d = "fp8=tensorwise"
    e = f"{plan['fp8']} and the compile happens here"
    fp8 = re.compile("x")
    return "untimed steps first (compile happens here)"
'''
    assert knob_names_in(code, names) == [(4, "micro_batch_size"), (6, "micro_batch_size"), (7, "compile"),
                                          (8, "compile"), (9, "fp8"), (10, "fp8"), (11, "fp8")]


def test_search_analysis_cli_and_atlas_name_no_knob():
    """Every registered knob's name as code in search/, analysis/, cli/ and atlas/: only the allowlist's, as often as it
    says. A knob's role belongs in its own file (spaces/roles.py lists them)."""
    names = {k.name for k in all_knobs()}
    found: dict[tuple[str, str], list[int]] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, name in knob_names_in(path.read_text(encoding="utf-8"), names):
                found.setdefault((rel, name), []).append(line)
    extra = {f"{f}:{lines} {name}" for (f, name), lines in found.items() if len(lines) > ALLOWED.get((f, name), 0)}
    assert not extra, f"knob names used outside the protocol (move the role into the knob's file): {sorted(extra)}"
    stale = {k for k, n in ALLOWED.items() if len(found.get(k, [])) < n}
    assert not stale, f"allowlist entries no longer needed: {sorted(stale)}"


# --- a plugin-style knob, defined here only --------------------------------------------------------------------
WIDGET = "test_roles_widget"


class WidgetExport(Export):
    def fields(self, fmt, plan, device):
        on = plan.knobs.get(WIDGET) == "on"
        if fmt == "hf" and on:
            return {"dataloader_num_workers": 2}  # a real TrainingArguments field, so that the export builds them
        return {}


class WidgetCosts(Costs):
    def memory(self, terms, plan, spec):
        if plan.knobs.get(WIDGET) == "on":  # keeps no activations: the saver that makes anything fit
            terms.activations = terms.logits = 0


class Widget(Knob):
    """A knob of this test only: every role, none of them known to the library."""

    name = WIDGET
    default = "off"
    choices = ("off", "on")
    # a start-point step after the built-ins' (compile 1, FP8 2); a saver cheaper than every built-in one
    # (checkpointing every 4th layer: 10)
    search = Search(start=(3, "on"), savers=((5, {WIDGET: "on"}),), column=99, demo="off")
    # only the runtime hook applies it, after every built-in hook setting
    export = WidgetExport(without_hook="off", hook_rank=99)
    costs = WidgetCosts()

    def apply(self, plan, value, cfg, ctx):
        if value == "on":
            plan.knobs[self.name] = value


@pytest.fixture
def widget():
    all_knobs()  # the built-ins and plugins first: the widget is one more
    register(Widget)
    try:
        yield REGISTRY[WIDGET]
    finally:
        REGISTRY.pop(WIDGET, None)


def _gpu(hw, **more):
    return dict(hw, device="cuda", gpu_memory_gib=139.8, gpu="NVIDIA H200", gpu_count=1, capability="9.0", **more)


def test_a_plugin_knobs_start_value_and_saver_rank_are_honoured(widget, tmp_path):
    """No GPU needed (the hardware dicts describe one): the widget's start value is a GPU start point of its own
    after the compiled one, and its saver, ranked cheapest, is the one a start point adds where the defaults do not
    fit (pythia-6.9b on an H200 takes activation_checkpointing=full without it)."""
    from trainscout.cli.searches import demo_sets
    from trainscout.search.service import SearchArgs, fits, space_defaults, start_points, validate
    assert demo_sets()[WIDGET] == "off"
    args = SearchArgs(model="pythia-160m", out=str(tmp_path / "a"), device="cpu", trials=4, sets={"fp8": "off"})
    space, _, hw = validate(args)
    assert space.domains[WIDGET] == ("off", "on")
    *_, compiled, last = start_points(args, space, _gpu(hw), None)
    assert compiled["compile"] is True and compiled[WIDGET] == "off" and last == dict(compiled, **{WIDGET: "on"})

    args = SearchArgs(model="pythia-6.9b", out=str(tmp_path / "b"), device="cpu", trials=4)
    space, _, hw = validate(args)
    notes = []
    point = fits(args, space, _gpu(hw), None, space_defaults(space), notes, host=125e9)
    assert point[WIDGET] == "on" and point["activation_checkpointing"] == "none", notes
    assert notes[0].endswith(f"the start point adds {WIDGET}=on")


def test_a_plugin_knobs_column_and_export_role_are_honoured(widget, h200_grid, tmp_path):
    """`trainscout results` prints the widget's column after the built-ins'; an export carries its field in
    training_args.json and lists it among what only the hook applies, priced by its twin without it."""
    from trainscout.analysis.export import accelerate_config, export, hf_args, hook_costs, hook_only
    from trainscout.cli.main import main
    from trainscout.store import open_store
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["results", h200_grid]) == 0
    header = out.getvalue().splitlines()[0].split()
    assert header[header.index("precision") + 1] == WIDGET

    grid = [r for r in open_store("sqlite:///" + os.path.join(h200_grid, "results.db")).measurements()
            if r.ok and r.plan.engine == "ddp" and not hook_only(r)]
    off = grid[0]
    on = off.replace(config={**off.config, WIDGET: "on"}, plan=off.plan.replace(knobs={WIDGET: "on"}), key="w" * 32,
                     metrics={**off.metrics, "tokens_per_s": off.m["tokens_per_s"] * 1.25})
    off = off.replace(config={**off.config, WIDGET: "off"})
    assert (hf_args(on, "run", {})["dataloader_num_workers"] == 2
            and "dataloader_num_workers" not in hf_args(off, "run", {}))
    assert accelerate_config(on, {}) == accelerate_config(off, {})
    assert hook_only(on) == [f"{WIDGET}=on"] and hook_only(off) == []
    cost = hook_costs(on, hook_only(on), [on, off])[f"{WIDGET}=on"]
    assert cost["without"] == f"{WIDGET}=off" and cost["key"] == off.key and cost["ratio"] == pytest.approx(0.8)
    folder = tmp_path / "export"
    export(on, str(folder), ("hf", "command"), measurements=[on, off])
    assert json.loads((folder / "training_args.json").read_text())["dataloader_num_workers"] == 2
    assert json.loads((folder / "trainscout.json").read_text())["hook"] == [f"{WIDGET}=on"]


def test_a_plugin_knob_is_a_dimension_of_the_atlas_families(widget):
    """atlas/ groups by the knobs' declarations: the widget (a saver) is a dimension of a family at the levels that
    keep memory savers, without atlas/ edited; rows that differ only in it are different families."""
    from trainscout.atlas.families import DENSE, MOE, families
    from trainscout.spaces.plan import Plan
    plan = Plan.from_dict({})
    on = families({WIDGET: "on"}, plan, 1, DENSE)
    off = families({}, plan, 1, DENSE)
    assert (WIDGET, "on") in on[0] and (WIDGET, "on") in on[1] and (WIDGET, "off") in off[0]
    assert on[0] != off[0] and on[-1] == off[-1] == ()
    assert families({}, plan, 1, MOE)[0] != off[0]  # a mixture of experts is its own family


def test_the_widget_is_gone_after_its_test():
    from trainscout.spaces import get
    assert WIDGET not in REGISTRY
    with pytest.raises(ConfigError):
        get(WIDGET)
