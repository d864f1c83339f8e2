"""The checkout's ``spark_jobs/``: each script is the thin form over its package entry point
(``redelivery.jobs.<name>.main``), every job the engine hook submits has one, and
``spark_jobs/publish.py`` runs under spark-submit (local[1], the environment and conf the engine
hook gives a submit) against the real PostgreSQL."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT

SCRIPTS = REPO_ROOT / "spark_jobs"

#: What every script is, past its docstring.
THIN = """from redelivery.jobs.{name} import main

if __name__ == "__main__":
    main()
"""


def scripts() -> dict[str, Path]:
    return {path.stem: path for path in sorted(SCRIPTS.glob("*.py"))}


def submitted_by_the_engine_hook() -> set[str]:
    """The jobs ``EngineHook`` submits: the first argument of each ``self._submit(...)`` call."""
    engine = REPO_ROOT / "src" / "redelivery" / "airflow" / "engine.py"
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(engine.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_submit"
        and node.args and isinstance(node.args[0], ast.Constant)
    }  # fmt: skip


def test_every_script_is_the_thin_form_of_its_package_job():
    from redelivery.jobs import application

    assert set(scripts()) >= {"tier_window", "dlq_redrive", "publish"}
    for name, path in scripts().items():
        tree = ast.parse(path.read_text())
        docstring = ast.get_docstring(tree)
        assert docstring and f"spark-submit spark_jobs/{name}.py" in docstring, path
        assert ast.dump(ast.Module(tree.body[1:], [])) == ast.dump(ast.parse(THIN.format(name=name))), path
        assert Path(application(name)).is_file()


def test_every_job_the_engine_hook_submits_has_its_script():
    submitted = submitted_by_the_engine_hook()
    assert submitted == {"tier_window", "dlq_redrive"}
    assert submitted <= set(scripts())


@pytest.mark.spark
def test_spark_submit_of_the_publish_script_publishes_every_row_once_in_order(
    client, topic_group, database_url, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from redelivery.spark.session import submit_environment

    rows = 500
    path = tmp_path / "orders.parquet"
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(rows)],
                             "body": [json.dumps({"n": i}) for i in range(rows)]}), path)  # fmt: skip
    env_vars, conf = submit_environment("local[1]", database_url)
    confs = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    command = [spark_submit, "--master", "local[1]", *confs, str(SCRIPTS / "publish.py"),
               "--topic", "orders", "--path", str(path), "--batch-id", "file-1"]  # fmt: skip
    done = subprocess.run(
        command, env={**os.environ, **env_vars}, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("REDELIVERY_PUBLISHED ")]
    assert len(printed) == 1
    summary = json.loads(printed[0].removeprefix("REDELIVERY_PUBLISHED "))
    assert summary == {"topic": "orders", "batch_id": "file-1", "path": str(path), "format": "parquet",
                       "messages": rows}  # fmt: skip
    got = client.receive("billing", "orders", 2 * rows, 30)
    assert [m.body["n"] for m in got] == list(range(rows))
    assert [m.key for m in got] == [f"k{i}" for i in range(rows)]
