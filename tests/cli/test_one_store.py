"""One state store wherever you stand (issue 37.1). On a host with the Airflow connection
``redelivery_db`` (AIRFLOW_CONN_REDELIVERY_DB, or the connection in Airflow's database), the CLI
uses it: it used to start a new, empty embedded PostgreSQL in REDELIVERY_HOME and answer "unknown
consumer group". The embedded server starts only where no store is configured at all, and says so
when it is new; ``redelivery db url`` prints the store (password masked) and ``--verbose`` says
which and why. A port held by another REDELIVERY_HOME's server is said to be that, not "password
authentication failed".

Every command runs as a user's would: the installed ``redelivery``, an environment of the test's
own (a HOME without ``~/airflow``, a REDELIVERY_HOME and an embedded port of its own), real
PostgreSQL, a real Airflow metadata database."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from psycopg.conninfo import conninfo_to_dict

from helpers import CLI


@pytest.fixture()
def own(tmp_path):
    """An environment with no state store configured: no REDELIVERY_DATABASE_URL, no AIRFLOW_*,
    a HOME of its own (no ~/airflow), a REDELIVERY_HOME and a free embedded port of its own. An
    embedded server started there (the defect) is stopped at the end."""
    from harness.local_airflow import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REDELIVERY_DATABASE_URL"))}
    home = tmp_path / "redelivery-home"
    env.update(HOME=str(tmp_path), REDELIVERY_HOME=str(home), REDELIVERY_PG_PORT=str(free_port()))
    yield env
    if (home / "pgdata" / "postmaster.pid").exists():
        stop_embedded(env)


def stop_embedded(env: dict) -> None:
    subprocess.run([CLI, "db", "stop"], env=env, capture_output=True, timeout=120)


def redelivery(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def connection_json(url: str) -> str:
    """The connection ``redelivery_db`` (type redelivery) of a libpq URL, as Airflow takes it."""
    info = conninfo_to_dict(url)
    fields = {"host": info["host"], "port": int(info["port"]), "login": info["user"]}
    return json.dumps(
        {"conn_type": "redelivery", **fields, "password": info["password"], "schema": info["dbname"]}
    )


@pytest.fixture()
def orders(client):
    """The test database holds topic orders with group billing subscribed."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    client.publish("orders", [{"n": 1}])


def masked(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"postgresql://{info['user']}:***@{info['host']}:{info['port']}/{info['dbname']}"


def test_the_cli_uses_the_airflow_connection_of_the_environment(clean_db, orders, own):
    env = {**own, "AIRFLOW_CONN_REDELIVERY_DB": connection_json(clean_db)}
    done = redelivery("--verbose", "stats", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["orders"]["billing"]["READY"] == 1  # the connection's data
    said = [line for line in done.stderr.splitlines() if line.startswith("redelivery: state store ")]
    assert len(said) == 1 and masked(clean_db) in said[0], done.stderr
    assert "the Airflow connection 'redelivery_db'" in said[0] and "AIRFLOW_CONN_REDELIVERY_DB" in said[0]
    shown = redelivery("db", "url", env=env)
    assert shown.returncode == 0 and shown.stdout == masked(clean_db) + "\n", shown
    assert conninfo_to_dict(clean_db)["password"] not in shown.stdout + done.stderr
    assert not os.path.exists(own["REDELIVERY_HOME"] + "/pgdata")  # no embedded server started


def test_redelivery_database_url_wins_and_says_so(clean_db, orders, own):
    env = {**own, "AIRFLOW_CONN_REDELIVERY_DB": connection_json("postgresql://u:p@127.0.0.1:9/nowhere"),
           "REDELIVERY_DATABASE_URL": clean_db}  # fmt: skip
    done = redelivery("--verbose", "dlq", "count", "--group", "billing", env=env)
    assert done.returncode == 0 and done.stdout == "0\n", done.stderr
    assert "REDELIVERY_DATABASE_URL" in done.stderr and masked(clean_db) in done.stderr
    assert not os.path.exists(own["REDELIVERY_HOME"] + "/pgdata")


@pytest.mark.airflow
def test_the_cli_uses_the_connection_in_airflows_database(clean_db, orders, own, tmp_path):
    """No AIRFLOW_CONN_REDELIVERY_DB: the connection lives in Airflow's metadata database, which
    the host's Airflow configuration names (AIRFLOW_HOME, its SQL_ALCHEMY_CONN)."""
    from harness.local_airflow import fresh_metadata_db

    env = {**own, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = fresh_metadata_db("airflow_cli_one_store", env)
    added = subprocess.run(
        [os.path.join(os.path.dirname(CLI), "airflow"), "connections", "add", "redelivery_db",
         "--conn-json", connection_json(clean_db)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    done = redelivery("--verbose", "stats", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["orders"]["billing"]["READY"] == 1
    assert "the Airflow connection 'redelivery_db'" in done.stderr and "Airflow's database" in done.stderr
    assert not os.path.exists(own["REDELIVERY_HOME"] + "/pgdata")


def test_an_airflow_whose_connection_cannot_be_read_is_an_error_not_a_new_store(own, tmp_path):
    """Airflow is configured here, but its database does not answer: which store is meant cannot
    be known, so nothing is started; one line says why and what to set."""
    nowhere = "postgresql+psycopg://airflow:not-the-password@127.0.0.1:9/airflow"
    env = {**own, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": nowhere}  # fmt: skip
    done = redelivery("stats", env=env)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.startswith("redelivery: ") and done.stderr.count("\n") == 1, done.stderr
    assert "'redelivery_db'" in done.stderr and "REDELIVERY_DATABASE_URL" in done.stderr
    assert not os.path.exists(own["REDELIVERY_HOME"] + "/pgdata")


def test_with_no_store_configured_the_embedded_server_starts_and_a_new_one_says_so(own):
    first = redelivery("--verbose", "db", "upgrade", env=own)
    try:
        assert first.returncode == 0, first.stderr
        assert "new, empty" in first.stderr and own["REDELIVERY_HOME"] in first.stderr, first.stderr
        assert "the embedded PostgreSQL" in first.stderr
        again = redelivery("stats", "--json", env=own)
        assert again.returncode == 0 and json.loads(again.stdout) == {}
        assert "new, empty" not in again.stderr  # the same server: nothing to say without --verbose
        shown = redelivery("db", "url", env=own)
        assert shown.stdout == f"postgresql://postgres:***@127.0.0.1:{own['REDELIVERY_PG_PORT']}/redelivery\n"
    finally:
        stop_embedded(own)


def test_a_home_too_deep_for_a_unix_socket_still_starts_its_server(own):
    """A Unix socket's path has at most 107 bytes: with the socket in the data directory, a home
    this deep (a worker's temporary folder under pytest-xdist) made PostgreSQL refuse to start.
    Every client connects over TCP; the socket is left out then."""
    deep = f"{own['REDELIVERY_HOME']}/{'a-folder-of-a-long-name/' * 3}redelivery-home"
    assert len(f"{deep}/pgdata/.s.PGSQL.{own['REDELIVERY_PG_PORT']}") > 107
    env = {**own, "REDELIVERY_HOME": deep}
    done = redelivery("db", "upgrade", env=env)
    try:
        assert done.returncode == 0, done.stderr
        assert json.loads(redelivery("stats", "--json", env=env).stdout) == {}
    finally:
        stop_embedded(env)


def test_a_port_held_by_another_homes_server_says_so(database_url, own):
    """Two REDELIVERY_HOMEs on one port (the package's ~/.redelivery against a checkout's): this
    home's password was refused by the other home's server; now the line says whose port it is."""
    if os.environ.get("REDELIVERY_TEST_DATABASE_URL"):
        pytest.skip("the test database is not the embedded server")
    from redelivery.settings import get_settings

    env = {**own, "REDELIVERY_PG_PORT": str(get_settings().pg_port)}  # the test server's port
    done = redelivery("stats", env=env)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "password authentication failed" not in done.stderr, done.stderr
    assert f"port {get_settings().pg_port}" in done.stderr and "another REDELIVERY_HOME" in done.stderr
    assert str(get_settings().home.resolve() / "pgdata") in done.stderr  # whose it is
    assert "REDELIVERY_PG_PORT" in done.stderr
    assert not os.path.exists(own["REDELIVERY_HOME"] + "/pgdata")
