"""The compiled graphs of the tests that compile the most on a cold cache, compiled ahead of them: in-process tests'
graphs in this process, then real trials' graphs in ranks of this prewarm (rank_trials()).

tests/conftest.py starts this at the session's start, at the lowest CPU priority (nice 19, one thread), when the
session runs these tests with others before them: a fresh clone's suite spent ~2 min of its wall compiling these
graphs (torchao's low-bit AdamW steps, one graph per parameter shape and state; the compiled layers of test_memory,
test_flops and test_trial; test_trial's compiled loss) while earlier tests left CPU time idle (waits on Ray,
subprocesses, time limits). The graphs land in the same on-disk caches (TORCHINDUCTOR_CACHE_DIR in .cache/): the
tests still compile, from the cache, as on a warm checkout, and check what they check. Measured on 2 cores with
fresh caches, 11 of the suite's files up to test_optimizer_knobs: 420 s before, 306 s with it (done 40 s before
test_flops began). A failure here (the test functions called here assert as in the suite) costs only the head
start: the tests compile their own graphs, and conftest says so at the end of the session.

The real trials of test_optimizer_knobs and test_trial compile in their ranks (Ray's worker processes), ~250 graph
files on a cold cache (20 s of those two files' wall here, more in a suite run); their ranks here are spawned
processes that run what a trial's Rank actor runs (setup, then each trial's train_loop and reset), without Ray, after
the in-process graphs, on a registry of running trials of their own (trial.contention: the suite's trials must not
count them as peers).

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
           "tests/test_trial.py::test_trial_measures_each_engine",
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


def rank_trials() -> list:
    """(world size, [(name, spec)]) of the real trials whose ranks compile on a cold cache, each group's trials as
    the suite runs them one after another in one group's processes (a graph compiled after others in the same
    process is not always the graph a fresh process compiles: only this order gave the suite's cache keys):
    test_optimizer_knobs' trials (torchao's steps over DDP, FSDP2 shards, pipeline stages; its expected failure,
    8-bit states forced under ZeRO-2, last), its bf16 gate on one rank, then test_trial's engines."""
    import test_optimizer_knobs as opt
    import test_trial
    return [(2, [(case, opt.trial_spec(case)) for case in sorted(opt.TRIALS)] + [("zero", opt.trial_spec("zero"))]),
            (1, [("gated", opt.trial_spec("gated"))]),
            (2, [(name, test_trial.spec_of(settings)) for name, settings in test_trial.ENGINES.items()])]


EXPECTED_TO_FAIL = {"zero"}  # its test asserts the trial fails (a DtypeMismatch): its graphs compile first


def _rank(rank: int, world: int, store: str, port: int, specs: list, done) -> None:
    """One rank of a group of this prewarm: what a trial's Rank actor does (trial.rank.Rank: setup, then run per
    trial, trial.worker's train_loop and reset), without Ray. Ends with the prewarm (PR_SET_PDEATHSIG)."""
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
    from trainscout.trial.rank import Rank
    from trainscout.trial.runner import worker_env
    r = Rank()
    r.setup(rank, world, "127.0.0.1", port, [], rank, world, "gloo", store)
    for name, spec in specs:
        os.environ.update(worker_env(spec))
        r.run(spec)
        if rank == 0:
            with done.get_lock():
                done.value += 1
            print("compiled", name, f"({world} ranks)", flush=True)


def in_ranks(world: int, specs: list) -> None:
    """specs run one after another in `world` processes (spawned: fresh interpreters, as Ray's workers), on one
    process group; a failed trial (its group's processes ended) leaves its group, the rest run in a new one."""
    import multiprocessing as mp
    import socket
    import tempfile
    import uuid
    ctx = mp.get_context("spawn")
    while specs:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        store = os.path.join(tempfile.gettempdir(), f"trainscout-prewarm-{uuid.uuid4().hex}")
        done = ctx.Value("i", 0)
        procs = [ctx.Process(target=_rank, args=(r, world, store, port, specs, done)) for r in range(world)]
        for p in procs:
            p.start()
        while any(p.is_alive() for p in procs) and all(p.exitcode in (None, 0) for p in procs):
            procs[0].join(1)
        for p in procs:  # one failed: its peers may wait on it in a collective
            if p.is_alive():
                p.kill()
            p.join()
        if os.path.exists(store):
            os.unlink(store)
        if any(p.exitcode for p in procs):
            name = specs[done.value][0]
            print("failed as its test expects:" if name in EXPECTED_TO_FAIL else "failed:", name,
                  f"({world} ranks; exit codes {[p.exitcode for p in procs]})", flush=True)
        specs = specs[done.value + 1:] if any(p.exitcode for p in procs) else []


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
    # then the real trials' ranks: in processes of their own, on a registry of running trials of their own (the
    # suite's trials would count them as peers: trial.contention), with the ranks' device environment
    os.environ.update(TRAINSCOUT_RUNNING_DIR=os.path.join("/tmp", f"trainscout-running-prewarm-{os.getpid()}"),
                      DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    for world, specs in rank_trials():
        in_ranks(world, specs)
    import shutil
    shutil.rmtree(os.environ["TRAINSCOUT_RUNNING_DIR"], ignore_errors=True)
    with open(marker(), "w") as f:
        f.write(fingerprint() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
