"""A real PostgreSQL server for the tests: the Debian package's binaries (/usr/lib/postgresql/*/bin), a temporary
data directory, listening on 127.0.0.1 on a free port with its unix socket inside that directory, password
authentication (scram-sha-256) for a user of its own, stopped by its own `pg_ctl stop`.

initdb refuses to run as root: as root the server runs as the `postgres` user that the package creates.

The rule when PostgreSQL is missing (tests/conftest.py's `postgres` fixture): the tests that need it fail, saying
how to install it (.ci/run installs it, so CI never skips them). Locally, TRAINSCOUT_PG_OPTIONAL=1 turns that into
a skip with the reason, and only when the binaries (or psycopg) are absent; a server that is there but fails to
start always fails.
"""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile

USER = "trainscout"
OPTIONAL_ENV = "TRAINSCOUT_PG_OPTIONAL"


def bindir() -> str | None:
    """The newest installed PostgreSQL's bin folder (with initdb, pg_ctl, postgres), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def missing() -> str | None:
    """Why no server can be started here (None: it can): no binaries, or no psycopg driver."""
    if bindir() is None:
        return "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): apt-get install -y postgresql"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed: pip install -e '.[test,cluster]'"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server for a test session: start(), url(db), create_database(name), stop()."""

    def __init__(self):
        self.bin = bindir()
        self.password = "pw-" + secrets.token_hex(12)  # random: the leak test greps every written file for it
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="trainscout-pg-")
        self.data = os.path.join(self.root, "data")
        self.user = None if os.geteuid() != 0 else "postgres"  # initdb refuses root
        self.created: list[str] = []

    def _run(self, *cmd, timeout: int = 120) -> str:
        res = subprocess.run([os.path.join(self.bin, cmd[0]), *cmd[1:]], capture_output=True, text=True,
                             timeout=timeout, user=self.user, cwd=self.root)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({res.returncode}): {(res.stderr or res.stdout)[-1500:]}")
        return res.stdout

    def start(self) -> Server:
        if self.user:
            shutil.chown(self.root, self.user)
        pwfile = os.path.join(self.root, "pwfile")
        with open(os.open(pwfile, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.password + "\n")
        if self.user:
            shutil.chown(pwfile, self.user)
        try:
            self._run("initdb", "-D", self.data, "-U", USER, f"--pwfile={pwfile}", "--auth-local=trust",
                      "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions")
        finally:
            os.remove(pwfile)
        # fsync off: a test database is thrown away; 200 connections: several searches' pools at once
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "server.log"), "-w", "-t", "60",
                  "-o", opts, "start")
        return self

    def url(self, database: str, password: bool = False) -> str:
        """postgresql+psycopg://trainscout[:PASSWORD]@127.0.0.1:PORT/database."""
        auth = f"{USER}:{self.password}" if password else USER
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; returns its URL without the password (give it through PGPASSWORD)."""
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, password=self.password,
                             dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url(name)

    def env(self, **extra) -> dict:
        """The environment of a process that connects with the password from PGPASSWORD, as libpq reads it."""
        return dict(os.environ, PGPASSWORD=self.password, **extra)

    def stop(self) -> None:
        """`pg_ctl stop` on its own data directory (never by process name), then the directory is removed."""
        try:
            if os.path.exists(os.path.join(self.data, "postmaster.pid")):
                self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
