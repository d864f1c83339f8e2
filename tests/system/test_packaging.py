"""The files a user runs outside the tests: compose file, CI script, pinned requirements."""

import json
import re

import yaml

from helpers import REPO_ROOT


def test_compose_file_wires_the_settings_the_code_reads():
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text())
    assert set(compose["services"]) == {"postgres", "spark-connect", "airflow"}
    env = compose["services"]["airflow"]["environment"]
    assert env["REDELIVERY_DATABASE_URL"].startswith("postgresql://")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"].endswith("/dags")
    assert "AIRFLOW_CONN_REDELIVERY_SPARK" in env and "AIRFLOW_CONN_REDELIVERY_DB" in env
    assert compose["services"]["airflow"]["build"] == "."
    assert json.loads(env["AIRFLOW_CONN_REDELIVERY_DB"])["conn_type"] == "redelivery"  # the provider's type
    # the card's plugins/ (silent where the installed package registers the plugin by entry point)
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/redelivery/plugins"
    spark = json.loads(env["AIRFLOW_CONN_REDELIVERY_SPARK"])
    assert spark["conn_type"] == "spark_connect" and spark["host"] == "spark-connect"
    server = compose["services"]["spark-connect"]
    assert server["command"] == ["redelivery", "spark-connect", "start", "--foreground"]
    assert server["environment"]["REDELIVERY_SPARK_CONNECT_TOKEN"] == env["REDELIVERY_SPARK_CONNECT_TOKEN"]
    assert (REPO_ROOT / "Dockerfile").exists()


def test_ci_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    assert re.search(r"^make test$", (REPO_ROOT / ".ci" / "run").read_text(), re.M)


def test_requirements_are_pinned_and_leave_out_pyspark_client():
    lines = [
        ln
        for ln in (REPO_ROOT / "requirements.txt").read_text().splitlines()
        if ln and not ln.startswith((" ", "#"))
    ]
    assert lines and all("==" in ln for ln in lines)
    pins = dict(ln.split("==") for ln in lines)
    assert pins["apache-airflow"].startswith("3.3.") and pins["pyspark"].startswith("4.3.")
    assert pins["apache-airflow-providers-apache-spark"].startswith("6.")
    assert int(pins["pandas"].split(".")[0]) < 3
    assert "pyspark-client" not in pins


def test_the_environment_holds_one_redelivery_distribution():
    """One distribution named redelivery on sys.path: a second (src/redelivery.egg-info that a
    setuptools build leaves in the checkout) makes Airflow register the plugin twice and record
    the second as an import error."""
    from importlib.metadata import distributions

    found = [d for d in distributions() if (d.metadata["Name"] or "").lower() == "redelivery"]
    assert len(found) == 1, [str(getattr(d, "_path", d)) for d in found]


#: The libraries of the base install: what Spark's executors need to run redelivery's tasks.
EXECUTOR_LIBRARIES = {"psycopg", "pyarrow", "pgpq", "orjson", "pydantic", "pydantic-settings", "pyyaml",
                      "tenacity"}  # fmt: skip
#: Every module a Spark task imports (spark.tasks' functions, the tier window's and the redrive's
#: ranges, the publish, lease, settle and consumer tasks), and what those import. Not
#: airflow.http_delivery (requests): the Airflow consumer's, never a Spark task's.
TASK_MODULES = [
    "spark.deploy", "spark.tasks", "tiers.window", "tiers.run", "redrive", "spark.publishing",
    "spark.dataframes", "spark.consuming", "client", "config", "settings", "messaging.admin",
    "messaging.codec", "messaging.consuming", "messaging.copy_rows", "messaging.producer",
    "messaging.publishing", "messaging.receipts", "store.catalog", "store.db", "store.embedded",
    "store.log", "store.maintenance", "store.statements", "dead_letters",
]  # fmt: skip


def test_the_base_install_is_what_executors_need_and_the_rest_are_extras():
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert {Requirement(r).name for r in project["dependencies"]} == EXECUTOR_LIBRARIES
    extras = project["optional-dependencies"]
    assert set(extras) == {"cli", "spark", "airflow", "embedded"}
    assert "redelivery[cli,spark]" in extras["airflow"]
    assert {Requirement(r).name for r in extras["spark"]} >= {"pyspark"}
    assert {Requirement(r).name for r in extras["cli"]} >= {"typer", "alembic", "sqlalchemy"}
    assert not any(Requirement(r).name.startswith(("apache-airflow", "pyspark")) for r in extras["cli"])


def _needed(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install (from the installed metadata, extras included)."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, seen, todo = set(), set(), [Requirement(r) for r in requirements]
    while todo:
        wanted = todo.pop()
        key = (canonicalize_name(wanted.name), frozenset(wanted.extras))
        if key in seen:
            continue
        seen.add(key)
        found.add(key[0])
        for text in requires(wanted.name) or []:
            dependency = Requirement(text)
            extras = wanted.extras or {""}
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dependency)
    return found


def test_a_spark_task_imports_only_the_base_install():
    """Every module on a Spark task's path imports, at module level, nothing but the base install's
    libraries (lazy imports inside functions for the rest): an executor needs nothing else."""
    import subprocess
    import sys
    import tomllib

    script = (
        "import importlib, json, sys\n"
        "from importlib.metadata import packages_distributions\n"
        "before = set(sys.modules)\n"
        f"for name in {TASK_MODULES!r}: importlib.import_module('redelivery.' + name)\n"
        "tops = {m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)\n"
        "owners = packages_distributions()\n"
        "print(json.dumps(sorted({d for t in tops if t[0] != '_' and t != 'cython_runtime'\n"
        "                         for d in owners.get(t, [t])})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    base = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # numpy: pyarrow imports it when it is installed (the cluster test's workers have none)
    allowed = _needed(base) | {"redelivery", "numpy"}
    loaded = {d.lower().replace("_", "-") for d in json.loads(done.stdout)}
    assert loaded - allowed == set(), "imported at module level on a Spark task's path"
