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
