"""A real Airflow for this project, run in the background: api-server, scheduler and dag-processor
(LocalExecutor), and the triggerer when asked for (``components=WITH_TRIGGERER``: asset watchers
run there), with their own AIRFLOW_HOME and metadata database on the embedded PostgreSQL (a fresh
copy of a migrated template at each start). The end-to-end tests and the live lateness benchmark
use it; ``airflow standalone`` is what a person runs (README).

    with LocalAirflow(home, metadata_db="airflow_e2e", env={...}) as airflow:
        requests.get(f"{airflow.url}/api/v2/dags")
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import psycopg
import requests
from cryptography.fernet import Fernet
from psycopg import sql

from .. import embedded
from .. import statements as S
from .env import airflow_environ

COMPONENTS = (("api-server",), ("scheduler",), ("dag-processor",))
#: With the triggerer, which runs asset watchers' event triggers: two more processes, about 480 MB
#: resident and 10 s of CPU to start, about 1 s of CPU a minute when idle.
WITH_TRIGGERER = (*COMPONENTS, ("triggerer",))
AIRFLOW = str(Path(sys.executable).parent / "airflow")  # the CLI of this environment


def _sqlalchemy_url(database: str) -> str:
    return embedded.url(database).replace("postgresql://", "postgresql+psycopg2://")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_metadata_db(name: str, env: dict) -> str:
    """Make Airflow's metadata database ``name`` anew on the embedded PostgreSQL, a copy of one
    migrated to this Airflow version's head (``migrated_template``); returns its SQLAlchemy URL."""
    template = migrated_template(env)
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return _sqlalchemy_url(name)


def migrated_template(env: dict) -> str:
    """The name of a metadata database that ``airflow db migrate`` (run with ``env``) brought to
    this Airflow version's head, made once (about 10 s) and copied for each start (under 0.1 s). It
    is migrated under a temporary name and renamed when done: a half-migrated one is never used."""
    name = "airflow_template_" + re.sub(r"[^0-9a-z]", "_", version("apache-airflow").lower())
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        if conn.execute(S.DATABASE_EXISTS, {"name": name}).fetchone():
            return name
        building_name = f"{name}_building_{os.getpid()}"
        building = sql.Identifier(building_name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
        conn.execute(S.CREATE_DATABASE.format(name=building))
        env = {**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _sqlalchemy_url(building_name)}
        try:
            subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True)
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(building, sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:  # another start made it meanwhile
            conn.execute(sql.SQL("DROP DATABASE {}").format(building))
        except BaseException:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
            raise
    return name


class LocalAirflow:
    """Airflow's servers (``components``: ``COMPONENTS`` or ``WITH_TRIGGERER``); ``url`` is the
    api-server's base URL once entered. ``env``: extra environment (connections, REDELIVERY_*
    settings, scheduler tuning). Anyone may call the API (``SIMPLE_AUTH_MANAGER_ALL_ADMINS``): it
    listens on 127.0.0.1 only. ``start_timeout`` in seconds."""

    def __init__(
        self,
        home: Path,
        metadata_db: str,
        env: dict | None = None,
        start_timeout: float = 240,
        components: tuple = COMPONENTS,
    ):
        self.home, self.metadata_db, self.start_timeout = Path(home), metadata_db, start_timeout
        self.components = components
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = self.home / "logs-local"
        self.env = {
            **os.environ,
            **airflow_environ(),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _sqlalchemy_url(metadata_db),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            # One key for every component: each one that finds no airflow.cfg would make its own,
            # and a triggerer then cannot read the trigger kwargs a dag-processor encrypted.
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            **(env or {}),
        }
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> LocalAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        # Every setting comes from the environment. An existing (empty) airflow.cfg keeps the
        # components, started together, from each writing one while another reads it half-written.
        (self.home / "airflow.cfg").touch()
        fresh_metadata_db(self.metadata_db, self.env)
        for command in self.components:
            args = [*command, "--port", str(self.port)] if command[0] == "api-server" else list(command)
            self.procs.append(
                subprocess.Popen(
                    [AIRFLOW, *args],
                    env=self.env,
                    start_new_session=True,
                    stdout=open(self.logs / f"{command[0]}.log", "w"),
                    stderr=subprocess.STDOUT,
                )
            )
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                dags = requests.get(f"{self.url}/api/v2/dags", timeout=5).json()
                health = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
                triggerer = ("triggerer",) not in self.components or (
                    (health.get("triggerer") or {}).get("status") == "healthy"
                )
                if dags.get("total_entries") and health["scheduler"]["status"] == "healthy" and triggerer:
                    return
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(2)
        tails = "\n".join(path.read_text()[-2000:] for path in self.logs.iterdir())
        raise RuntimeError(f"Airflow did not come up:\n{tails}")

    def unpause(self, dag_id: str) -> None:
        done = requests.patch(f"{self.url}/api/v2/dags/{dag_id}", json={"is_paused": False}, timeout=30)
        done.raise_for_status()

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []
