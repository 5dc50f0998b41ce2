"""The terminal (issue 49, item 5): library noise is dropped at trainscout's import by its exact text, and nothing
else of those loggers is; tables fit the terminal's width when stdout is one, full width to a pipe."""
import subprocess
import sys


def test_torchao_and_pytree_noise_is_dropped_and_nothing_else():
    code = ("import logging, trainscout, torchao, torch\n"
            "logging.getLogger('torchao').warning('another torchao warning')\n"
            "logging.getLogger('torch.utils._pytree').warning('another pytree warning')\n")
    bare = subprocess.run([sys.executable, "-c", "import torchao"], capture_output=True, text=True, timeout=120)
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    noise = ("_C_mxfp8", "_C_cutlass", "is an Enum subclass")
    if not any(n in bare.stderr for n in noise):  # this build loads its kernels and registers no Enum: nothing to drop
        print("torchao printed none of the noise here")
    assert not [line for line in got.stderr.splitlines() if any(n in line for n in noise)], got.stderr
    assert "another torchao warning" in got.stderr and "another pytree warning" in got.stderr


def lines_over(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


def test_knobs_and_results_fit_a_terminal_and_a_pipe_gets_everything(tmp_path, capsys, monkeypatch):
    from trainscout.analysis import terminal
    from trainscout.cli.main import main
    from trainscout.store import Store, default_url
    store = Store(default_url(str(tmp_path)))
    store.add_search("s", {"model": "tiny"})
    store.add_trial("s", "t1", None, "invalid", False, 0.0, {"micro_batch_size": 4, "zero_stage": 2},
                    error="offload_params=true needs zero_stage=3 (got 2): set zero_stage=3 or offload_params=false")
    store.checkpoint()
    assert main(["knobs"]) == 0 and main(["results", str(tmp_path)]) == 0
    piped = capsys.readouterr().out
    assert "<NA>" not in piped and "NaN" not in piped
    assert max(map(len, piped.splitlines())) > 100  # a pipe: every field whole, one line a knob
    for width in (100, 60):
        monkeypatch.setattr(terminal, "terminal_width", lambda stream=None, w=width: w)  # knobs and results
        assert main(["knobs"]) == 0 and main(["results", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert not lines_over(out, width), lines_over(out, width)
        assert "zero_stage" in out and "activation_checkpointing" in out
    assert "not shown at this width" in out  # the columns left out are named


def test_the_live_table_fits_the_terminal(monkeypatch):
    import io
    from types import SimpleNamespace

    from trainscout.search import service
    from trainscout.search.space import Space
    from trainscout.spaces import all_knobs

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setenv("COLUMNS", "80")
    domains = {k.name: tuple(k.choices)[:2] for k in all_knobs() if len(tuple(k.choices or ())) >= 2}
    space = Space({k.name: k.default for k in all_knobs() if k.name not in domains}, domains)
    out = Terminal()
    printer = service.Printer(space, out, total=4, ranks=1)
    trial = SimpleNamespace(trial_id="0123456789ab", config={k: v[1] for k, v in domains.items()})
    printer(trial, {"status": "invalid", service.METRIC: 0.0, "error": "x" * 300})
    printer(trial, {"status": "ok", service.METRIC: 100.0, "projected_days": 2.0, "wall_s": 20.0})
    text = out.getvalue()
    assert not lines_over(text, 80), lines_over(text, 80)
    assert "more" in text and "…" in text  # knob=value fields left out are counted, the reason cut


def test_knobs_json_declares_each_knobs_numerics_and_reference():
    """`knobs --json`: each knob's reference value and the values whose numerics() says they train other numbers
    (in the default context), with why; a value that does so only beside another knob's setting names it."""
    import json

    from trainscout import spaces
    got = subprocess.run([sys.executable, "-m", "trainscout.cli", "knobs", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(got.stdout)}
    assert set(rows) == {k.name for k in spaces.all_knobs()}
    for r in rows.values():
        assert {"reference", "numerics", "numerics_when", "numerics_context"} <= set(r)
        assert r["reference"] not in r["numerics"]  # the reference trains the reference's numbers
    assert rows["precision"]["reference"] == "bf16-mixed" and set(rows["precision"]["numerics"]) == {
        "fp32", "fp16-mixed", "bf16"}
    assert set(rows["fp8"]["numerics"]) >= {"tensorwise"} and "off" not in rows["fp8"]["numerics"]
    assert list(rows["loss_kernel"]["numerics"]) == ["fused_linear"]
    assert rows["tf32"]["numerics_when"]["true"]["when"] == "precision=fp32"
    assert rows["micro_batch_size"]["numerics"] == {} and rows["micro_batch_size"]["numerics_when"] == {}


def on_a_terminal(argv: list[str], columns: int = 80, timeout: float = 600) -> str:
    """argv's stdout through a pseudo-terminal (COLUMNS set), as a person at an 80-column terminal sees it."""
    import os
    import pty
    import select
    import time
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns), RAY_AUTH_MODE="disabled")
    p = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if select.select([master], [], [], 1)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the other end closed
                    break
                if not data:
                    break
                out += data
            elif p.poll() is not None:
                break
        assert p.wait(timeout=30) == 0, out.decode(errors="replace")[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_columns_80_on_a_terminal_and_whole_lines_to_a_pipe(tmp_path):
    """COLUMNS=80 with stdout a terminal: no line of a 2-trial CPU search, `results` of its store, `lookup` (one
    model and every Pythia) or `knobs` is longer than 80; the same commands into a pipe keep whole lines."""
    cli = [sys.executable, "-m", "trainscout.cli"]
    out = tmp_path / "s80"
    # the commands that read no store start with the search, each on its own terminal (each is mostly its
    # interpreter's imports, which overlap the search's start); `results` reads the finished search's store
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as ex:
        piping = ex.submit(subprocess.run, cli + ["lookup", "--model", "pythia-160m"], capture_output=True, text=True,
                           timeout=120)
        shown = {name: ex.submit(on_a_terminal, cli + args) for name, args in (
            ("lookup", ["lookup", "--model", "pythia-160m"]), ("lookup all", ["lookup", "--model", "pythia-*"]),
            ("knobs", ["knobs"]))}
        # optimizer_state=fp32: torchao's low-bit and bf16 states compile their step (long on a cold cache)
        search = on_a_terminal(cli + ["search", "--model", "tiny", "--device", "cpu", "--trials", "2", "--steps", "3",
                                      "--warmup", "1", "--out", str(out), "--set", "compile=false", "--set",
                                      "loss_kernel=eager", "--set", "zero_stage=0", "--set", "optimizer_state=fp32"])
        runs = {name: f.result() for name, f in shown.items()}
        piped = piping.result()
    assert "verdict:" in search and "best, rank 1" in search
    runs.update(search=search, results=on_a_terminal(cli + ["results", str(out)]))
    for name, text in runs.items():
        assert text.strip(), name
        assert not lines_over(text, 80), (name, lines_over(text, 80))
    assert piped.returncode == 0 and lines_over(piped.stdout, 80)  # a pipe: whole lines (provenance on one)
    assert "provenance:" in runs["lookup"] and "provenance:" in piped.stdout
