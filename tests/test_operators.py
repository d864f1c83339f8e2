"""What the operators would run, rendered without running anything: the spark-submit arguments and
environment of a tier window. Pure: Airflow is imported, never started."""

import sys
from pathlib import Path

from redelivery.airflow.operators import TIER_APPLICATION, TierWindowOperator
from redelivery.spark.session import submit_environment


def test_tier_operator_arguments_are_templates_of_the_run():
    op = TierWindowOperator(task_id="apply_window", tier="seconds")
    args = dict(zip(op.application_args[::2], op.application_args[1::2], strict=True))
    assert args["--tier"] == "seconds"
    assert args["--window-end"] == "{{ params.window_end or data_interval_end.isoformat() }}"
    assert args["--run-key"] == "{{ dag.dag_id }}/{{ run_id }}/{{ ti.try_number }}"
    assert op._conn_id == "redelivery_spark" and op.application == TIER_APPLICATION
    assert Path(TIER_APPLICATION).exists()


def test_submit_environment_for_a_local_driver():
    env, conf = submit_environment("local[2]", "postgresql://u@h/db")
    assert env["REDELIVERY_DATABASE_URL"] == "postgresql://u@h/db"
    assert env["PATH"].split(":")[0] == str(
        Path(sys.executable).parent
    )  # finds this environment's spark-submit
    assert conf["spark.pyspark.python"] == env["PYSPARK_PYTHON"]
    assert conf["spark.ui.enabled"] == "false" and conf["spark.sql.session.timeZone"] == "UTC"


def test_submit_environment_for_a_cluster_sends_no_local_paths():
    env, conf = submit_environment("yarn", "postgresql://u@h/db")
    assert env == {"REDELIVERY_DATABASE_URL": "postgresql://u@h/db"}
    assert "spark.pyspark.python" not in conf and "spark.driver.extraJavaOptions" not in conf
