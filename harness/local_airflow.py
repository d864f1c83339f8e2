"""A real Airflow for this project, run in the background: api-server, scheduler and dag-processor
(LocalExecutor), and the triggerer when asked for (``components=WITH_TRIGGERER``: asset watchers
run there), with their own AIRFLOW_HOME and metadata database on the embedded PostgreSQL (a fresh
copy of a migrated template at each start). The end-to-end tests and the live lateness benchmark
use it; ``airflow standalone`` is what a person runs (docs/airflow.md).

    with LocalAirflow(home, metadata_db="airflow_e2e", env={...}) as airflow:
        requests.get(f"{airflow.url}/api/v2/dags")

By default every caller is an admin (the simple auth manager with
``SIMPLE_AUTH_MANAGER_ALL_ADMINS``: its roles do not restrict per DAG). With ``users`` it runs the
FAB auth manager (apache-airflow-providers-fab), whose roles grant per-DAG permissions (resources
``DAG:<dag_id>``, ``DAG Run:<dag_id>``): each user, with its role and the fixed password
``password(user)``, each of ``roles`` with its permissions, and ``ADMIN`` (role Admin), which
LocalAirflow itself calls the API as, are in the metadata database when it starts (a copy of a
template made once per set of users and roles: ``migrated_template``).

    roles = {"DlqReader": [("can_read", "Website"), ("can_read", "DAG:dlq_redrive")]}
    with LocalAirflow(home, "airflow_e2e", users={"reader": "DlqReader"}, roles=roles) as airflow:
        airflow.session("reader").get(f"{airflow.url}/redelivery/dlq")
"""

from __future__ import annotations

import hashlib
import json
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

from redelivery.airflow.env import airflow_environ
from redelivery.store import embedded
from redelivery.store import statements as S

COMPONENTS = (("api-server",), ("scheduler",), ("dag-processor",))
#: With the triggerer, which runs asset watchers' event triggers: two more processes, about 480 MB
#: resident and 10 s of CPU to start, about 1 s of CPU a minute when idle.
WITH_TRIGGERER = (*COMPONENTS, ("triggerer",))
AIRFLOW = str(Path(sys.executable).parent / "airflow")  # the CLI of this environment
#: The auth manager with per-DAG roles (``LocalAirflow(users=...)``).
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
#: The user LocalAirflow calls the API as under the FAB auth manager (role Admin, made at start).
ADMIN = "admin"


def password(user: str) -> str:
    """The fixed password LocalAirflow gives ``user`` (the api-server listens on 127.0.0.1 only)."""
    return f"{user}-local-password"


def _uses_fab(env: dict) -> bool:
    """Whether ``env`` configures the FAB auth manager (as Airflow tells, by its class name)."""
    return "FabAuthManager" in env.get("AIRFLOW__CORE__AUTH_MANAGER", "")


_CONN = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
#: How long the components have, together, to stop after a TERM before they are killed: one of
#: them (not identified) let a 30 s wait run out at every stop, and a test's Airflow keeps nothing
#: that needs an orderly stop.
STOP_SECONDS = 10


def _sqlalchemy_url(database: str) -> str:
    return embedded.url(database).replace("postgresql://", "postgresql+psycopg://")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_metadata_db(name: str, env: dict, access: dict | None = None) -> str:
    """Make Airflow's metadata database ``name`` anew on the embedded PostgreSQL, a copy of one
    migrated to this Airflow version's head (``migrated_template``; with ``access``, FAB users and
    roles as ``create_fab_access`` takes them, made in it); returns its SQLAlchemy URL."""
    template = migrated_template(env, access)
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return _sqlalchemy_url(name)


def migrated_template(env: dict, access: dict | None = None) -> str:
    """The name of a metadata database that ``airflow db migrate`` (run with ``env``) brought to
    this Airflow version's head, made once (about 10 s) and copied for each start (under 0.1 s).
    When ``env`` configures the FAB auth manager it is a template of its own: ``db migrate`` then
    makes FAB's tables too, and ``airflow sync-perm`` its built-in roles (Admin, Op, User, Viewer,
    Public) with their permissions, as the api-server's first start would (about 13 s in all).
    ``access`` (``{"roles": ..., "users": ...}``, FAB only): a copy of that one with these users
    and roles made in it (``create_fab_access``, about 5 s), one per distinct ``access`` and
    passwords. Raises ``subprocess.CalledProcessError`` or RuntimeError when making one fails."""
    name = "airflow_template_" + re.sub(r"[^0-9a-z]", "_", version("apache-airflow").lower())
    commands = [[AIRFLOW, "db", "migrate"]]
    if _uses_fab(env):
        name += "_fab_" + re.sub(r"[^0-9a-z]", "_", version("apache-airflow-providers-fab").lower())
        commands.append([AIRFLOW, "sync-perm"])

    def migrate(url: str) -> None:
        for command in commands:
            subprocess.run(command, env={**env, _CONN: url}, check=True, capture_output=True)

    name = _template(name, migrate)
    if access is None:
        return name
    passwords = {user: password(user) for user in access["users"]}
    digest = hashlib.sha256(json.dumps([access, passwords], sort_keys=True).encode()).hexdigest()[:10]
    return _template(f"{name}_{digest}", lambda url: _make_fab_access({**env, _CONN: url}, **access), name)


def _template(name: str, make, source: str | None = None) -> str:
    """The database ``name``, made once: created (a copy of ``source`` when given) under a
    temporary name, ``make(its SQLAlchemy URL)`` run, then renamed, so that a half-made one is
    never used. Raises what ``make`` raises."""
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        if conn.execute(S.DATABASE_EXISTS, {"name": name}).fetchone():
            return name
        building_name = f"{name}_building_{os.getpid()}"
        building = sql.Identifier(building_name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
        if source is None:
            conn.execute(S.CREATE_DATABASE.format(name=building))
        else:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(building, sql.Identifier(source)))
        try:
            make(_sqlalchemy_url(building_name))
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(building, sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:  # another start made it meanwhile
            conn.execute(sql.SQL("DROP DATABASE {}").format(building))
        except BaseException:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
            raise
    return name


def create_fab_access(roles: dict[str, list], users: dict[str, str]) -> None:
    """In this process, configured for the FAB auth manager: make each of ``roles`` (name: its
    ``(action, resource)`` permissions; a resource not made yet, such as a DAG's before the
    dag-processor has seen it, is made) and each of ``users`` (name: its role, built in or one of
    ``roles``; password ``password(name)``), through FAB's security manager as its CLI
    (``airflow roles add-perms``, ``airflow users create``) does. Raises ValueError for a user
    whose role does not exist."""
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    with get_application_builder() as appbuilder:
        sm = appbuilder.sm
        for name, permissions in roles.items():
            role = sm.add_role(name)
            for action, resource in permissions:
                sm.add_permission_to_role(role, sm.create_permission(action, resource))
        for name, role_name in users.items():
            role = sm.find_role(role_name)
            if role is None:
                raise ValueError(f"user {name!r}: no role {role_name!r} (built in or given)")
            sm.add_user(name, name, "local", f"{name}@localhost", role, password(name))


def _make_fab_access(env: dict, roles: dict, users: dict) -> None:
    """``create_fab_access`` in a process with Airflow's environment ``env``; raises RuntimeError
    with the last line it wrote when it fails."""
    script = (
        "import json, sys; from harness.local_airflow import create_fab_access; "
        "create_fab_access(**json.load(sys.stdin))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps({"roles": roles, "users": users}),
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"making the FAB users and roles failed: {lines[-1]}")


class LocalAirflow:
    """Airflow's servers (``components``: ``COMPONENTS`` or ``WITH_TRIGGERER``); ``url`` is the
    api-server's base URL once entered. ``env``: extra environment (connections, REDELIVERY_*
    settings, scheduler tuning; a value None unsets the variable). ``start_timeout`` in seconds.
    ``airflow``: the Airflow CLI whose servers run (default: this environment's; the wheel's test
    runs a fresh virtual environment's). It listens on 127.0.0.1 only.

    Without ``users`` anyone may call the API (``SIMPLE_AUTH_MANAGER_ALL_ADMINS``). With ``users``
    (name: role) the FAB auth manager runs: ``roles`` (name: ``(action, resource)`` permissions,
    e.g. ``("can_read", "DAG:dlq_redrive")``) and the users, ``ADMIN`` among them, are in the
    metadata database from the start (a copy of a template that has them, ``migrated_template``),
    every password ``password(user)``; ``session(user)`` calls the API as one of them."""

    def __init__(
        self,
        home: Path,
        metadata_db: str,
        env: dict | None = None,
        start_timeout: float = 240,
        components: tuple = COMPONENTS,
        users: dict[str, str] | None = None,
        roles: dict[str, list] | None = None,
        airflow: str = AIRFLOW,
    ):
        self.home, self.metadata_db, self.start_timeout = Path(home), metadata_db, start_timeout
        self.components, self.airflow = components, airflow
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = self.home / "logs-local"
        self.fab = users is not None
        self.users = {ADMIN: "Admin", **(users or {})} if self.fab else {}
        self.roles = roles or {}
        access = (
            {
                "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
                # one key for the login page's session in every process
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                # tests log in many times a minute from one address (default: 5 per 40 s)
                "AIRFLOW__FAB__AUTH_RATE_LIMITED": "False",
            }
            if self.fab
            else {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
        )
        self.env = {
            **os.environ,
            **airflow_environ(),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _sqlalchemy_url(metadata_db),
            **access,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            # the scheduler's and the triggerer's log servers (8793, 8794 by default): two test
            # Airflows at once (two test runs) would share them
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            # One key for every component: each one that finds no airflow.cfg would make its own,
            # and a triggerer then cannot read the trigger kwargs a dag-processor encrypted.
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            **(env or {}),
        }
        self.env = {k: v for k, v in self.env.items() if v is not None}  # None in ``env``: unset
        self.procs: list[subprocess.Popen] = []
        self._sessions: dict[str, requests.Session] = {}

    def session(self, user: str = ADMIN) -> requests.Session:
        """A ``requests`` session that calls the API as ``user`` (a bearer token from ``POST
        /auth/token`` with its password); without the FAB auth manager a plain session (every
        caller is an admin). Raises RuntimeError when Airflow refuses the password, or
        ``requests.RequestException`` when the api-server does not answer."""
        if user not in self._sessions:
            session = requests.Session()
            if self.fab:
                answer = requests.post(
                    f"{self.url}/auth/token", json={"username": user, "password": password(user)}, timeout=30
                )
                if answer.status_code != 201:
                    raise RuntimeError(f"no token for {user!r}: {answer.status_code} {answer.text[:200]}")
                session.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"
            self._sessions[user] = session
        return self._sessions[user]

    def __enter__(self) -> LocalAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        # Every setting comes from the environment. An existing (empty) airflow.cfg keeps the
        # components, started together, from each writing one while another reads it half-written.
        (self.home / "airflow.cfg").touch()
        access = {"roles": self.roles, "users": self.users} if self.fab else None
        fresh_metadata_db(self.metadata_db, self.env, access)
        for command in self.components:
            args = [*command, "--port", str(self.port)] if command[0] == "api-server" else list(command)
            self.procs.append(
                subprocess.Popen(
                    [self.airflow, *args],
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
        deadline, last = time.monotonic() + self.start_timeout, "no answer"
        while time.monotonic() < deadline:
            try:
                dags = self.session().get(f"{self.url}/api/v2/dags", timeout=5).json()
                health = requests.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
                triggerer = ("triggerer",) not in self.components or (
                    (health.get("triggerer") or {}).get("status") == "healthy"
                )
                if dags.get("total_entries") and health["scheduler"]["status"] == "healthy" and triggerer:
                    return
            except (requests.RequestException, ValueError, KeyError, RuntimeError) as exc:
                last = str(exc)  # not up yet (a token, too, needs the api-server)
            time.sleep(2)
        tails = "\n".join(path.read_text()[-2000:] for path in self.logs.iterdir())
        raise RuntimeError(f"Airflow did not come up ({last}):\n{tails}")

    def unpause(self, dag_id: str) -> None:
        """Unpause ``dag_id`` (as ``ADMIN``); raises ``requests.HTTPError`` when refused."""
        done = self.session().patch(f"{self.url}/api/v2/dags/{dag_id}", json={"is_paused": False}, timeout=30)
        done.raise_for_status()

    def __exit__(self, *exc) -> None:
        for session in self._sessions.values():  # this side's HTTP connections end first
            session.close()
        self._sessions = {}
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:  # nothing of a test's Airflow is worth waiting longer for
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs = []
