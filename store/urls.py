"""Where a results store is: the URL every process of a search opens as the same database, the output folder that
holds a search's SQLite store, and what a URL whose database driver is missing needs.

A URL is stripped of its password where it is read (store.secrets): what these return is printed and saved.
"""
from __future__ import annotations

import os

import sqlalchemy as sa

from trainscout.spaces import ConfigError

from . import secrets


def default_url(out_dir: str) -> str:
    """The SQLite URL of a search folder's store: OUT/results.db, as an absolute path."""
    return "sqlite:///" + os.path.abspath(os.path.join(out_dir, "results.db"))


def check_folder(path: str | None, flag: str = "--out") -> str:
    """An output folder that can be made and written (nothing is created here): its absolute path, or ConfigError
    with the fix for an empty name, a file on the way or a folder that is not writable."""
    if path is None or not str(path).strip():
        raise ConfigError(flag, f"{flag} is empty: give a folder, e.g. {flag} runs/out")
    full = os.path.abspath(path)
    probe = full
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "is a file" if probe == full else f"is on the way and is a file ({probe})"
        raise ConfigError(flag, f"{flag} {path} {what}, not a folder: give a folder path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(flag, f"{flag} {path}: {probe} is not writable: give a folder you can write to")
    return full


def storage_url(url: str, flag: str = "--storage") -> str:
    """A storage URL that every process of a search opens as the same database: a relative SQLite path made absolute
    (the trials run in Ray's working directories, where it named another file each: every measurement was lost), an
    in-memory SQLite database (one per process, gone when it ends) refused with the fix. Other URLs as given."""
    url = secrets.strip(url)  # its password stays in this process's memory, never in what is saved or printed
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return url  # Store() refuses it, naming the flag
    if u.get_backend_name() != "sqlite":
        return with_driver(u, url)
    db = u.database or ""
    uri = db.startswith("file:")
    path = db[5:].split("?")[0] if uri else db
    if not path or path == ":memory:" or "mode=memory" in db or u.query.get("mode") == "memory":
        raise ConfigError(flag, f"{flag} {url} is an in-memory SQLite database (each process its own, lost when it "
                                f"ends): give a file, e.g. sqlite:///{os.path.abspath('results.db')}, "
                                f"or leave {flag} out")
    if os.path.isabs(path):
        return url
    db = "file:" + os.path.abspath(path) + db[5 + len(path):] if uri else os.path.abspath(path)
    return u.set(database=db).render_as_string(hide_password=False)


def with_driver(u, url: str) -> str:
    """postgresql://: the installed PostgreSQL driver (psycopg, of trainscout[cluster]), where SQLAlchemy's default
    (psycopg2) is not installed. The same database either way."""
    if u.drivername != "postgresql":
        return url
    import importlib.util
    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


# SQLAlchemy driver name -> the package that provides it (pip install ...), where the two differ or are not obvious
DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]", "mysqldb": "mysqlclient",
                   "pymysql": "pymysql", "mysqlconnector": "mysql-connector-python", "mariadbconnector": "mariadb",
                   "pyodbc": "pyodbc", "oracledb": "oracledb", "cx_oracle": "cx_Oracle", "pg8000": "pg8000",
                   "asyncpg": "asyncpg", "aiomysql": "aiomysql"}


def driver_missing(url: str, e: ImportError) -> str:
    """What is missing for a storage URL whose database driver does not import, and how to install it (the URL's
    own driver: a mysql:// URL named the PostgreSQL one)."""
    try:
        u = sa.engine.make_url(url)
        backend, driver = u.get_backend_name(), u.get_driver_name()
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse: the import error alone
        return f"its database driver is missing ({e}): install it"
    package = DRIVER_PACKAGES.get(driver, driver)
    if backend == "postgresql":  # the extra trainscout[cluster] installs psycopg, which postgresql:// then uses
        package = f"{package}, or 'trainscout[cluster]', which has psycopg"
    return (f"the {backend} driver {driver} is missing ({e}): install it (pip install {package}), or name an "
            f"installed one in the URL ({backend}+DRIVER://...)")
