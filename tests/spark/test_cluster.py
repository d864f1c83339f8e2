"""redelivery on a standalone Spark cluster whose workers have their own Python, set up as
docs/spark-clusters.md says (issues 28, 37): a master and two workers (one core each) on 127.0.0.1,
started from the pyspark of the workers' own virtual environment, which holds the executor
install (the base wheel, no extras, built from a copy of the sources: its redelivery is another
version, ``OLD``) and PySpark; nothing of the checkout is on their paths, and no executor Python is
set: Spark's own ``python3`` is found first on the workers' PATH, in their environment. Beside it,
the packed environment the page's recipe makes (the base install with the driver's versions, no
PySpark, built on the nodes' interpreter ``NODES_PYTHON``, packed by venv-pack), which a job ships
as an archive and runs as ``./env/bin/python``.

Through that cluster, every driver in client mode (on this machine): a classic session, a Spark
Connect server started on it (``REDELIVERY_SPARK_CONNECT_MASTER``) that holds the packed
environment once for every session, and the engine hook's spark-submit through the Spark provider
with the packed environment (no password on any command line, the driver on this Python, the
executors on the archive's): a tier window, ``publish_dataframe``, ``lease`` -> ``settle`` and a
redrive, each ending exactly once per group; every task runs the driver's package (its zip,
shipped by the job, ahead of the workers' ``OLD``). Then a session that ships nothing finds ``OLD``
on the executors, and executors on a Python without the base libraries, each refused with one line
on the first task (no retry).

About 3 minutes: the workers' environment and the packed one (from uv's cache), the cluster, a
classic driver, the Connect server, a spark-submit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO_ROOT, UV, remove_unless_a_test_failed, uv_install

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

OLD = "0.0.9"  # the redelivery the workers have installed: not the driver's
#: What every driver gives the cluster (REDELIVERY_SPARK_CONF): reachable on 127.0.0.1, small executors.
DRIVER_CONF = {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m"}
#: The interpreter the nodes have, at the same path on each (not the driver's): the packed
#: environment is built on it, so its ``bin/python`` link leads there on every node.
NODES_PYTHON = Path("/usr/bin/python3.11")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@dataclass
class Cluster:
    master: str
    python: Path  # the workers' environment's python
    logs: Path


@pytest.fixture(scope="module")
def workers_python(tmp_path_factory, request) -> Iterator[Path]:
    """The workers' own environment, as docs/spark-clusters.md says for standalone: ``uv venv`` and
    the executor install (the wheel without extras) with PySpark; the wheel built from a copy of the
    sources whose version is ``OLD``."""
    import pyspark

    where = tmp_path_factory.mktemp("workers")
    source = where / "source"
    shutil.copytree(
        REPO_ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    init = source / "src" / "redelivery" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', f'__version__ = "{OLD}"'))
    run(UV, "build", "--wheel", "--out-dir", str(where / "dist"), str(source))
    (wheel,) = (where / "dist").glob("redelivery-*.whl")
    assert wheel.name.startswith(f"redelivery-{OLD}-")
    run(UV, "venv", "--quiet", "--python", sys.executable, str(where / "venv"))
    python = where / "venv" / "bin" / "python"
    uv_install("--python", str(python), f"pyspark=={pyspark.__version__}", str(wheel),
               "-c", str(REPO_ROOT / "requirements.txt"))  # fmt: skip
    listed = run(UV, "pip", "list", "--format", "json", "--python", str(python)).stdout
    names = {p["name"] for p in json.loads(listed)}
    assert not {n for n in names if n.startswith(("apache-airflow", "pyspark-client", "typer", "pandas"))}
    failed = request.session.testsfailed
    yield python
    remove_unless_a_test_failed(request, where, failed)  # 0.5 GB: a run must not leave it on the disk


@pytest.fixture(scope="module")
def packed_env(workers_python, tmp_path_factory, request) -> Iterator[Path]:
    """docs/spark-clusters.md's recipe for the executors' environment as an archive: the base
    install (here the ``OLD`` wheel) with the driver's versions as constraints, no PySpark (the
    cluster's own serves), in a virtual environment made on the nodes' interpreter, packed by
    venv-pack."""
    if not NODES_PYTHON.exists():
        pytest.skip(f"{NODES_PYTHON} (the nodes' interpreter) is not on this machine")
    where = tmp_path_factory.mktemp("packed")
    (wheel,) = (workers_python.parents[2] / "dist").glob("redelivery-*.whl")
    pins = run(UV, "pip", "freeze", "--python", sys.executable, "--exclude-editable").stdout
    (where / "driver-pins.txt").write_text(pins)  # the driver's versions: the executors' pins
    run(UV, "venv", "--quiet", "--python", str(NODES_PYTHON), str(where / "env"))
    uv_install("--python", str(where / "env" / "bin" / "python"), "-c", str(where / "driver-pins.txt"),
               str(wheel))  # fmt: skip
    archive = where / "redelivery-env.tar.gz"
    run(str(Path(sys.executable).parent / "venv-pack"), "-q", "-p", str(where / "env"), "-o", str(archive))
    names = run("tar", "-tzf", str(archive)).stdout.splitlines()
    assert not [n for n in names if "/site-packages/pyspark/" in n] and "bin/python" in names
    assert archive.stat().st_size < 100 * 2**20  # 66 MB; with PySpark it was 522 MB
    failed = request.session.testsfailed
    yield archive
    remove_unless_a_test_failed(request, where, failed)


def spark_home_of(python: Path) -> Path:
    found = run(str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))")
    return Path(found.stdout.strip())


def alive_workers(webui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as answer:
            return sum(w["state"] == "ALIVE" for w in json.load(answer)["workers"])
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(workers_python, tmp_path_factory, request):
    """A standalone master and two workers (one core, 1 GB each) on 127.0.0.1, started from the
    workers' pyspark with an environment of their own: their PATH leads to their virtual
    environment first, so Spark's default ``python3`` is theirs; nothing of the checkout."""
    where = tmp_path_factory.mktemp("cluster")
    spark_home = spark_home_of(workers_python)
    env = {"PATH": f"{workers_python.parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "HOME": str(where),
           "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1", "LANG": "C.UTF-8",
           **({"JAVA_HOME": os.environ["JAVA_HOME"]} if "JAVA_HOME" in os.environ else {})}  # fmt: skip
    port, webui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    spark_class = str(spark_home / "bin" / "spark-class")
    commands = [[spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(webui)]]  # fmt: skip
    for n in (1, 2):
        commands.append([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                         "--work-dir", str(where / f"work-{n}"), master])  # fmt: skip
    processes, failed = [], request.session.testsfailed
    try:
        for n, argv in enumerate(commands):
            with open(where / f"{n}.log", "w") as log:
                processes.append(
                    subprocess.Popen(argv, env=env, cwd=where, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
                )  # fmt: skip
        deadline = time.monotonic() + 120
        while alive_workers(webui) < 2:
            assert time.monotonic() < deadline, "\n".join(p.read_text()[-2000:] for p in where.glob("*.log"))
            time.sleep(0.5)
        yield Cluster(master, workers_python, where)
    finally:
        for process in reversed(processes):  # the workers (and their executors) first
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        remove_unless_a_test_failed(request, where, failed)  # the executors' work folders: 0.8 GB


def driver_env(database_url: str) -> dict:
    """A driver's environment: the checkout's (the driver is on the checkout's machine), the Spark
    conf of DRIVER_CONF, and no PYSPARK_PYTHON: nobody chooses the executors' Python."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    return {**env, "REDELIVERY_DATABASE_URL": database_url, "SPARK_LOCAL_IP": "127.0.0.1",
            "REDELIVERY_SPARK_CONF": json.dumps(DRIVER_CONF)}  # fmt: skip


def flows(spark, url: str) -> dict:
    """The four Spark paths on ``spark`` against the state store at ``url`` (empty): what each
    returned, and where the tasks ran."""
    from helpers import at
    from redelivery.client import Client
    from redelivery.redrive import RedriveRequest, redrive
    from redelivery.spark.dataframes import lease, publish_dataframe, settle
    from redelivery.spark.session import functions_for
    from redelivery.spark.tasks import run_in_tasks
    from redelivery.tiers.run import TierRunRequest, run_tier

    def probe(_):  # pickled by value: nothing of this module on the executors
        import os
        import sys

        from pyspark import SparkFiles

        import redelivery

        return {"python": sys.executable, "package": redelivery.__file__, "version": redelivery.__version__,
                "path": sys.path, "pythonpath": os.environ.get("PYTHONPATH", ""), "cwd": os.getcwd(),
                "files": SparkFiles.getRootDirectory()}  # fmt: skip

    out = {"executors": run_in_tasks(spark, probe, [0, 1, 2, 3])}
    with Client(url) as client:  # a tier window: 2,000 retries due, 2,000 leases run out
        client.create_topic("orders")
        for group, most in (("billing", None), ("strict", 0)):
            client.create_group(group, max_reconsume_times=most)
            client.subscribe(group, "orders")
        client.publish("orders", [{"n": i} for i in range(2000)], at=at(0))
        client.nack("billing", client.receive("billing", "orders", 2000, 30, at=at(0)), error="x", at=at(0))
        client.receive("strict", "orders", 2000, 5, at=at(0))
        client.create_topic("events")
        client.create_group("audit")
        client.subscribe("audit", "events")
    window = {"spark": spark, "url": url, "spark_threshold": 0}
    out["tier"] = [
        run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key=f"cluster-{n}"), **window)
        for n in (1, 2)
    ]
    rows = [(f"k{i}", json.dumps({"n": i})) for i in range(1000)]
    df = spark.createDataFrame(rows, "key string, body string").repartition(4)
    out["published"] = [publish_dataframe(df, "events", "cluster-batch", url=url) for _ in range(2)]
    leased = lease(spark, "audit", "events", max_messages=2000, invisible_duration=300, url=url)
    F = functions_for(leased)  # noqa: N806
    n = F.get_json_object("body", "$.n").cast("int")
    outcome = F.when(n % 4 == 0, "reject").when(n % 4 == 1, "retry").otherwise("ack")
    outcomes = leased.select(
        "message_id", "delivery_count", outcome.alias("outcome"), F.lit("e").alias("error")
    )
    out["settled"] = [settle(outcomes, "audit", "events", url=url) for _ in range(2)]
    request = RedriveRequest(group="audit", rate_limit=None, dry_run=False)
    out["redriven"] = [
        redrive(request, run_key=f"cluster-redrive-{n}", url=url, spark=spark, spark_threshold=0,
                log=lambda *_: None)["moved"]
        for n in (1, 2)
    ]  # fmt: skip
    return json.loads(json.dumps(out, default=str))


def check(results: dict, url: str, python: Callable[[str], bool]) -> None:
    """Every task ran the driver's package on the executors' Python (``python`` of its path says
    so), nothing of the checkout in sight, and each path ended exactly once per group."""
    import redelivery
    from redelivery.client import Client
    from redelivery.spark.deploy import package_zip

    for where in results["executors"]:
        assert python(where["python"]), where["python"]
        # the driver's package, unpacked by Spark among the task's files ("." on a classic executor)
        files = os.path.normpath(os.path.join(where["cwd"], where["files"]))
        shipped = os.path.join(files, package_zip().stem, "redelivery", "__init__.py")
        assert os.path.normpath(where["package"]) == shipped, where
        assert where["version"] == redelivery.__version__
        assert not any(str(REPO_ROOT) in p for p in [*where["path"], where["pythonpath"]]), where
    first, again = results["tier"]
    assert first["engine"] == "spark" and first["partitions"] > 1 and first["promoted"] == 2000
    assert first["by_group"]["strict"]["dead_lettered"] == {"LEASE_EXPIRED": 2000}
    assert again["promoted"] == again["dead_lettered"] == 0
    assert results["published"] == [1000, 1000]  # the second run of the batch id added nothing
    assert results["settled"] == [
        {"acked": 500, "retried": 250, "dead_lettered": 250, "stale": 0},
        {"acked": 0, "retried": 0, "dead_lettered": 0, "stale": 1000},
    ]
    assert results["redriven"] == [250, 0]
    with Client(url) as client:
        stats = client.stats()
        assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 3000  # each once
    assert (stats["orders"]["billing"]["READY"], stats["orders"]["strict"]["DLQ"]) == (2000, 2000)
    audit = stats["events"]["audit"]
    assert (audit["COMMITTED"], audit["WAITING_RETRY"], audit["READY"], audit["DLQ"]) == (500, 250, 250, 0)


def test_a_classic_session_on_the_cluster(cluster, clean_db):
    env = {**driver_env(clean_db), "PYTHONPATH": f"{REPO_ROOT / 'tests'}{os.pathsep}{REPO_ROOT}"}
    done = run(sys.executable, __file__, cluster.master, env=env, timeout=400)
    results = json.loads(done.stdout.split("REDELIVERY_CLUSTER ", 1)[1])
    check(results, clean_db, lambda python: Path(python).parent == cluster.python.parent)  # workers' python3


def from_the_archive(python: str) -> bool:
    """Whether ``python`` is ``bin/python`` of the packed environment, unpacked as ``env``, a link
    to the nodes' interpreter."""
    return python.endswith("/env/bin/python") and os.path.realpath(python) == os.path.realpath(NODES_PYTHON)


def test_executors_without_the_base_libraries_fail_with_one_line_on_the_first_task(cluster, clean_db):
    """Executors on the nodes' bare Python (no pyarrow, no psycopg): the first task (a plain Python
    UDF: an Arrow task could not even start there) says so in one line, with the driver's versions;
    no task fails, so Spark tries none again (4 attempts on a cluster, 15-35 s, a traceback)."""
    env = {**driver_env(clean_db), "REDELIVERY_SPARK_EXECUTOR_PYTHON": str(NODES_PYTHON),
           "PYTHONPATH": f"{REPO_ROOT / 'tests'}{os.pathsep}{REPO_ROOT}"}  # fmt: skip
    done = run(sys.executable, __file__, cluster.master, "probe", env=env, timeout=300)
    line = json.loads(done.stdout.split("REDELIVERY_CLUSTER ", 1)[1])
    missing = line.split(" missing on Spark executor ", 1)[0].split(", ")
    assert {"pyarrow", "psycopg"} <= set(missing), line
    assert f"({NODES_PYTHON}): install the driver's " in line and "\n" not in line
    assert "Lost task" not in done.stderr  # no attempt failed


@contextmanager
def every_process():
    """Each process's command lines (a pid's changes as spark-submit's scripts exec the JVM), its
    working directory, and its ``REDELIVERY_DATABASE_URL``, polled from /proc while the block runs."""
    seen: dict[int, dict] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    argv = [
                        a.decode(errors="replace")
                        for a in Path(entry.path, "cmdline").read_bytes().split(b"\0")
                        if a
                    ]
                    found = seen.setdefault(
                        int(entry.name), {"argvs": [], "cwd": os.readlink(Path(entry.path, "cwd"))}
                    )
                    if argv and argv not in found["argvs"]:
                        found["argvs"].append(argv)
                        for item in Path(entry.path, "environ").read_bytes().split(b"\0"):
                            if item.startswith(b"REDELIVERY_DATABASE_URL="):
                                found["url"] = item.split(b"=", 1)[1].decode()
                except OSError:
                    continue  # gone meanwhile
            stop.wait(0.1)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def test_spark_submit_in_client_mode_on_the_cluster(cluster, packed_env, clean_db, monkeypatch):
    """The engine hook's spark-submit through the Spark provider in client mode (its default, and
    Airflow's): the driver here on this Python with the URL, password included, in spark-submit's
    environment and on no command line; the executors on the packed environment's Python."""
    from psycopg.conninfo import conninfo_to_dict

    from helpers import at
    from redelivery.airflow.engine import EngineHook
    from redelivery.airflow.hooks import RedeliveryHook
    from redelivery.client import Client
    from redelivery.config import RedeliveryConfig
    from redelivery.jobs import application
    from redelivery.settings import get_settings
    from redelivery.tiers.run import TierRunRequest

    extra = {"deploy-mode": "client", "archives": f"{packed_env}#env", "executor_python": "./env/bin/python",
             "conf": DRIVER_CONF}  # fmt: skip
    spark_conn = {"conn_type": "spark", "host": cluster.master, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_SPARK_CLUSTER", json.dumps(spark_conn))
    monkeypatch.setenv("REDELIVERY_DATABASE_URL", clean_db)
    get_settings.cache_clear()
    with Client(clean_db) as client:
        client.create_topic("orders")
        client.create_group("billing")
        client.subscribe("billing", "orders")
        client.publish("orders", [{"n": i} for i in range(2000)], at=at(0))
        client.nack("billing", client.receive("billing", "orders", 2000, 30, at=at(0)), error="x", at=at(0))
    engine = EngineHook("redelivery_spark_cluster", RedeliveryHook(), RedeliveryConfig(spark_threshold=1))
    try:
        with every_process() as seen:
            summary = engine.run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="submit-1"))
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert summary["engine"] == "spark-submit" and summary["promoted"] == 2000
    password = conninfo_to_dict(clean_db)["password"]
    assert password and not [argv for p in seen.values() for argv in p["argvs"] if password in " ".join(argv)]
    submit = [p for p in seen.values() if any("redelivery-tier-seconds" in argv for argv in p["argvs"])]
    assert submit and all(p.get("url") == clean_db for p in submit)  # from spark-submit's environment
    driver = [p for p in seen.values() if [sys.executable, application("tier_window")] in
              [argv[:2] for argv in p["argvs"]]]  # fmt: skip
    assert driver, "no driver on this Python"
    daemons = [p for p in seen.values() if any("pyspark.daemon" in argv for argv in p["argvs"])]
    executors = [p for p in daemons if p["cwd"].startswith(str(cluster.logs))
                 and p["argvs"][0][0] == "./env/bin/python"]  # fmt: skip
    assert executors, "no executor on the packed environment's Python"


# The Connect server holds the cluster's cores until the module ends: its tests come last.
@pytest.fixture(scope="module")
def connect_server(cluster, packed_env, database_url, tmp_path_factory):
    """The project's Spark Connect server with its executors on the cluster
    (``REDELIVERY_SPARK_CONNECT_MASTER``) and the packed environment (``REDELIVERY_SPARK_ARCHIVES``,
    executors on ``./env/bin/python``), started by ``redelivery spark-connect start`` with a home of
    its own (not the checkout's server); yields its URL."""
    from helpers import CLI
    from redelivery.spark.jvm import cds_archive

    home = tmp_path_factory.mktemp("connect-home")
    if cds_archive().exists():  # the checkout's class-data sharing archive: a faster JVM start
        (home / cds_archive().name).symlink_to(cds_archive())
    env = {**driver_env(database_url), "REDELIVERY_HOME": str(home), "REDELIVERY_SPARK_CONNECT_MASTER":
           cluster.master, "REDELIVERY_SPARK_CONNECT_PORT": str(free_port()),
           "REDELIVERY_SPARK_CONNECT_MEMORY": "1g", "REDELIVERY_SPARK_ARCHIVES": f"{packed_env}#env",
           "REDELIVERY_SPARK_EXECUTOR_PYTHON": "./env/bin/python"}  # fmt: skip
    run(CLI, "spark-connect", "start", env=env, timeout=240)
    try:
        yield run(CLI, "spark-connect", "url", env=env).stdout.strip()
    finally:
        run(CLI, "spark-connect", "stop", env=env)


def test_spark_connect_on_the_cluster(connect_server, packed_env, clean_db, monkeypatch):
    """A client with the server's settings: the server holds the packed environment for every
    session, so the session uploads only the package's zip, never the 66 MB archive."""
    from redelivery.settings import get_settings
    from redelivery.spark import deploy
    from redelivery.spark.session import get_spark

    monkeypatch.setenv("REDELIVERY_SPARK_ARCHIVES", f"{packed_env}#env")
    get_settings.cache_clear()
    spark = get_spark("redelivery-cluster-connect", master=connect_server)
    try:
        assert deploy.server_archives(spark) == {"env"}
        assert [name for session, name in deploy._shipped if session == spark.session_id] == [
            f"{deploy.package_zip()}#{deploy.package_zip().stem}"
        ]
        check(flows(spark, clean_db), clean_db, from_the_archive)
    finally:
        spark.stop()
        monkeypatch.undo()
        get_settings.cache_clear()


def test_an_executor_with_another_redelivery_fails_with_one_line(connect_server, monkeypatch):
    """A session that ships nothing (REDELIVERY_SPARK_SHIP_PACKAGE=false) leaves the executors their
    own redelivery, OLD (the packed environment's): the first task compares it with the driver's."""
    import redelivery
    from redelivery.settings import get_settings
    from redelivery.spark.deploy import ExecutorEnvironmentError
    from redelivery.spark.session import get_spark
    from redelivery.spark.tasks import run_in_tasks

    monkeypatch.setenv("REDELIVERY_SPARK_SHIP_PACKAGE", "false")
    get_settings.cache_clear()
    try:
        spark = get_spark("redelivery-cluster-old", master=connect_server)
        with pytest.raises(ExecutorEnvironmentError) as failed:
            run_in_tasks(spark, str, [0])
        spark.stop()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    line = str(failed.value)
    assert "\n" not in line and line.startswith(f"redelivery {OLD} on Spark executor "), line
    assert f"redelivery {redelivery.__version__} on the driver" in line


if __name__ == "__main__":  # the classic driver: python test_cluster.py spark://host:port [probe]
    from redelivery.spark.deploy import ExecutorEnvironmentError
    from redelivery.spark.session import get_spark
    from redelivery.spark.tasks import run_in_tasks

    session = get_spark("redelivery-cluster-classic", master=sys.argv[1])
    try:
        if sys.argv[2:] == ["probe"]:
            try:
                results = run_in_tasks(session, str, [0])
            except ExecutorEnvironmentError as refused:
                results = str(refused)
        else:
            results = flows(session, os.environ["REDELIVERY_DATABASE_URL"])
    finally:
        session.stop()
    print("REDELIVERY_CLUSTER " + json.dumps(results), flush=True)
