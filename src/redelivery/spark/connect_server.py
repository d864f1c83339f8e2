"""The project's long-lived Spark Connect server: a warm Spark for every job.

Started from the pyspark wheel (``SparkConnectServer`` through its ``spark-submit``) in local mode
with ``local[<cores>,3]`` (a failed task is tried up to 3 times), or on the master
``REDELIVERY_SPARK_CONNECT_MASTER`` (``spark://host:7077``: its executors on a cluster), bound to
127.0.0.1 (setting ``REDELIVERY_SPARK_CONNECT_BIND``) on port 15002
(``REDELIVERY_SPARK_CONNECT_PORT``), and authenticated by a token generated once and kept in
``REDELIVERY_HOME/spark-connect/token`` (mode 0600). Its log and pid file are in the same folder.
Its executors' Python is the server's ``PYSPARK_PYTHON`` for every session (Spark Connect reads
nothing else): this interpreter in local mode, else ``REDELIVERY_SPARK_EXECUTOR_PYTHON`` (none:
Spark's own); ``REDELIVERY_SPARK_CONF`` goes on its command line (executor memory, cores, ...),
and ``REDELIVERY_SPARK_ARCHIVES`` too (``--archives``): the executors unpack a packed environment
once for every session, where an archive a session adds is uploaded with each session (65 MB for
every tier run). Each session gets the package's zip itself (``deploy.ship``).

Clients reach it as ``sc://localhost:<port>/;token=<token>``: pyspark sends a token without TLS
only to ``localhost`` (to any other host it opens a TLS channel, which this server has not); for
a server on another host ``connect_url`` passes the token as an ``authorization`` header instead.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from redelivery.settings import get_settings
from redelivery.spark import deploy
from redelivery.spark.jvm import driver_java_options

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180  # seconds: the first start of a cold JVM on 2 cores takes about 30 s


class SparkConnectError(RuntimeError):
    """The Spark Connect server could not be started (the message has its log's tail)."""


def folder() -> Path:
    path = get_settings().home.resolve() / "spark-connect"
    path.mkdir(parents=True, exist_ok=True)
    return path


def token() -> str:
    """The server's token: ``REDELIVERY_SPARK_CONNECT_TOKEN``, else generated once (mode 0600)."""
    if get_settings().spark_connect_token:
        return get_settings().spark_connect_token
    path = folder() / "token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


def connect_url(host: str = "localhost", port: int | None = None, secret: str | None = None) -> str:
    """A client URL: the token as pyspark's ``token`` parameter for ``localhost``, as an
    ``authorization`` header for another host (both over a plain channel)."""
    port = port or get_settings().spark_connect_port
    if not secret:
        return f"sc://{host}:{port}/"
    if host == "localhost":
        return f"sc://{host}:{port}/;token={quote(secret, safe='')}"
    return f"sc://{host}:{port}/;authorization={quote('Bearer ' + secret, safe='')}"


def url() -> str:
    """The URL of the project's server (not started by this call)."""
    return connect_url("localhost", get_settings().spark_connect_port, token())


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid() -> int | None:
    try:
        pid = int((folder() / "server.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


def status() -> dict:
    """``{"running", "pid", "port", "url", "log"}`` of the project's server."""
    settings = get_settings()
    pid = _pid()
    running = pid is not None and _port_open(settings.spark_connect_port)
    return {"running": running, "pid": pid, "port": settings.spark_connect_port,
            "bind": settings.spark_connect_bind, "log": str(folder() / "server.log")}  # fmt: skip


@contextmanager
def _lock():
    with open(folder() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def command() -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment."""
    import pyspark

    settings = get_settings()
    spark_home = Path(pyspark.__file__).parent
    master = settings.spark_connect_master or f"local[{os.cpu_count() or 2},3]"
    deployment = deploy.deployment()
    python = deploy.executor_python(master, deployment)
    argv = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
            "--master", master, "--name", "redelivery-spark-connect",
            "--conf", f"spark.connect.grpc.binding.address={settings.spark_connect_bind}",
            "--conf", f"spark.connect.grpc.binding.port={settings.spark_connect_port}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC"]  # fmt: skip
    for key, value in deployment.conf.items():
        argv += ["--conf", f"{key}={value}"]
    if deployment.archives:  # unpacked once per executor for every session (deploy.ship skips them)
        argv += ["--archives", ",".join(deployment.archives)]
        python = session_python(python)
    # A JVM out of heap hangs its scheduler with the server still listening: exit instead, so the
    # jobs running fail at once and the next caller starts a fresh server.
    java_options = f"-XX:+ExitOnOutOfMemoryError {driver_java_options()}".strip()
    argv += ["--driver-memory", settings.spark_connect_memory, "--driver-java-options", java_options]
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_CONNECT_AUTHENTICATE_TOKEN": token(),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}  # fmt: skip
    if python:  # what the server hands every session's Python functions (SparkConnectPlanner)
        env["PYSPARK_PYTHON"] = python
    return [*argv, "spark-internal"], env


def session_python(python: str | None) -> str | None:
    """The executors' Python as a Connect server with archives of its own must name it: a
    session's Python workers start in the session's own folder, one below the executors' files
    where the server's archives are unpacked (``SparkFiles`` root / session id: pyspark's
    ``PythonWorkerFactory``), so a relative path (``./env/bin/python``) goes up one level
    (``../env/bin/python``); an absolute path or a bare name (found on ``PATH``) is kept."""
    if not python or os.path.isabs(python) or "/" not in python:
        return python
    return "../" + python.removeprefix("./")


def ensure_running() -> str:
    """Start the server unless it runs (file lock: many callers start it once); return its URL.
    Raises ``SparkConnectError`` with the log's tail when it does not come up."""
    settings = get_settings()
    with _lock():
        if not status()["running"]:
            if _port_open(settings.spark_connect_port):
                raise SparkConnectError(
                    f"port {settings.spark_connect_port} is held by another process: stop it, or set "
                    "REDELIVERY_SPARK_CONNECT_PORT to a free port"
                )
            argv, env = command()
            log = folder() / "server.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            (folder() / "server.pid").write_text(str(proc.pid))
            deadline = time.monotonic() + START_TIMEOUT
            while not _port_open(settings.spark_connect_port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    stop()
                    raise SparkConnectError(f"Spark Connect did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.25)
    return url()


def run_foreground() -> int:
    """Run the server in this process's place (a container's main process); returns its exit code."""
    argv, env = command()
    os.execve(argv[0], argv, env)
    return 1  # not reached


def _exited(pid: int) -> bool:
    try:  # our own child: reap it (a zombie still answers kill(pid, 0))
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True


def stop(timeout: float = 30) -> bool:
    """Stop the server (SIGTERM, then SIGKILL); False when it was not running."""
    pid = _pid()
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _exited(pid):
                break
            time.sleep(0.2)
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    (folder() / "server.pid").unlink(missing_ok=True)
    return True
