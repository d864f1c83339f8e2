"""The distribution as a user installs it: the wheel built from this checkout, installed with its
``airflow`` extra into a fresh virtual environment outside the checkout (the versions of
requirements.txt as constraints), is an Airflow provider (``airflow providers list``, the
connection type ``redelivery``), and a DAG file outside the checkout scheduled by
``MessageQueueTrigger(scheme="redelivery", ...)`` is started by new messages under a real
triggerer and scheduler, running the installed package.

About 2-3 minutes: the build and the install (packages come from uv's cache once downloaded), then
Airflow's servers from the fresh environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers import REPO_ROOT, UV, remove_unless_a_test_failed, uv_install

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(900)]

TOPIC, GROUP, DAG_ID = "wheel-orders", "wheel-billing", "wheel_consumer"

DAG_FILE = f'''
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

trigger = MessageQueueTrigger(scheme="redelivery", topic="{TOPIC}", group="{GROUP}", poll_interval=1)
orders = Asset("redelivery://{TOPIC}/{GROUP}", watchers=[AssetWatcher(name="wheel_watcher", trigger=trigger)])

with DAG("{DAG_ID}", schedule=[orders], is_paused_upon_creation=False, catchup=False):

    @task
    def consume():
        import redelivery
        from redelivery.client import Client

        with Client() as client:
            received = client.receive("{GROUP}", "{TOPIC}", max_messages=100, invisible_duration=60)
            client.ack("{GROUP}", received)
        return {{"package": redelivery.__file__, "bodies": sorted(m.body["n"] for m in received)}}

    consume()
'''


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory, request) -> Iterator[Path]:
    """A fresh virtual environment, outside the checkout, with the built wheel installed; returns
    its bin folder."""
    where = tmp_path_factory.mktemp("wheel")
    source = where / "source"  # a copy: a build leaves src/*.egg-info, which the checkout must not have
    shutil.copytree(
        REPO_ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    run(UV, "build", "--wheel", "--out-dir", str(where / "dist"), str(source))
    (wheel,) = (where / "dist").glob("redelivery-*.whl")
    run(UV, "venv", "--quiet", "--python", sys.executable, str(where / "venv"))
    python = where / "venv" / "bin" / "python"
    uv_install(
        "--python",
        str(python),
        f"{wheel}[airflow]",  # as README says: the base install is the Spark executors'
        # an existing Airflow keeps its metadata in PostgreSQL through psycopg2 (the postgres provider)
        "apache-airflow-providers-postgres",
        "-c",
        str(REPO_ROOT / "requirements.txt"),
        # as README says: the Spark provider's pyspark-client would overwrite pyspark's own files
        "--excludes",
        str(REPO_ROOT / "excludes.txt"),
    )
    failed = request.session.testsfailed
    yield python.parent
    remove_unless_a_test_failed(request, where, failed)  # 0.9 GB: a run must not leave it on the disk


def fresh_env(bin_dir: Path, home: Path) -> dict:
    """The environment of a process of the fresh venv: nothing of the checkout on its paths."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "REDELIVERY_CONFIG", "PYTHON"))
    }
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "AIRFLOW_HOME": str(home)}


def test_the_installed_wheel_is_an_airflow_provider(installed, tmp_path):
    env = fresh_env(installed, tmp_path)

    def airflow(*args: str):
        return json.loads(run(str(installed / "airflow"), *args, "-o", "json", env=env, cwd=tmp_path).stdout)

    package = run(str(installed / "python"), "-c", "import redelivery; print(redelivery.__file__)", env=env)
    assert Path(package.stdout.strip()).is_relative_to(installed.parent)
    import pyspark

    spark = run(str(installed / "python"), "-c", "import pyspark; print(pyspark.__version__)", env=env)
    assert spark.stdout.strip() == pyspark.__version__  # not pyspark-client's older copy over it
    providers = {p["package_name"]: p for p in airflow("providers", "list")}
    assert providers["redelivery"]["version"] == "0.1.0"
    hooks = {h["connection_type"]: h for h in airflow("providers", "hooks")}
    assert hooks["redelivery"]["class"] == "redelivery.airflow.hooks.RedeliveryHook"
    assert [p["name"] for p in airflow("plugins")].count("redelivery") == 1  # once: its entry point


def test_a_message_queue_trigger_starts_a_dag_outside_the_checkout(installed, database_url, tmp_path):
    import requests

    from harness.local_airflow import WITH_TRIGGERER, LocalAirflow
    from redelivery.client import Client

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "wheel_consumer.py").write_text(DAG_FILE)
    with Client(database_url) as client:
        client.create_topic(TOPIC)
        client.create_group(GROUP)
        client.subscribe(GROUP, TOPIC)
    env = {
        **{k: None for k in os.environ if k.startswith(("REDELIVERY_CONFIG", "PYTHON"))},
        "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
    }
    metadata = f"airflow_wheel_{urlsplit(database_url).path.lstrip('/')}"[:63]
    home = tmp_path / "airflow-home"
    with LocalAirflow(
        home, metadata, env, components=WITH_TRIGGERER, airflow=str(installed / "airflow")
    ) as airflow:
        runs_url = f"{airflow.url}/api/v2/dags/{DAG_ID}/dagRuns"
        # nothing is READY yet: the watcher, once the triggerer runs it, fires for these messages
        # (as the backlog at its first poll, or as an edge after it)
        before = {r["dag_run_id"] for r in requests.get(runs_url, timeout=30).json()["dag_runs"]}
        assert before == set()
        with Client(database_url) as client:
            client.publish(TOPIC, [{"n": 1}, {"n": 2}])
        new = wait_until(
            lambda: _finished_runs(runs_url, before), "a run started by the new messages", airflow
        )
        assert [r["state"] for r in new] == ["success"], new
        xcom = requests.get(
            f"{runs_url}/{new[0]['dag_run_id']}/taskInstances/consume/xcomEntries/return_value", timeout=30
        ).json()["value"]
    assert Path(xcom["package"]).is_relative_to(installed.parent)  # the wheel's copy, not the checkout's
    assert xcom["bodies"] == [1, 2]


def _finished_runs(runs_url: str, known: set) -> list | None:
    import requests

    runs = [r for r in requests.get(runs_url, timeout=30).json()["dag_runs"] if r["dag_run_id"] not in known]
    return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None


def wait_until(condition, what: str, airflow, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(1)
    logs = "\n".join(p.read_text()[-3000:] for p in airflow.logs.iterdir())
    raise AssertionError(f"waited {timeout} s for {what}:\n{logs}")
