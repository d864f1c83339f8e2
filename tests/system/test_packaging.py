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
    assert "AIRFLOW__CORE__PLUGINS_FOLDER" not in env  # the plugin comes with the installed package
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
