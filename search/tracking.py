"""search --track: Ray Tune's own logger callbacks (MLflow, W&B, TensorBoard), each Tune trial a run.

A tracker's backend is checked before the first trial (check: a short timeout, one line naming the URI with its
password masked, nothing written), and during the search a tracker whose hook raises is dropped, said once (guard):
a dead backend costs its runs, never the search."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import urllib.parse

from trainscout.spaces import ConfigError

CHECK_TIMEOUT_S = 3.0  # a backend that does not answer within this is refused before the first trial
CHECK_WAIT_S = 15.0  # the whole MLflow check (MLflow retries a database's engine for minutes on its own)
# MLflow's HTTP client, only where the user set nothing: the check asks once; a hook retries once, so a server that
# dies mid-search costs seconds before its tracker is dropped (MLflow's defaults: 7 retries of 120 s)
CHECK_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "3", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
HOOK_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
MLFLOW_SCHEMES = {"http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"}
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}
WANDB_URL = "https://api.wandb.ai"
# Tune's Callback hooks (ray.tune.callback.Callback): each is guarded, so a tracker that raised is called no more
HOOKS = ("setup", "on_step_begin", "on_step_end", "on_trial_start", "on_trial_restore", "on_trial_save",
         "on_trial_result", "on_trial_complete", "on_trial_recover", "on_trial_error", "on_checkpoint",
         "on_experiment_end")


def trackers(kinds, name: str, out: str, stream) -> list:
    """Ray Tune's logger callbacks for search --track (cli.searches.tracking checked their packages, check() their
    backends), each guarded (guard): each Tune trial a run, its config (the knobs) as params, each report's numbers
    as metrics (per timed step: the best step so far, tokens_per_s, and the step's own, step_tokens_per_s; at the end
    the record's tokens/s, MFU, peak memory, days), the search's name as the experiment (MLflow) or project (W&B).
    Where each writes is said on stream."""
    out_abs = os.path.abspath(out)
    made = []
    for kind in kinds:
        if kind == "mlflow":
            from ray.air.integrations.mlflow import MLflowLoggerCallback
            uri = mlflow_uri(out)
            made.append(guard(MLflowLoggerCallback(tracking_uri=uri, experiment_name=name,
                                                   tags={"trainscout_search": name}), kind, stream))
            where = f"mlflow: experiment {name} at {secrets_masked(uri)}"
        elif kind == "wandb":
            from ray.air.integrations.wandb import WandbLoggerCallback
            made.append(guard(WandbLoggerCallback(project=name), kind, stream))
            where = f"wandb: project {name}" + (" (offline)" if os.environ.get("WANDB_MODE") == "offline" else "")
        else:
            from ray.tune.logger import TBXLoggerCallback
            made.append(guard(TBXLoggerCallback(), kind, stream))
            where = f"tensorboard: tensorboard --logdir {os.path.join(out_abs, 'tune')}"
        print(f"  tracking: {where}", file=stream, flush=True)
    return made


def mlflow_uri(out: str) -> str:
    """Where --track mlflow writes: MLFLOW_TRACKING_URI, else a SQLite file in the output folder (MLflow 3.x refuses
    its ./mlruns file store unless told)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(os.path.abspath(out), 'mlflow.db')}"


def secrets_masked(uri: str) -> str:
    from trainscout.store import secrets
    return secrets.masked(uri)


def _masked_text(text: str) -> str:
    from trainscout.store.secrets import mask_urls
    return mask_urls(text)


# --- before the first trial ------------------------------------------------------------------------------------
def check(kinds, out: str) -> None:
    """Refuse (ConfigError: one line, the URI's password masked) a search whose trackers' backends cannot take its
    runs, or whose Tune folder under out (Tune's experiment files, --track tensorboard's event files) cannot be
    written; nothing is written to out. Called before Ray starts and before the output folder is made."""
    tune = os.path.join(os.path.abspath(out), "tune")
    if why := unwritable(tune):
        what = "Ray Tune's experiment files" + (" and --track tensorboard's event files" if "tensorboard" in kinds
                                                else "")
        raise ConfigError("--out", f"--out {out}: the Tune folder {tune} ({what}) cannot be written: {why}: make "
                                   "it writable, or give another --out")
    for kind in kinds:
        if kind == "mlflow":
            _check_mlflow()
        elif kind == "wandb":
            _check_wandb()


def unwritable(path: str) -> str | None:
    """Why a folder (made if missing) cannot be written there, else None: the nearest existing path above it is
    asked, so nothing is made to find out."""
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        return f"{p} is not a folder"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is read-only"
    return None


def _address(url: str) -> tuple[str, int]:
    """A URL's host and port (the scheme's default port where none is given); ValueError says what is missing."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.split("+", 1)[0].lower())  # parts.port: ValueError if no number
    if not parts.hostname or not port:
        raise ValueError("no host" if not parts.hostname else "no port")
    return parts.hostname, port


def _unreachable(host: str, port: int) -> str | None:
    """Why nothing answers at host:port (a TCP connect, CHECK_TIMEOUT_S), else None."""
    try:
        socket.create_connection((host, port), timeout=CHECK_TIMEOUT_S).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def _check_mlflow() -> None:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:  # the default: mlflow.db in the output folder, which is checked with it
        return
    shown, leave = f"MLFLOW_TRACKING_URI={secrets_masked(uri)}", "(or leave --track mlflow out)"
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    address, why = None, None
    if scheme not in MLFLOW_SCHEMES:  # a bare path is MLflow's file store, which MLflow 3.x refuses
        why = f"scheme {scheme!r}" if scheme else "no scheme"
    elif scheme not in ("sqlite", "databricks", "databricks-uc", "uc"):
        try:
            address = _address(uri)
        except ValueError as e:
            why = str(e)
    if why:
        raise ConfigError("MLFLOW_TRACKING_URI", f"--track mlflow: {shown} is no tracking URI MLflow writes to "
                                                 f"({why}): set it to http(s)://HOST:PORT of a tracking server or "
                                                 f"sqlite:///PATH/mlflow.db, or unset it (mlflow.db in --out) {leave}")
    if scheme == "sqlite":
        path = uri.split("://", 1)[1][1:]
        if path and path != ":memory:" and (why := unwritable(os.path.dirname(os.path.abspath(path)))):
            raise ConfigError("MLFLOW_TRACKING_URI", f"--track mlflow: {shown}: its folder cannot be written: {why}: "
                                                     f"make it writable, or set another path {leave}")
    elif address and (why := _unreachable(*address)):
        raise ConfigError("MLFLOW_TRACKING_URI", f"--track mlflow: nothing answers at {shown} ({why}): start the "
                                                 f"server, or set MLFLOW_TRACKING_URI to one that runs {leave}")
    error = _within(lambda: _ask_mlflow(uri), CHECK_WAIT_S)
    if error:
        raise ConfigError("MLFLOW_TRACKING_URI", f"--track mlflow: {shown} refused the check ({_masked_text(error)}): "
                                                 f"fix the URI or the server {leave}")


def _ask_mlflow(uri: str) -> None:
    """One cheap call of the tracking store (an experiment listed), MLflow's own logs quiet."""
    import mlflow
    with _limits(CHECK_LIMITS), _quiet("mlflow"):
        mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def _within(call, seconds: float) -> str | None:
    """None when call() returns within seconds, else why not (its error's first line, or the wait)."""
    error: list[str] = []

    def run():
        try:
            call()
        except Exception as e:  # noqa: BLE001 - any failure of the backend is the answer
            error.append(one_line(e))
        else:
            error.append("")

    t = threading.Thread(target=run, name="trainscout-tracking-check", daemon=True)  # left behind if it hangs
    t.start()
    t.join(seconds)
    return (error[0] or None) if error else f"no answer within {seconds:.0f} s"


def _check_wandb() -> None:
    leave = "(or leave --track wandb out)"
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):  # runs written locally, no server asked
        if (folder := os.environ.get("WANDB_DIR")) and (why := unwritable(folder)):
            raise ConfigError("WANDB_DIR", f"--track wandb: WANDB_DIR={folder} cannot be written: {why}: make it "
                                           f"writable, or set another WANDB_DIR {leave}")
        return
    base = os.environ.get("WANDB_BASE_URL") or WANDB_URL
    if not _wandb_key(base):
        raise ConfigError("--track", "--track wandb: no W&B API key: set WANDB_API_KEY or run `wandb login`, or set "
                                     f"WANDB_MODE=offline to keep the runs on this host {leave}")
    try:
        address = _address(base)
    except ValueError as e:
        raise ConfigError("WANDB_BASE_URL", f"--track wandb: WANDB_BASE_URL={secrets_masked(base)} is no URL ({e}): "
                                            f"set it to https://HOST of a W&B server, or unset it {leave}") from None
    if why := _unreachable(*address):
        raise ConfigError("--track", f"--track wandb: nothing answers at the W&B server {secrets_masked(base)} "
                                     f"({why}): check the network or WANDB_BASE_URL, or set WANDB_MODE=offline {leave}")


def _wandb_key(base: str) -> bool:
    """Whether Ray's WandbLoggerCallback will find an API key: the environment, its key hook, ~/.netrc, or wandb's
    own login."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_SETUP_API_KEY_HOOK"):
        return True
    import netrc
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc().authenticators(urllib.parse.urlsplit(base).hostname or ""):
            return True
    try:  # what Ray's _set_api_key asks last
        import wandb
        wandb.ensure_configured()
        return bool(wandb.api.api_key)
    except Exception:  # noqa: BLE001 - wandb's login state unknown: no key found
        return False


@contextlib.contextmanager
def _limits(env: dict):
    """The environment's settings in env for the block, where the user set none."""
    added = {k: v for k, v in env.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _quiet(logger: str):
    """A library's own logs held to CRITICAL for the block: its tracebacks of a failure are said in one line here."""
    import logging
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


_NOISE = ("(raised as a result of", "(Background on this error", "[SQL:", "[parameters:")  # SQLAlchemy's extra lines


def one_line(e: BaseException, limit: int = 240) -> str:
    """An exception as one line: its type and the first telling line of its text, URLs' passwords masked."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith(_NOISE)), "")
    text = _masked_text(f"{type(e).__name__}: {first}" if first else type(e).__name__)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- during the search -----------------------------------------------------------------------------------------
_GUARDED: dict[type, type] = {}


def guard(callback, kind: str, stream):
    """The callback, each Tune hook of it guarded: the first exception in one is said once on stream (one line, URLs'
    passwords masked) and the tracker is called no more; the search and the other trackers go on. It stays an
    instance of its own class (Tune adds a default TensorBoard logger where none is one)."""
    callback.__class__ = _guarded_class(type(callback))
    callback._tracker, callback._tracker_stream, callback._tracker_dropped = kind, stream, False
    return callback


def _guarded_class(base: type) -> type:
    if base in _GUARDED:
        return _GUARDED[base]

    def hook(name: str):
        def call(self, *args, **kwargs):
            if self._tracker_dropped:
                return None
            try:
                with _limits(HOOK_LIMITS if self._tracker == "mlflow" else {}), _quiet(self._tracker):
                    return getattr(base, name)(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - a tracker's failure costs its runs, not the search
                self._tracker_dropped = True
                stream = getattr(self, "_tracker_stream", None) or sys.stderr
                print(f"  tracking: {self._tracker} failed ({one_line(e)}): it is dropped, the trials from here "
                      "are not tracked there; the search goes on", file=stream, flush=True)
                return None
        call.__name__ = name
        return call

    def __getstate__(self):  # Ray Tune pickles its callbacks; an open stream is not picklable
        state = dict(self.__dict__)
        state.pop("_tracker_stream", None)
        return state

    attrs = {name: hook(name) for name in HOOKS if hasattr(base, name)}
    attrs.update(__getstate__=__getstate__, __doc__=f"{base.__name__}, its hooks guarded (tracking.guard).")
    _GUARDED[base] = type(f"Guarded{base.__name__}", (base,), attrs)
    return _GUARDED[base]
