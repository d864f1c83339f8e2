"""Where the state store is inside Airflow (issue 28.1): the connection ``redelivery_db``, or
``REDELIVERY_DATABASE_URL`` when set explicitly, never an embedded PostgreSQL started in a worker;
without either, one line naming the connection and how to define it. ``redelivery airflow-env``
points Airflow at the embedded server (the connection, and the metadata database through
SQLAlchemy's psycopg 3 dialect, which the wheel has). The provider's metadata links nowhere that
does not exist. Real Airflow objects (connections from the environment, ``dag.test``) and the real
embedded PostgreSQL; the test's own REDELIVERY_HOME and port, so a second embedded server, had one
been started, would show as its data directory."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CLI, REPO_ROOT, at, docs_page

pytestmark = pytest.mark.airflow

AIRFLOW = str(Path(sys.executable).parent / "airflow")


@pytest.fixture()
def no_state_store(monkeypatch, tmp_path):
    """Neither REDELIVERY_DATABASE_URL nor the connection ``redelivery_db``; REDELIVERY_HOME and
    the embedded server's port are the test's own (an embedded server started here would be a
    second one: its data directory is ``pgdata``, and it is stopped at the end)."""
    from harness.local_airflow import free_port
    from redelivery.settings import get_settings
    from redelivery.store import embedded

    monkeypatch.delenv("REDELIVERY_DATABASE_URL", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_REDELIVERY_DB", raising=False)
    monkeypatch.setenv("REDELIVERY_HOME", str(tmp_path))
    monkeypatch.setenv("REDELIVERY_PG_PORT", str(free_port()))
    get_settings.cache_clear()
    yield tmp_path / "pgdata"
    if (tmp_path / "pgdata").exists():  # the defect: stop the second server it started
        embedded.stop("immediate")
    monkeypatch.undo()
    get_settings.cache_clear()


def connection_of(url: str) -> str:
    """The connection ``redelivery_db`` (type redelivery) of a libpq URL, as JSON."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    fields = {"host": info["host"], "port": int(info["port"]), "login": info["user"]}
    return json.dumps(
        {"conn_type": "redelivery", **fields, "password": info.get("password"), "schema": info["dbname"]}
    )


def test_without_the_connection_the_hook_names_it_in_one_line_and_starts_nothing(no_state_store):
    import asyncio

    from redelivery.airflow.hooks import RedeliveryHook
    from redelivery.errors import DatabaseUnavailableError

    for call in (
        RedeliveryHook().get_database_url,
        lambda: asyncio.run(RedeliveryHook().aget_database_url()),
    ):
        with pytest.raises(DatabaseUnavailableError) as refused:
            call()
        text = str(refused.value)
        assert "\n" not in text and "Airflow connection 'redelivery_db' is not defined" in text
        assert "AIRFLOW_CONN_REDELIVERY_DB=" in text and "Admin > Connections" in text
        assert "REDELIVERY_DATABASE_URL" in text
    assert not no_state_store.exists()


def test_the_connection_or_an_explicit_url_is_the_state_store(database_url, no_state_store, monkeypatch):
    """The connection when it is the only one; REDELIVERY_DATABASE_URL, set explicitly, wins over
    the default connection (a harness, a test, a one-off run); a connection named on purpose is
    that connection."""
    from redelivery.airflow.hooks import RedeliveryHook
    from redelivery.settings import get_settings

    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_DB", connection_of(database_url))
    hook = RedeliveryHook()
    with hook.get_conn() as conn:
        assert conn.info.dbname == conn.execute("SELECT current_database()").fetchone()[0]
        assert conn.info.dbname == database_url.rsplit("/", 1)[1]
    assert hook.source == "the Airflow connection 'redelivery_db'"
    monkeypatch.setenv("REDELIVERY_DATABASE_URL", "postgresql://u:p@127.0.0.1:9/explicit")
    get_settings.cache_clear()
    assert hook.get_database_url() == "postgresql://u:p@127.0.0.1:9/explicit"
    assert hook.source == "REDELIVERY_DATABASE_URL"
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_STORE", connection_of(database_url))
    assert "dbname=" + database_url.rsplit("/", 1)[1] in RedeliveryHook("other_store").get_database_url()
    assert RedeliveryHook("other_store").source == "the Airflow connection 'other_store'"
    assert not no_state_store.exists()


def test_a_tier_task_without_the_connection_fails_and_starts_no_second_server(dagbag, no_state_store):
    """The outsider's report: the tier task started an embedded PostgreSQL in the worker (then
    found it never migrated). Now the task fails on the missing connection, having changed nothing."""
    run = dagbag.get_dag("redelivery_tier_seconds").test(logical_date=at(10))
    assert str(run.state).endswith("failed")
    assert not no_state_store.exists()


def exported(env: dict) -> dict[str, str]:
    """What ``redelivery airflow-env`` exports, run with ``env``."""
    done = subprocess.run([CLI, "airflow-env"], env=env, capture_output=True, text=True, check=True)
    pairs = [shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in done.stdout.splitlines()]
    return dict(pairs)


def test_airflow_env_points_airflow_at_the_embedded_server(tmp_path, monkeypatch):
    """The connection ``redelivery_db`` (the application database of the embedded server, its
    password from REDELIVERY_HOME) and the metadata database through psycopg 3 (the wheel has no
    psycopg2), which Airflow migrates (in an AIRFLOW_HOME of the test's own)."""
    from redelivery.airflow.hooks import RedeliveryHook
    from redelivery.settings import get_settings
    from redelivery.store import embedded

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REDELIVERY_DATABASE_URL"))}
    values = exported(env)
    connection = json.loads(values["AIRFLOW_CONN_REDELIVERY_DB"])
    assert connection == {
        "conn_type": "redelivery",
        "host": "127.0.0.1",
        "port": get_settings().pg_port,
        "login": "postgres",
        "password": embedded.password(),
        "schema": "redelivery",
    }
    metadata = values["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert metadata.startswith("postgresql+psycopg://postgres:") and metadata.endswith("/airflow")
    monkeypatch.delenv("REDELIVERY_DATABASE_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_DB", values["AIRFLOW_CONN_REDELIVERY_DB"])
    get_settings.cache_clear()
    try:
        with RedeliveryHook().get_conn() as conn:
            assert conn.execute("SELECT current_database()").fetchone()[0] == "redelivery"
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    checked = subprocess.run(  # what `make setup` runs, here through psycopg 3 (about 8 s)
        [AIRFLOW, "db", "migrate"],
        env={**env, **values, "AIRFLOW_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


def test_the_provider_links_to_nothing_that_does_not_exist():
    """Its documentation link was PyPI's page of a package that is not there (a 404): gone. The
    documentation is README (the distribution's long description), which sends an existing
    Airflow to docs/airflow.md, "Into an existing Airflow"."""
    import airflow
    import jsonschema

    from redelivery.airflow.provider import get_provider_info

    schema = Path(airflow.__file__).with_name("provider_info.schema.json")
    info = get_provider_info()
    jsonschema.validate(info, json.loads(schema.read_text()))
    assert "http" not in json.dumps(info)
    assert "](docs/airflow.md)" in (REPO_ROOT / "README.md").read_text()
    assert "## Into an existing Airflow" in docs_page("airflow.md")


@pytest.fixture(scope="module")
def never_migrated(database_url):
    """A database on the test's server that was never migrated (libpq URL)."""
    import psycopg
    from psycopg import sql

    name = (database_url.rsplit("/", 1)[1] + "_never_migrated")[:63]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield database_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _wrong_password(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    return f"postgresql://{info['user']}:not-the-password@{info['host']}:{info['port']}/{info['dbname']}"


#: The connection the form tests, and (whether the test passes, what its message says).
FORM = {
    "migrated": (None, True, "migrated to"),
    "never migrated": ("never_migrated", False, "redelivery db upgrade"),
    "wrong password": ("wrong", False, "authentication failed for user"),
    "unreachable": ("postgresql://u:p@127.0.0.1:9/redelivery", False, "cannot reach the state store"),
}


@pytest.mark.parametrize("store", list(FORM))
def test_the_connection_forms_test_button_says_whether_the_store_serves(
    database_url, never_migrated, monkeypatch, store
):
    """Issue 37.4: the Test button of Admin > Connections failed, the hook had no test_connection.
    Airflow's REST test puts the form's connection in a variable of a transient id and asks the
    hook of its type; the same here."""
    from airflow.models.connection import Connection
    from psycopg.conninfo import conninfo_to_dict

    target, passes, said = FORM[store]
    url = {None: database_url, "never_migrated": never_migrated, "wrong": _wrong_password(database_url)}.get(
        target, target
    )
    info = conninfo_to_dict(url)
    conn = Connection(
        conn_id="redelivery_form_test", conn_type="redelivery", host=info["host"], port=int(info["port"]),
        login=info["user"], password=info.get("password"), schema=info["dbname"],
    )  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_FORM_TEST", conn.get_uri())
    status, message = conn.test_connection()
    assert status is passes and said in message and "\n" not in message, message
    assert "not-the-password" not in message


def test_a_tier_task_on_a_never_migrated_store_fails_once_naming_the_fix(
    dagbag, no_state_store, never_migrated, monkeypatch, capfd
):
    """Issue 37.4: a tier task retried a configuration error 3 times, its log a raw psycopg error
    (relation "deliveries" does not exist). Now one try, one line naming the connection and the
    command that fixes it."""
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_DB", connection_of(never_migrated))
    run = dagbag.get_dag("redelivery_tier_seconds").test(logical_date=at(10))
    assert str(run.state).endswith("failed")
    [ti] = run.get_task_instances()
    assert ti.try_number == 1, ti.try_number  # no retry of what a retry cannot mend
    text = "".join(capfd.readouterr())  # the task's log, as dag.test writes it
    [line] = [ln for ln in text.splitlines() if "has no redelivery schema" in ln]
    assert "AirflowFailException" in line and "redelivery db upgrade" in line, line
    assert "the Airflow connection 'redelivery_db'" in line and "does not exist" not in text, line
    assert not no_state_store.exists()
