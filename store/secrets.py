"""Storage passwords: taken out of a URL where it is read, held in memory, never written.

A password in a storage URL (postgresql://user:PASSWORD@host/db) would travel wherever the URL goes: the search's
saved settings, its start line, report.html, Ray Tune's experiment files (docs/store.md). So a
URL is stripped where it enters (store.storage_url, Store()): every URL trainscout keeps, prints or hands to Ray is
the bare one, and the password waits in this process's memory (PASSWORDS). A SQLAlchemy hook (do_connect) gives it
to each new database connection of any engine, Optuna's included, so it is never part of an engine's arguments
either (Tune pickles the searcher and its Optuna storage into its experiment folder).

Without a password in the URL, the database driver (libpq) reads PGPASSWORD or ~/.pgpass itself, as psql does.
The processes of a search's trials, on this host or another (which have neither), ask the driver's secrets actor
for the password (publish: the URL's, else the driver's PGPASSWORD or ~/.pgpass entry): Ray passes it in memory
over its RPC, and it is never written.
"""
from __future__ import annotations

import os
import re

import sqlalchemy as sa

ACTOR = "trainscout-secrets"  # the driver's named actor (one per Ray job) holding the passwords of its URLs
PASSWORDS: dict[tuple, str] = {}  # (user, host, port, database) -> password, in this process only
_ASKED: set[tuple] = set()  # asked the secrets actor already (it had none: libpq's own sources then)
DEFAULT_PORT = {"postgresql": 5432, "mysql": 3306}


def _ident(user, host, port, database, backend: str = "postgresql") -> tuple:
    """What a password is kept under (.pgpass's fields): the same database reached by the same user."""
    return (str(user or ""), str(host or ""), int(port or DEFAULT_PORT.get(backend, 0)), str(database or ""))


def strip(url: str) -> str:
    """The URL without its password (kept in PASSWORDS for this process's connections); a URL without one, or text
    that is no URL, as given."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return url
    if u.password is None:
        return url
    PASSWORDS[_ident(u.username, u.host, u.port, u.database, u.get_backend_name())] = str(u.password)
    bare = sa.engine.URL.create(u.drivername, u.username, None, u.host, u.port, u.database, u.query)
    return bare.render_as_string(hide_password=False)


def masked(url: str) -> str:
    """A URL to print: the password, if any, as ***."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, TypeError, AttributeError, ValueError):  # no URL SQLAlchemy reads (a bad port)
        return mask_urls(str(url))


_IN_TEXT = re.compile(r"(\b[A-Za-z][\w+.-]*://[^:/@\s'\"]*:)[^@\s'\"]+@")


def mask_urls(text: str) -> str:
    """Text to print with the password of every URL in it as *** (masked() for a message that quotes a URL as the
    user gave it: `report postgresql://user:PASSWORD@host/db` of an empty database printed the password)."""
    return _IN_TEXT.sub(r"\1***@", str(text))


def password(ident: tuple) -> str | None:
    """The password this process holds for a database, else the one the driver's secrets actor holds (a trial's
    process); None: let the database driver find one (PGPASSWORD, ~/.pgpass)."""
    if ident in PASSWORDS:
        return PASSWORDS[ident]
    if ident in _ASKED:
        return None
    _ASKED.add(ident)
    import sys
    if "ray" not in sys.modules:
        return None
    import ray
    if not ray.is_initialized():
        return None
    try:
        actor = ray.get_actor(ACTOR)
    except ValueError:  # no secrets published: the search's URL had no password
        return None
    got = ray.get(actor.get.remote(ident), timeout=60)
    if got is not None:
        PASSWORDS[ident] = got
    return got


def password_from_libpq(u) -> str | None:
    """The password libpq would use in this process for the database of URL u: PGPASSWORD, else the first matching
    line of PGPASSFILE or ~/.pgpass (host:port:database:user:password, * for any, \\ escapes)."""
    if os.environ.get("PGPASSWORD"):
        return os.environ["PGPASSWORD"]
    path = os.environ.get("PGPASSFILE") or os.path.expanduser("~/.pgpass")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = [u.host or "localhost", str(u.port or 5432), u.database or "", u.username or ""]
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields, cur, esc = [], "", False
        for ch in line:
            if esc:
                cur, esc = cur + ch, False
            elif ch == "\\":
                esc = True
            elif ch == ":" and len(fields) < 4:
                fields, cur = fields + [cur], ""
            else:
                cur += ch
        fields.append(cur)
        if len(fields) == 5 and all(f in ("*", w) for f, w in zip(fields[:4], want)):
            return fields[4]
    return None


def publish(url: str | None = None) -> None:
    """Hand the password of a search's storage URL to its trials, wherever they run: a named actor of the Ray job
    holding it in memory (the driver, once Ray is up). Taken from the URL (strip), else where libpq would find it
    here (PGPASSWORD, ~/.pgpass): the trials' processes on other hosts have neither. Nothing when there is none."""
    if url:
        try:
            u = sa.engine.make_url(url)
        except sa.exc.ArgumentError:
            u = None
        if u is not None and u.get_backend_name() == "postgresql":
            ident = _ident(u.username, u.host, u.port, u.database)
            if ident not in PASSWORDS and (pw := password_from_libpq(u)) is not None:
                PASSWORDS[ident] = pw
    if not PASSWORDS:
        return
    import ray

    # on the driver's node (named_actor: a worker node's end never takes it along); a second search in this process
    # finds the first one's actor
    from trainscout.trial.pool import named_actor
    ray.get(named_actor(_Secrets, ACTOR, num_cpus=0).put.remote(dict(PASSWORDS)))


class _Secrets:
    """The passwords of a search's storage URLs, in the memory of one actor of its job."""

    def __init__(self):
        self.passwords: dict[tuple, str] = {}

    def put(self, passwords: dict) -> None:
        self.passwords.update(passwords)

    def get(self, ident: tuple) -> str | None:
        return self.passwords.get(tuple(ident))


def _do_connect(dialect, conn_rec, cargs, cparams) -> None:
    """Every new connection of every engine in this process: the password for its database, if one is held."""
    if dialect.name not in DEFAULT_PORT or cparams.get("password"):
        return
    pw = password(_ident(cparams.get("user"), cparams.get("host"), cparams.get("port"),
                         cparams.get("dbname") or cparams.get("database"), dialect.name))
    if pw is not None:
        cparams["password"] = pw


def install() -> None:
    """Register the connection hook once per process (trainscout.store does on import)."""
    if not sa.event.contains(sa.engine.Engine, "do_connect", _do_connect):
        sa.event.listen(sa.engine.Engine, "do_connect", _do_connect)
