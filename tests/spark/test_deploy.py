"""What the executors get (redelivery.spark.deploy), without a cluster: the settings and a Spark
connection's extras, the executors' Python per master, the package's zip, spark-submit's
environment, and the version check every task makes first (tests/spark/test_cluster.py runs them
on a real cluster)."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
import zipfile
from pathlib import Path

import pyarrow as pa
import pytest

import redelivery
from redelivery.settings import get_settings
from redelivery.spark import deploy
from redelivery.spark.session import driver_here, submit_environment


@pytest.fixture()
def settings(monkeypatch):
    """Set REDELIVERY_* variables for one test: ``settings(SPARK_CONF=...)``."""

    def set_(**values):
        for key, value in values.items():
            monkeypatch.setenv(f"REDELIVERY_{key}", value)
        get_settings.cache_clear()

    yield set_
    monkeypatch.undo()
    get_settings.cache_clear()


def test_the_settings_and_a_connections_extras(settings):
    settings(SPARK_EXECUTOR_PYTHON="/opt/env/bin/python", SPARK_ARCHIVES="/a/env.tar.gz#env, /a/b.zip",
             SPARK_CONF=json.dumps({"spark.executor.memory": "1g", "spark.cores.max": 2,
                                    "spark.dynamicAllocation.enabled": False}))  # fmt: skip
    plain = deploy.deployment()
    assert plain.executor_python == "/opt/env/bin/python" and plain.archives == (
        "/a/env.tar.gz#env",
        "/a/b.zip",
    )
    assert plain.conf == {"spark.executor.memory": "1g", "spark.cores.max": "2",
                          "spark.dynamicAllocation.enabled": "false"}  # fmt: skip
    extras = {"executor_python": "./env/bin/python", "archives": [], "py_files": "x.py,y.zip",
              "conf": {"spark.executor.memory": "2g"}, "use_ssl": True}  # fmt: skip
    mine = deploy.deployment(extras)
    assert (mine.executor_python, mine.archives, mine.py_files) == ("./env/bin/python", (), ("x.py", "y.zip"))
    assert mine.conf["spark.executor.memory"] == "2g" and mine.conf["spark.cores.max"] == "2"
    with pytest.raises(ValueError, match="py_files must be comma-separated text or a list of strings"):
        deploy.deployment({"py_files": 3})
    with pytest.raises(ValueError, match="conf must be an object"):
        deploy.deployment({"conf": "spark.x=1"})


def test_the_executors_python_is_the_drivers_only_on_a_local_master(settings):
    settings()
    assert deploy.executor_python("local[2]") == sys.executable
    assert deploy.executor_python("spark://h:7077") is None  # Spark's own: python3 on the workers
    assert deploy.executor_python("yarn") is None
    settings(SPARK_EXECUTOR_PYTHON="./env/bin/python")
    assert deploy.executor_python("local[2]") == deploy.executor_python("yarn") == "./env/bin/python"


URL = "postgresql://u:s3cret@h:5432/db?sslmode=require"
ENV_PYTHON = "./env/bin/python"  # the executors' Python, in a packed environment


def test_a_driver_here_runs_on_this_python_with_the_whole_url_in_its_environment(settings):
    """Client mode (spark-submit's and the Spark provider's default) on every master: the driver is
    this process's machine, so its Python is this interpreter, the executors' theirs, and the URL
    (password included) is in spark-submit's environment, which no command line shows."""
    settings(SPARK_EXECUTOR_PYTHON=ENV_PYTHON, SPARK_ARCHIVES="hdfs:///envs/env.tar.gz#env")
    for master in ("yarn", "k8s://https://k:6443", "spark://h:7077"):
        for mode in (None, "client"):
            env, conf = submit_environment(master, URL, deploy_mode=mode)
            assert env["REDELIVERY_DATABASE_URL"] == URL, (master, mode)
            assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
            assert conf["spark.pyspark.driver.python"] == sys.executable  # spark-submit's PythonRunner
            assert conf["spark.pyspark.python"] == ENV_PYTHON  # the executors'
            assert "PYSPARK_PYTHON" not in env


def test_a_driver_in_the_cluster_gets_nothing_of_this_machine_and_no_password(settings):
    """Cluster mode on YARN and Kubernetes: the Spark provider puts the driver's environment on
    spark-submit's command line (``spark.yarn.appMasterEnv.*``, ``spark.kubernetes.driverEnv.*``),
    so the URL goes without its password (the cluster gives it: a secret's name in conf)."""
    secret = {"spark.kubernetes.driver.secretKeyRef.PGPASSWORD": "db:password"}
    settings(SPARK_EXECUTOR_PYTHON=ENV_PYTHON, SPARK_CONF=json.dumps(secret))
    for master in ("yarn", "k8s://https://k:6443"):
        env, conf = submit_environment(master, URL, deploy_mode="cluster")
        assert env == {"REDELIVERY_DATABASE_URL": "user=u dbname=db host=h port=5432 sslmode=require"}
        assert conf["spark.pyspark.python"] == ENV_PYTHON  # the driver's too, there
        assert "spark.pyspark.driver.python" not in conf and "spark.driver.extraJavaOptions" not in conf
        assert not any(sys.executable in value for value in conf.values())
        assert conf["spark.kubernetes.driver.secretKeyRef.PGPASSWORD"] == "db:password"  # names a secret


def test_a_deploy_mode_spark_refuses_is_one_line_before_anything_runs(settings):
    settings()
    for master in ("spark://h:7077", "local[2]"):
        with pytest.raises(
            ValueError, match=r"^deploy-mode cluster cannot run a Python job on master "
        ) as refused:
            submit_environment(master, URL, deploy_mode="cluster")
        assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="^deploy-mode must be client or cluster, got 'remote'$"):
        driver_here("yarn", "remote")
    env, conf = submit_environment("spark://h:7077", URL)  # standalone, client: Spark's own python3
    assert "spark.pyspark.python" not in conf and env["REDELIVERY_DATABASE_URL"] == URL
    assert deploy.submit_files(deploy.deployment({"py_files": "a.py", "archives": "e.tgz#env"})) == (
        "a.py",
        "e.tgz#env",
    )  # the package itself: the driver ships it (deploy.ship)


def provider_command(monkeypatch, extra: dict) -> tuple[list[str], dict | None]:
    """The command line the Spark provider runs for a tier window on a YARN connection with
    ``extra``, and the environment its process gets (None: the provider's own)."""
    from redelivery.airflow.engine import spark_submit
    from redelivery.jobs import application

    conn = {"conn_type": "spark", "host": "yarn", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_MODES", json.dumps(conn))
    hook, env = spark_submit("spark_modes", "tier_window", ["--request", "{}"], "redelivery-tier-x", URL)
    return hook._build_spark_submit_command(application("tier_window")), env


def test_the_providers_command_line_holds_no_password_in_either_mode(settings, monkeypatch):
    settings()
    extra = {"executor_python": ENV_PYTHON, "archives": "hdfs:///envs/env.tar.gz#env"}
    command, env = provider_command(monkeypatch, extra)  # client mode: the provider's default
    assert "s3cret" not in " ".join(command) and "--deploy-mode" not in command
    assert env["REDELIVERY_DATABASE_URL"] == URL  # spark-submit's own environment: the driver's
    assert f"spark.pyspark.driver.python={sys.executable}" in command
    assert f"spark.pyspark.python={ENV_PYTHON}" in command and "hdfs:///envs/env.tar.gz#env" in command
    command, env = provider_command(monkeypatch, {**extra, "deploy-mode": "cluster"})
    assert "s3cret" not in " ".join(command) and env is None
    assert command[command.index("--deploy-mode") + 1] == "cluster"
    assert (
        "spark.yarn.appMasterEnv.REDELIVERY_DATABASE_URL=user=u dbname=db host=h port=5432 sslmode=require"
        in command
    )
    assert not [arg for arg in command if sys.executable in arg]


def test_a_connect_server_holding_the_archives_gives_its_sessions_a_path_to_them(settings, tmp_path):
    """The project's Spark Connect server takes the archives at start (unpacked once for every
    session, where a session's archive is uploaded with each session); a session's Python workers
    start in the session's own folder, one below, so a relative Python goes up one level."""
    from redelivery.spark import connect_server

    settings(HOME=str(tmp_path), SPARK_EXECUTOR_PYTHON=ENV_PYTHON, SPARK_CONNECT_MASTER="spark://h:7077",
             SPARK_ARCHIVES="/envs/env.tar.gz#env")  # fmt: skip
    argv, env = connect_server.command()
    assert argv[argv.index("--archives") + 1] == "/envs/env.tar.gz#env"
    assert env["PYSPARK_PYTHON"] == "../env/bin/python"
    assert connect_server.session_python("/opt/env/bin/python") == "/opt/env/bin/python"
    assert connect_server.session_python("python3") == "python3"
    assert deploy.unpacked_as("hdfs:///envs/env.tar.gz#env") == "env"
    assert deploy.unpacked_as("file:/a/b.zip") == "b.zip"


def test_the_package_zip_is_built_once_per_content(settings, tmp_path):
    settings(HOME=str(tmp_path))
    deploy.package_zip.cache_clear()
    try:
        first = deploy.package_zip()
        deploy.package_zip.cache_clear()
        assert deploy.package_zip() == first and first.parent == tmp_path / "spark-py-files"
        assert deploy.archives(deploy.Deployment()) == [f"{first}#{first.stem}"]
    finally:  # no zip of this test's home stays cached for the tests after it
        deploy.package_zip.cache_clear()
    assert first.name.startswith(f"redelivery-{redelivery.__version__}-") and first.suffix == ".zip"
    names = zipfile.ZipFile(first).namelist()
    assert "redelivery/spark/deploy.py" in names and "redelivery/store/migrations/script.py.mako" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert deploy.archives(deploy.Deployment(ship_package=False, archives=("e.tgz#env",))) == ["e.tgz#env"]


def rows(batches):
    for batch in batches:
        yield pa.RecordBatch.from_pylist([{"n": len(batch)}])


def test_a_task_refuses_an_executor_with_another_redelivery_in_one_line(monkeypatch):
    task = deploy.checked(rows, deploy.Deployment(ship_package=False))
    batch = pa.RecordBatch.from_pylist([{"x": 1}, {"x": 2}])
    assert [b.to_pylist() for b in task(iter([batch]))] == [[{"n": 2}]]
    monkeypatch.setattr(redelivery, "__version__", "0.0.9")  # what this "executor" has
    with pytest.raises(RuntimeError) as refused:
        list(task(iter([batch])))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("redelivery 0.0.9 on Spark executor ")
    assert f"({sys.executable}), redelivery {deploy.__version__} on the driver: " in line
    # the driver raises that line alone, whatever Spark wrapped around it
    wrapped = f"Job aborted\nTraceback (most recent call last):\n  ...\nRuntimeError: {line}\n\tat org..."
    with pytest.raises(deploy.ExecutorEnvironmentError) as raised, deploy.executor_errors():
        raise Exception(wrapped)
    assert str(raised.value) == line
    with pytest.raises(ValueError, match="other"), deploy.executor_errors():
        raise ValueError("other")


def test_a_task_refuses_an_executor_without_the_base_libraries_in_one_line(monkeypatch):
    """What ``environment_check`` says of an executor that cannot import a library of the base
    install: the libraries, where, and the driver's versions to install."""
    assert deploy.environment_check(deploy.Deployment(ship_package=False))() is None  # this process has all
    monkeypatch.setitem(deploy.EXECUTOR_LIBRARIES, "no-such-lib", "no_such_module")
    monkeypatch.setitem(deploy.EXECUTOR_LIBRARIES, "pyarrow", "no_such_arrow")
    line = deploy.environment_check(deploy.Deployment(ship_package=False))()
    assert "\n" not in line and line.startswith("pyarrow, no-such-lib missing on Spark executor ")
    assert f"({sys.executable}): install the driver's pyarrow=={pa.__version__}, no-such-lib there" in line
    with pytest.raises(deploy.ExecutorEnvironmentError) as raised, deploy.executor_errors():
        raise Exception(f"Job aborted\nTraceback ...\nRuntimeError: {line}\n\tat org...")
    assert str(raised.value) == line


def test_an_executor_that_cannot_start_its_python_is_one_line():
    spark_said = (
        "Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent failure: "
        "Lost task 0.3 (TID 3) (10.0.0.7 executor 1): java.io.IOException: "
        'Cannot run program "./env/bin/python" '
        '(in directory "/yarn/container_1/abc"): error=2, No such file or directory\n\tat java.base/...'
    )
    with pytest.raises(deploy.ExecutorEnvironmentError) as raised, deploy.executor_errors():
        raise Exception(spark_said)
    assert str(raised.value).startswith(
        "a Spark executor cannot start its Python ./env/bin/python (error=2, No such file or directory): "
    )


def test_the_libraries_an_executor_needs_are_the_base_install():
    from helpers import REPO_ROOT

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]}
    assert names == set(deploy.EXECUTOR_LIBRARIES)
    assert deploy.driver_pins()["pyarrow"] == pa.__version__
