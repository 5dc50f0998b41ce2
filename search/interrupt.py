"""Ctrl-C while a search's Tune loop runs (no trial started after it, the running ones stopped, the search says so),
and Tune's log records kept to one line: a traceback beside a line that says it already, a host-OOM kill's."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from trainscout.trial.status import Status, classify

_INTERRUPTED = threading.Event()


@contextlib.contextmanager
def catch_interrupt():
    """Ctrl-C (SIGINT) while Tune runs: no trial is started, the running ones are stopped (a Tune stopper), what the
    store holds is kept, and run_search says so. Tune's own handler stops the same way but tells nobody (the search
    exited 0 with a normal summary), so it is switched off. A second Ctrl-C quits at once."""
    _INTERRUPTED.clear()

    def on_sigint(sig, frame):
        _INTERRUPTED.set()
        print("trainscout: interrupted: stopping the running trials (Ctrl-C again to quit at once)",
              file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, previous)
    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: no handler of ours (nor Tune's)
        previous = None
    env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env


@contextlib.contextmanager
def one_line_logs(*names: str):
    """Records of these loggers as one line each, their traceback's last line kept: Tune's saving of its own
    experiment state (OUT/tune) to a full disk logged a traceback beside the line that says what the store kept."""
    class OneLine(logging.Filter):
        def filter(self, record):
            if record.exc_info:
                last = next((ln for ln in reversed(logging.Formatter().formatException(record.exc_info).splitlines())
                             if ln.strip()), "")
                record.msg, record.args = f"{record.getMessage().strip()} {last.strip()}", ()
                record.exc_info, record.exc_text = None, None
            return True
    loggers, f = [logging.getLogger(n) for n in names], OneLine()
    for lg in loggers:
        lg.addFilter(f)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(f)


@contextlib.contextmanager
def quiet_host_oom():
    """Tune's traceback of a trial actor the host's memory monitor killed (Ray's 60-line OutOfMemoryError), or whose
    node left the cluster, left out: the trial's row (and the summary or the search's last line) say it in one line."""
    class Drop(logging.Filter):
        def filter(self, record):
            e = record.exc_info[1] if record.exc_info else None
            return not (e is not None and classify(str(e)) in (Status.HOST_OOM, Status.NODE_LOST))
    lg, f = logging.getLogger("ray.tune.execution.tune_controller"), Drop()
    lg.addFilter(f)
    try:
        yield
    finally:
        lg.removeFilter(f)


def interrupted() -> bool:
    """Whether Ctrl-C ended the search running (or last run) in this process."""
    return _INTERRUPTED.is_set()
