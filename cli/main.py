"""The `trainscout` command line. Bad input ends with one line naming the field and the fix, and exit code 2.

--json prints the machine output alone on stdout (progress and notes go to stderr); -q leaves out progress (the
live table of a search, a progress bar, hints), -v adds the detail the code has (each failed trial's error and its
ranks' stderr tail).

The commands live by job: cli/measure.py (knobs, trial, estimate, verify, train), cli/searches.py (search,
results, export), cli/lookups.py (lookup, atlas, report); cli/parser.py builds the parser, cli/flags.py holds the
flag types and exit codes."""
from __future__ import annotations

import os
import sys
import time
import warnings

from trainscout.spaces import ConfigError

from .flags import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED
from .parser import build_parser


def version() -> str:
    """The installed distribution's version (trainscout.__version__)."""
    from trainscout import __version__
    return __version__ if __version__ != "unknown" else "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """The `trainscout` console script: parse, run the command, turn bad input into one line and exit code 2.
    started: when the command started (time.time(); default: now), which a search's --time-budget counts from."""
    started = time.time() if started is None else started
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        a = build_parser().parse_args(argv)
        a.started = started
        if a.version:
            print(f"trainscout {version()}")
            return 0
        if a.quiet and a.verbose:
            raise ConfigError("--quiet", "-q/--quiet and -v/--verbose contradict each other: give one of them")
        if not getattr(a, "func", None):
            build_parser().print_help()
            return EXIT_BAD_INPUT
        with warnings.catch_warnings():
            if a.quiet:  # libraries' deprecation notices (Optuna's, in a search) are not results
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
            return a.func(a)
    except ConfigError as e:
        text = str(e)
        if "://" in text:  # a storage URL as given, its password in it: masked (store.secrets)
            from trainscout.store.secrets import mask_urls
            text = mask_urls(text)
        print(f"trainscout: error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("trainscout: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader stopped reading (| head): no traceback, and none at exit's flush either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as e:
        from trainscout.store.guard import StoreError  # here: its imports would cost every command (docs/CLI.md)
        if not isinstance(e, StoreError):
            raise
        print(f"trainscout: error: {e}", file=sys.stderr)  # the store failed while in use: what was kept
        return EXIT_FAILED


def console() -> None:
    """The console script (and `python -m trainscout.cli`): main(), then an exit without the interpreter's teardown
    of torch's, Ray's and transformers' modules, which costs every command seconds (docs/CLI.md): what a normal exit
    does first is done here (other threads joined, the exit handlers run: Ray's shutdown, logging's flush; every open
    file flushed), then os._exit with main's code. An exception leaves as usual."""
    import psutil  # the command started with its interpreter (imports and parsing count toward --time-budget)
    code = main(started=psutil.Process().create_time())
    import atexit
    import gc
    import io
    import threading
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    kinds = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # type(), not isinstance: no __class__ read
    for f in gc.get_objects():  # files still open: os._exit would drop what their buffers hold
        if type(f) in kinds:
            try:
                if not f.closed and f.writable():
                    f.flush()
            except Exception:  # noqa: BLE001 - a broken pipe, a closed descriptor: as a normal exit would
                pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(0 if code is None else code)



if __name__ == "__main__":
    sys.exit(main())
