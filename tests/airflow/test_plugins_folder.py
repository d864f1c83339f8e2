"""The checkout's ``plugins/`` as Airflow 3 loads a plugins folder (first, before the entry points;
a second plugin of a name is skipped with an import error): in every set-up the redelivery plugin
is registered exactly once, with no import error. Each case runs ``_get_plugins()`` in a fresh
interpreter with an AIRFLOW_HOME of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

pytestmark = pytest.mark.airflow

PLUGINS = REPO_ROOT / "plugins"

#: Airflow's plugins, then one JSON line: each plugin's name and source, the import errors, and
#: whether the folder's file was imported. ``{patch}`` runs first.
SCRIPT = """
import json, sys
from unittest import mock
from airflow import plugins_manager
{patch}
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({{"plugins": [[p.name, str(p.source)] for p in plugins], "errors": errors,
                  "folder_file_read": "redelivery_plugin" in sys.modules}}))
"""

#: A deployment with the package on its path but no entry point: none registered, none loaded.
WITHOUT_ENTRY_POINT = """
mock.patch("redelivery.airflow.plugin.registered_by_entry_point", return_value=False).start()
mock.patch("airflow.plugins_manager._load_entrypoint_plugins", return_value=([], {})).start()
"""


def load_plugins(tmp_path, patch: str = "") -> dict:
    """``_get_plugins()`` of an Airflow whose plugins folder is the checkout's ``plugins/``."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(patch=patch)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_with_the_package_installed_the_entry_point_registers_the_plugin_and_the_folder_is_silent(tmp_path):
    from redelivery.airflow.plugin import registered_by_entry_point

    assert registered_by_entry_point()  # this environment: pyproject.toml's entry point, installed
    loaded = load_plugins(tmp_path)
    assert loaded["folder_file_read"] and loaded["errors"] == {}
    ours = [source for name, source in loaded["plugins"] if name == "redelivery"]
    assert len(ours) == 1 and "redelivery.airflow.plugin:RedeliveryPlugin" in ours[0], loaded


def test_without_an_entry_point_the_folder_registers_the_plugin_once(tmp_path):
    loaded = load_plugins(tmp_path, WITHOUT_ENTRY_POINT)
    assert loaded["errors"] == {}
    ours = [source for name, source in loaded["plugins"] if name == "redelivery"]
    assert ours == ["$PLUGINS_FOLDER/redelivery_plugin.py"], loaded


def test_airflow_env_points_airflow_at_the_checkouts_plugins_folder(monkeypatch):
    from redelivery.airflow.env import airflow_environ

    monkeypatch.delenv("AIRFLOW__CORE__PLUGINS_FOLDER", raising=False)
    assert airflow_environ(REPO_ROOT / "dags")["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(PLUGINS)
