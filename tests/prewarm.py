"""The compiled graphs of the in-process tests that compile the most on a cold cache, compiled ahead of them.

tests/conftest.py starts this at the session's start, at the lowest CPU priority (nice 19, one thread), when the
session runs these tests with others before them: a fresh clone's suite spent ~2 min of its wall compiling these
graphs (torchao's low-bit AdamW steps, one graph per parameter shape and state; the compiled layers of test_memory,
test_flops and test_trial; test_trial's compiled loss) while earlier tests left CPU time idle (waits on Ray,
subprocesses, time limits). The graphs land in the same on-disk caches (TORCHINDUCTOR_CACHE_DIR in .cache/): the
tests still compile, from the cache, as on a warm checkout, and check what they check. Measured on 2 cores with
fresh caches, 11 of the suite's files up to test_optimizer_knobs: 420 s before, 306 s with it (done 40 s before
test_flops began). A failure here (the test functions called here assert as in the suite) costs only the head
start: the tests compile their own graphs, and conftest says so at the end of the session.

Run by hand: python tests/prewarm.py (it writes .cache/prewarm.done when done; conftest skips it while that marker
matches the inputs: fingerprint())."""
import hashlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# the tests whose graphs are compiled here: conftest starts this only when the session runs one of them
TARGETS = ("tests/test_flops.py::test_the_experts_compute_in_the_autocast_dtype",
           "tests/test_memory.py::test_per_layer_compile_compiles_every_layer",
           "tests/test_optimizer_knobs.py::",
           "tests/test_trial.py::test_compile_scope_layers_compiles_each_layer_and_leaves_the_causal_mask_to_sdpa",
           "tests/test_trial.py::test_compiled_loss_gives_the_eager_loss_and_gradients")
# optimizer settings whose torchao steps the in-process tests (trained(): the tiny model, one process) and the
# 1-rank and pipeline trials of test_optimizer_knobs compile: the four states over fp32 weights, bf16 weights alone
# (torchao's _AdamW) and with the 8-bit and 4-bit states
OPTIMIZERS = ({"optimizer_state": "8bit"}, {"optimizer_state": "4bit"}, {"optimizer_state": "fp8"},
              {"optimizer_state": "bf16"}, {"precision": "bf16"}, {"precision": "bf16", "optimizer_state": "8bit"},
              {"precision": "bf16", "optimizer_state": "4bit"})


def fingerprint() -> str:
    """What the graphs compiled here depend on: this file, the tests it borrows from, torch's and torchao's
    versions."""
    from importlib.metadata import version
    h = hashlib.sha256()
    for name in ("prewarm.py", "test_flops.py", "test_memory.py", "test_optimizer_knobs.py", "test_trial.py"):
        with open(os.path.join(_HERE, name), "rb") as f:
            h.update(f.read())
    for dist in ("torch", "torchao", "transformers"):
        h.update(version(dist).encode())
    return h.hexdigest()


def marker() -> str:
    return os.path.join(os.path.dirname(os.environ["TORCHINDUCTOR_CACHE_DIR"]), "prewarm.done")


def main() -> int:
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, _HERE)
    import test_flops
    import test_memory
    import test_optimizer_knobs as opt
    import test_trial
    # in the suite's order: test_flops, test_memory, test_optimizer_knobs, then test_trial's in-process compiles
    test_flops.test_the_experts_compute_in_the_autocast_dtype()
    test_memory.test_per_layer_compile_compiles_every_layer()
    for settings in OPTIMIZERS:
        opt.trained(opt.plan_of(**settings), steps=1)
        print("compiled", settings, flush=True)
    test_trial.test_compile_scope_layers_compiles_each_layer_and_leaves_the_causal_mask_to_sdpa()
    test_trial.test_compiled_loss_gives_the_eager_loss_and_gradients()
    with open(marker(), "w") as f:
        f.write(fingerprint() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
