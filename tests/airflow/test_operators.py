"""What the operators would run, rendered without running anything: the spark-submit arguments and
environment of a tier window. Pure: Airflow is imported, never started."""

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redelivery.airflow.operators import TierWindowOperator, redrive_request, tier_request
from redelivery.jobs import application
from redelivery.spark.session import submit_environment
from redelivery.tiers.run import TierRunRequest

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class TaskInstance:
    dag_id, run_id, try_number = "redelivery_tier_seconds", "scheduled__2026-03-01", 2


def test_a_tier_run_is_its_data_interval_or_its_params():
    """The request is built from the run's values as they are: no round trip through text."""
    op = TierWindowOperator(task_id="apply_window", tier="seconds")
    assert op.conn_id == "redelivery_spark" and Path(application("tier_window")).exists()
    context = {
        "params": {"window_end": None, "levels": [], "dry_run": False},
        "data_interval_start": T0 - timedelta(seconds=10),
        "data_interval_end": T0,
        "ti": TaskInstance(),
    }
    assert tier_request("seconds", context, 10) == TierRunRequest(
        tier="seconds",
        window_start=T0 - timedelta(seconds=10),
        window_end=T0,
        run_key="redelivery_tier_seconds/scheduled__2026-03-01/2",
    )
    # a manual run of a batched tier: its trigger timetable's data interval is empty
    empty = {**context, "data_interval_start": T0, "data_interval_end": T0}
    assert tier_request("seconds", empty, 10).window_start == T0 - timedelta(seconds=10)
    context["params"] = {"window_end": "2026-03-01T11:00:00+00:00", "levels": [2], "dry_run": True}
    request = tier_request("seconds", context, 10)
    assert (request.window_start, request.window_end) == (None, T0 - timedelta(hours=1))
    assert (request.levels, request.dry_run) == ([2], True)
    # what the spark-submit entry point reads back is the same request
    assert TierRunRequest.model_validate_json(request.model_dump_json()) == request


def test_a_redrive_request_is_the_params_that_are_its_fields():
    request = redrive_request({"group": "billing", "reasons": None, "message_ids": [3], "dry_run": False})
    assert (request.group, request.reasons, request.message_ids, request.dry_run) == (
        "billing",
        [],
        [3],
        False,
    )


def test_the_default_spark_connection_is_the_warm_connect_server():
    import json

    from redelivery.airflow.env import airflow_environ
    from redelivery.settings import get_settings
    from redelivery.spark import connect_server

    conn = json.loads(airflow_environ()["AIRFLOW_CONN_REDELIVERY_SPARK"])
    assert conn == {
        "conn_type": "spark_connect",
        "host": "localhost",
        "port": get_settings().spark_connect_port,  # 15002 unless REDELIVERY_SPARK_CONNECT_PORT says
        "password": connect_server.token(),
    }
    assert connect_server.connect_url("localhost", 15002, "t0k") == "sc://localhost:15002/;token=t0k"
    # pyspark sends a token in the clear to localhost only: elsewhere it goes as a header
    assert connect_server.connect_url("spark", 15002, "t0k") == "sc://spark:15002/;authorization=Bearer%20t0k"


def test_submit_environment_for_a_local_driver():
    env, conf = submit_environment("local[2]", "postgresql://u@h/db")
    assert env["REDELIVERY_DATABASE_URL"] == "postgresql://u@h/db"
    assert env["PATH"].split(":")[0] == str(
        Path(sys.executable).parent
    )  # finds this environment's spark-submit
    assert conf["spark.pyspark.python"] == env["PYSPARK_PYTHON"]
    assert conf["spark.ui.enabled"] == "false" and conf["spark.sql.session.timeZone"] == "UTC"


def test_submit_environment_for_a_cluster_sends_no_local_paths():
    env, conf = submit_environment("yarn", "postgresql://u@h/db", deploy_mode="cluster")  # a driver there
    assert env == {"REDELIVERY_DATABASE_URL": "postgresql://u@h/db"}
    assert "spark.pyspark.python" not in conf and "spark.driver.extraJavaOptions" not in conf


def test_the_connect_server_has_a_bounded_heap_and_exits_when_it_runs_out(monkeypatch):
    """An out-of-heap JVM hangs its scheduler while still listening (seen in the demo): the server
    must exit instead, so that jobs fail at once and the next caller starts a fresh one."""
    import pydantic
    import pytest

    from redelivery.settings import Settings, get_settings
    from redelivery.spark.connect_server import command

    monkeypatch.setenv("REDELIVERY_SPARK_CONNECT_MEMORY", "6g")
    get_settings.cache_clear()
    try:
        argv, _ = command()
    finally:
        get_settings.cache_clear()
    assert argv[argv.index("--driver-memory") + 1] == "6g"
    assert "-XX:+ExitOnOutOfMemoryError" in argv[argv.index("--driver-java-options") + 1]
    with pytest.raises(pydantic.ValidationError):
        Settings(spark_connect_memory="lots")


def test_the_hook_keeps_the_connections_libpq_options(database_url, monkeypatch):
    """libpq keywords in the connection's extra reach the session, ``options`` included (the
    connection alone: REDELIVERY_DATABASE_URL, set explicitly, would win over it)."""
    import json

    from psycopg.conninfo import conninfo_to_dict

    from redelivery.airflow.hooks import RedeliveryHook
    from redelivery.settings import get_settings

    info = conninfo_to_dict(database_url)
    extra = {"options": "-c statement_timeout=4321", "application_name": "hook-test", "not_libpq": "x"}
    connection = {
        "conn_type": "postgres",
        "host": info["host"],
        "port": int(info["port"]),
        "login": info["user"],
        "password": info.get("password"),
        "schema": info["dbname"],
        "extra": extra,
    }
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_DB", json.dumps(connection))
    monkeypatch.delenv("REDELIVERY_DATABASE_URL")
    get_settings.cache_clear()
    shown_settings = ("statement_timeout", "application_name")
    try:
        with RedeliveryHook().get_conn() as conn:
            shown = [conn.execute(f"SHOW {name}").fetchone()[0] for name in shown_settings]
            assert shown == ["4321ms", "hook-test"]
            assert conn.execute("SELECT current_schema()").fetchone()[0] == "redelivery"
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_airflow_env_sizes_the_executor_for_the_machine(monkeypatch):
    """Issue 17.6: 32 LocalExecutor workers on 2 cores was Airflow's default; now 4 per core."""
    import os

    from redelivery.airflow.env import airflow_environ

    monkeypatch.delenv("AIRFLOW__CORE__PARALLELISM", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert airflow_environ()["AIRFLOW__CORE__PARALLELISM"] == "8"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert airflow_environ()["AIRFLOW__CORE__PARALLELISM"] == "64"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # the tiers' four slots and four more
    assert airflow_environ()["AIRFLOW__CORE__PARALLELISM"] == "8"
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "3")  # a deployment's own setting wins
    assert airflow_environ()["AIRFLOW__CORE__PARALLELISM"] == "3"


def test_a_spark_connect_url_is_the_providers_with_the_token_kept_off_a_plain_channel(monkeypatch):
    """The Spark provider's SparkConnectHook builds the URL (login as user id, token, use_ssl);
    pyspark sends a token only over TLS or to localhost, so elsewhere without TLS it goes as a
    header."""
    import json

    from redelivery.airflow.engine import connect_url

    def connection(**fields):
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps({"conn_type": "spark_connect", **fields}))
        return connect_url("spark_test")

    assert connection(host="localhost", port=15002, password="t0k") == "sc://localhost:15002/;token=t0k"
    assert connection(host="spark", port=15002, login="ana", password="t0k") == (
        "sc://spark:15002/;user_id=ana;authorization=Bearer%20t0k"
    )
    for use_ssl in (True, "true"):
        url = connection(host="spark", port=443, password="t0k", extra={"use_ssl": use_ssl})
        assert url.startswith("sc://spark:443/;token=t0k;use_ssl=")


def test_a_task_that_lost_its_supervisor_knows_it(tmp_path):
    """``orphaned()``: a task process whose parent (Airflow's supervisor) died sees it, so an hour's
    batch of tier windows or standing redrive ticks stops instead of going on unwatched."""
    import subprocess
    import textwrap
    import time

    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, time
        read, write = os.pipe()
        if os.fork() == 0:  # the task
            from redelivery.airflow.operators import orphaned
            gone = orphaned()
            before = gone()
            os.write(write, b"x")  # its supervisor may die now
            deadline = time.time() + 20
            while not gone() and time.time() < deadline:
                time.sleep(0.05)
            open({str(out)!r}, "w").write(f"{{before}} {{gone()}}")
            os._exit(0)
        os.read(read, 1)  # the supervisor dies once the task watches it
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert out.read_text() == "False True"


def test_a_pause_question_that_fails_counts_as_not_paused_and_is_said_once_a_kind():
    """The execution API not answering (a loaded API server) leaves the batch running until its
    span's end: the task's log says why (stop 55's CI run left no trace of it)."""
    from redelivery.airflow.operators import dag_paused

    answers = [TimeoutError("read timed out"), TimeoutError("again"), ConnectionError("refused"), None]

    class Asking(TaskInstance):
        def get_dag(self, dag_id):
            answer = answers.pop(0)
            if answer is not None:
                raise answer
            return type("Dag", (), {"is_paused": True})()

    said = []
    paused = dag_paused(Asking(), lambda text, *args: said.append(text % args))
    assert [paused() for _ in range(4)] == [False, False, False, True]
    assert said == [
        "cannot ask whether the DAG is paused (TimeoutError: read timed out): the batch goes on",
        "cannot ask whether the DAG is paused (ConnectionError: refused): the batch goes on",
    ]
