"""What Spark's executors get from redelivery, the same on every path (a classic session, Spark
Connect, spark-submit): their Python, archives (a packed environment), py-files, extra Spark conf,
and the package's own code; and the check each task makes first, that its executor runs the
driver's redelivery.

The settings: ``REDELIVERY_SPARK_EXECUTOR_PYTHON``, ``_ARCHIVES``, ``_PY_FILES``, ``_CONF``,
``_SHIP_PACKAGE`` (``redelivery.settings``); inside Airflow the Spark connection's extras
``executor_python``, ``archives``, ``py_files``, ``conf`` replace them (``conf`` key by key).

The package travels with every job: a zip of the driver's installed ``redelivery`` package (pure
Python), built once per content into ``REDELIVERY_HOME/spark-py-files/``, which each session
gives its executors as an archive (Spark unpacks it next to the task's files) and each task puts
first on its ``sys.path`` before anything of redelivery is imported. So the executors need only
the libraries of the base install (psycopg, pyarrow, pgpq, orjson, pydantic, pydantic-settings,
pyyaml, tenacity) and PySpark; a redelivery installed there is shadowed by the driver's. An
archive rather than py-files: a zip on ``sys.path`` is imported by zipimport, whose modules have
no folder to read their package's files from (every ``Client`` checks the schema against the
migration files), and spark-submit's ``--py-files`` would put it on the driver's own path too.
The session ships it (``ship``), not spark-submit's command line: the driver ships the package it
runs, wherever it runs (this machine, or a cluster in cluster mode). Before the first job of an
application, one task checks that its executor can import the base install's libraries and runs
the driver's redelivery, and every task checks its own executor first (``environment_check``): a
refusal is one line, ``ExecutorEnvironmentError``.

What pyspark 4.3 does with these (its source):

- the executors' Python is the ``pythonExec`` every Python function carries from the driver: a
  classic ``SparkContext`` takes its process's ``PYSPARK_PYTHON`` when it starts (else
  ``python3``); the ``spark.pyspark.python`` conf is read by spark-submit only, which exports it to
  the driver's Python; a Spark Connect server uses its own ``PYSPARK_PYTHON`` for every session
  (``SparkConnectPlanner``): a Connect client cannot choose it;
- archives: ``spark.archives`` / ``--archives`` / ``SparkContext.addArchive`` (unpacked in the
  executors' working directory, the tasks' ``SparkFiles`` root: ``./env/bin/python`` names the
  Python of ``env.tar.gz#env``), ``addArtifacts(..., archive=True)`` on Connect (session-scoped:
  a session's Python workers are its own and work in the session's folder, where its files are);
- py-files: ``SparkContext.addPyFile``, ``addArtifacts(..., pyfile=True)`` (Connect; also put on
  the client's ``sys.path``), ``--py-files``; a Python worker puts each ahead of site-packages. On
  Connect the same artifact name with the same bytes again is a no-op, other bytes an error.
- a Spark Connect session's Python workers start in the session's own folder (``SparkFiles`` root /
  session id: ``PythonWorkerFactory``), where its artifacts are, one below the server's own
  ``spark.archives``;
- a task that raises is tried again (``spark.task.maxFailures``, 4 on a cluster): only a failure
  to serialize aborts at once, so a check that must not be retried returns its answer.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redelivery import __version__
from redelivery.settings import get_settings


class ExecutorEnvironmentError(RuntimeError):
    """A Spark task found an executor without the driver's redelivery (the message is one line)."""


@dataclass(frozen=True)
class Deployment:
    """What a job gives its executors (see the module docstring)."""

    executor_python: str | None = None
    archives: tuple[str, ...] = ()
    py_files: tuple[str, ...] = ()
    conf: dict[str, str] = field(default_factory=dict)
    ship_package: bool = True


def _names(value, what: str) -> tuple[str, ...]:
    """Comma-separated text or a list of strings as a tuple of names."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"{what} must be comma-separated text or a list of strings, got {value!r}")


def _conf(value, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be an object of Spark conf keys and values, got {value!r}")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def deployment(extras: Mapping | None = None) -> Deployment:
    """The settings' deployment, with a Spark connection's ``extras`` over them. Raises
    ``ValueError`` naming an extra of the wrong type."""
    settings, extras = get_settings(), extras or {}
    python = extras.get("executor_python") or settings.spark_executor_python
    if python is not None and not isinstance(python, str):
        raise ValueError(f"executor_python must be a path, got {python!r}")
    archives = extras["archives"] if "archives" in extras else settings.spark_archives
    py_files = extras["py_files"] if "py_files" in extras else settings.spark_py_files
    return Deployment(
        executor_python=python or None,
        archives=_names(archives, "archives"),
        py_files=_names(py_files, "py_files"),
        conf={**_conf(settings.spark_conf, "spark_conf"), **_conf(extras.get("conf") or {}, "conf")},
        ship_package=settings.spark_ship_package,
    )


def is_local(master: str | None) -> bool:
    """Whether ``master`` runs the executors in the driver's machine and environment."""
    return bool(master) and master.startswith("local")


def executor_python(master: str | None, deploy: Deployment | None = None) -> str | None:
    """The executors' Python for ``master``: the deployment's, else this interpreter for a
    ``local[...]`` master, else None (Spark's own default)."""
    deploy = deploy or deployment()
    return deploy.executor_python or (sys.executable if is_local(master) else None)


def _folder() -> Path:
    """Where the package's zips are built: ``REDELIVERY_HOME/spark-py-files``, else (a read-only
    home) a folder of this user in the temporary directory."""
    for folder in (
        get_settings().home.expanduser().resolve() / "spark-py-files",
        Path(tempfile.gettempdir()) / f"redelivery-{os.getuid()}-spark-py-files",
    ):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise OSError("no writable folder for the package's zip (REDELIVERY_HOME, the temporary directory)")


@functools.cache
def package_zip() -> Path:
    """A zip of this process's ``redelivery`` package (its files as installed, no bytecode), named
    ``redelivery-<version>-<content hash>.zip``: built once per content (the same bytes each time:
    fixed order and timestamps), reused by every job after."""
    import redelivery

    root = Path(redelivery.__file__).parent
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    contents = [(p.relative_to(root.parent).as_posix(), p.read_bytes()) for p in files]
    digest = hashlib.sha256()
    for name, data in contents:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    target = _folder() / f"redelivery-{__version__}-{digest.hexdigest()[:12]}.zip"
    if not target.exists():
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in contents:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr, info.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
                archive.writestr(info, data)
        os.replace(partial, target)
    return target


def package_folder(deploy: Deployment) -> str | None:
    """The folder the package's archive is unpacked into on the executors (its name without
    ``.zip``; each task puts it first on its path), or None when the package is not shipped."""
    return package_zip().stem if deploy.ship_package else None


def archives(deploy: Deployment) -> list[str]:
    """The archives of a job: the package's (``<zip>#<folder>``, unless ``ship_package`` is off),
    then the deployment's own."""
    folder = package_folder(deploy)
    return ([f"{package_zip()}#{folder}"] if folder else []) + list(deploy.archives)


def submit_files(deploy: Deployment) -> tuple[str | None, str | None]:
    """``(py_files, archives)`` of a spark-submit, comma-separated (``--py-files``, ``--archives``):
    the deployment's own (the driver ships the package itself: ``ship``)."""
    return ",".join(deploy.py_files) or None, ",".join(deploy.archives) or None


def connect_conf(deploy: Deployment) -> dict[str, str]:
    """The deployment's conf a Spark Connect session can take: its ``spark.sql.*`` keys (runtime
    settings; the others are the server's, fixed when it started)."""
    return {k: v for k, v in deploy.conf.items() if k.startswith("spark.sql.")}


#: (application or session, file name) of what ``ship`` added, so that it adds each once.
_shipped: set[tuple[str, str]] = set()


def unpacked_as(name: str) -> str:
    """The folder Spark unpacks archive ``name`` into: its ``#`` fragment, else its file name."""
    path, _, alias = name.partition("#")
    return alias or os.path.basename(path.rstrip("/"))


def server_archives(spark) -> set[str]:
    """The folders (``unpacked_as``) of the archives a Spark Connect server unpacks for every
    session: its own ``spark.archives``, set when it started."""
    held = spark.conf.get("spark.archives", None) or ""
    return {unpacked_as(name.strip()) for name in held.split(",") if name.strip()}


def ship(spark, deploy: Deployment | None = None) -> None:
    """Give a session's executors the package's archive and the deployment's py-files; on Spark
    Connect also the deployment's archives that its server does not hold already (``server_archives``:
    a server started with them unpacks them once for all its sessions; an archive added to a
    session is uploaded with every session), where a classic session takes them when it starts
    (``spark.archives``, ``--archives``). What the session has already is not added again."""
    deploy = deploy or deployment()
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        held = server_archives(spark) if deploy.archives else set()
        given = [(name, {"archive": True}) for name in archives(deploy) if unpacked_as(name) not in held]
        given += [(name, {"pyfile": True}) for name in deploy.py_files]
        for name, kind in given:
            if (spark.session_id, name) not in _shipped:
                spark.addArtifacts(name, **kind)
                _shipped.add((spark.session_id, name))
        return
    context, conf = spark.sparkContext, spark.sparkContext.getConf()
    known = {os.path.basename(n.split("#")[0]) for key in ("spark.archives", "spark.submit.pyFiles")
             for n in conf.get(key, "").split(",")} | set(context._python_includes)  # fmt: skip
    package = archives(deploy)[:1] if deploy.ship_package else []
    for name in [*package, *deploy.py_files]:
        key = (context.applicationId, name)
        if key in _shipped or os.path.basename(name.split("#")[0]) in known:
            continue  # e.g. spark-submit's --archives, --py-files
        if name in package:
            context.addArchive(name)
        else:
            context.addPyFile(name)
        _shipped.add(key)


#: The libraries of the base install (pyproject's ``dependencies``) that redelivery's tasks import on
#: an executor, by distribution, with the module each installs (tests/spark/test_deploy.py holds
#: it to pyproject).
EXECUTOR_LIBRARIES = {
    "psycopg": "psycopg", "pyarrow": "pyarrow", "pgpq": "pgpq", "orjson": "orjson",
    "pydantic": "pydantic", "pydantic-settings": "pydantic_settings", "pyyaml": "yaml",
    "tenacity": "tenacity",
}  # fmt: skip


def driver_pins() -> dict[str, str | None]:
    """``{distribution: version}`` of ``EXECUTOR_LIBRARIES`` as installed here, the driver (None
    for one not installed): what an executor should have (docs/spark-clusters.md: the executors'
    environment is installed with the driver's versions as constraints)."""
    from importlib.metadata import PackageNotFoundError, version

    pins: dict[str, str | None] = {}
    for name in EXECUTOR_LIBRARIES:
        try:
            pins[name] = version(name)
        except PackageNotFoundError:
            pins[name] = None
    return pins


def environment_check(deploy: Deployment | None = None) -> Callable[[], str | None]:
    """A function to run on an executor, first thing (pickled by value: it needs nothing of
    redelivery there): it puts the shipped package first on ``sys.path`` (``package_folder``, when
    its executor has it) and returns None, or the one line that says what the executor lacks:
    libraries of ``EXECUTOR_LIBRARIES`` it cannot import (``pyarrow, psycopg missing on Spark
    executor HOST (PYTHON): install the driver's pyarrow==.., psycopg==.. there ...``), else a
    redelivery other than the driver's (``redelivery 0.0.9 on Spark executor HOST (PYTHON),
    redelivery 0.1.0 on the driver: ...``)."""
    folder, driver = package_folder(deploy or deployment()), __version__
    pins, modules = driver_pins(), dict(EXECUTOR_LIBRARIES)

    def problem() -> str | None:  # self-contained: pickled by value, needs no redelivery
        import importlib
        import os
        import socket
        import sys

        if folder:
            from pyspark import SparkFiles

            for base in (SparkFiles.getRootDirectory(), os.getcwd()):
                shipped = os.path.join(base, folder)
                if os.path.isdir(shipped):
                    if shipped not in sys.path:
                        sys.path.insert(0, shipped)
                    break
        where = f"on Spark executor {socket.gethostname()} ({sys.executable})"
        missing = []
        for name, module in modules.items():
            try:
                importlib.import_module(module)
            except ImportError:
                missing.append(name)
        if missing:
            wanted = ", ".join(f"{name}=={pins[name]}" if pins.get(name) else name for name in missing)
            return (
                f"{', '.join(missing)} missing {where}: install the driver's {wanted} there "
                "(docs/spark-clusters.md: the executors' environment)"
            )
        try:
            import redelivery

            found = f"redelivery {getattr(redelivery, '__version__', 'of no version')}"
        except ImportError:
            found = "no redelivery"
        if found != f"redelivery {driver}":
            return (
                f"{found} {where}, redelivery {driver} on the driver: ship the driver's package "
                f"(REDELIVERY_SPARK_SHIP_PACKAGE, on by default) or install redelivery=={driver} there"
            )
        return None

    return problem


def checked(function: Callable[[Iterator], Iterator], deploy: Deployment | None = None):
    """``function`` (a ``mapInArrow`` function of this package) as a Spark task that first runs
    ``environment_check`` and raises its one line, if any. ``function`` travels inside as bytes,
    unpickled only after that: unpickling it imports redelivery's modules, which a wrong or missing
    package or library would fail with a traceback."""
    from pyspark import cloudpickle

    payload, problem = cloudpickle.dumps(function), environment_check(deploy)

    def run(batches: Iterator) -> Iterator:  # self-contained: pickled by value, needs no redelivery
        found = problem()
        if found:
            raise RuntimeError(found)
        from pyspark import cloudpickle

        return cloudpickle.loads(payload)(batches)

    return run


#: The executors' one-line refusals (``environment_check``) inside what Spark raised.
_REFUSAL = re.compile(
    r"((?:no redelivery|redelivery \S+(?: of no version)?|[\w.-]+(?:, [\w.-]+)* missing)"
    r" on Spark executor [^\n]*)"
)
#: An executor that could not start its Python (a path that is not there, a link to an interpreter
#: that is not: venv-pack keeps ``bin/python`` a link to the one it was built from).
_NO_PYTHON = re.compile(r'Cannot run program "([^"]*)"[^\n]*?(error=\d+, [^\n]*)')


@contextmanager
def executor_errors():
    """Turn a Spark job's failure by an executor's refusal (``environment_check``) or by a Python
    it could not start into ``ExecutorEnvironmentError`` with one line (Spark wraps the cause in
    tracebacks of every attempt); other failures pass as they are."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        found, python = _REFUSAL.search(text), _NO_PYTHON.search(text)
        if found is not None:
            raise ExecutorEnvironmentError(found.group(1).strip()) from None
        if python is not None:
            raise ExecutorEnvironmentError(
                f"a Spark executor cannot start its Python {python.group(1)} ({python.group(2).strip()}): "
                "the executors' Python (REDELIVERY_SPARK_EXECUTOR_PYTHON, executor_python) must exist on "
                "every executor, and an interpreter it links to too (docs/spark-clusters.md)"
            ) from None
        raise


#: The Spark applications (their ids: a Connect server's serves every session) whose executors
#: ``check_executors`` found ready, with the package folder it checked.
_ready: set[tuple[str, str | None]] = set()


def check_executors(spark, deploy: Deployment | None = None) -> None:
    """Run ``environment_check`` in one task (a plain Python UDF: no Arrow, which an executor
    without pyarrow cannot even start) and raise ``ExecutorEnvironmentError`` with its line, at
    once: a task that raised would be tried again (``spark.task.maxFailures``, 4 on a cluster)
    before the job failed. Once per Spark application and shipped package; every later task checks
    its own executor too (``checked``)."""
    deploy = deploy or deployment()
    key = (_application(spark), package_folder(deploy))
    if key in _ready:
        return
    problem = environment_check(deploy)
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions as F  # noqa: N812
    else:
        from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StringType

    probe = F.udf(lambda _: problem(), StringType(), useArrow=False)
    with executor_errors():
        found = spark.range(1).select(probe(F.lit(0))).collect()[0][0]
    if found:
        raise ExecutorEnvironmentError(found)
    _ready.add(key)


def _application(spark) -> str:
    """The id of the Spark application behind ``spark`` (classic or Connect)."""
    if not type(spark).__module__.startswith("pyspark.sql.connect"):
        return spark.sparkContext.applicationId
    return spark.conf.get("spark.app.id", None) or f"session {spark.session_id}"


def map_partitions(df, function: Callable[[Iterator], Iterator], schema: str) -> list:
    """``df.mapInArrow(function, schema).collect()`` with the executors checked first
    (``check_executors``, once per application) and every task ``checked``; a refusal raised as
    one line (``ExecutorEnvironmentError``)."""
    check_executors(df.sparkSession)
    with executor_errors():
        return df.mapInArrow(checked(function), schema).collect()


if __name__ == "__main__":  # python -m redelivery.spark.deploy: the package's zip
    print(package_zip())
