"""A short run of the crash suite (chaos/run.py; `make chaos` runs 1000 kill points): every kind
of kill point at least once, 60 in all, and not one invariant broken."""

import json
import subprocess
import sys

import pytest

from redelivery.settings import REPO_ROOT

pytestmark = [pytest.mark.db, pytest.mark.spark]


def test_a_short_crash_run_breaks_no_invariant(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "chaos" / "run.py"),
            "--kill-points",
            "30",
            "--every-kind",
            "--round",
            "15",
            "--seed",
            "7",
            "--home",
            str(tmp_path / "chaos"),
            "--port",
            "54349",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("CHAOS_SUMMARY ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(lines[-1].removeprefix("CHAOS_SUMMARY "))
    assert done.returncode == 0, done.stdout[-3000:]
    assert summary["kill_points"] >= 30
    assert len(summary["by_kind"]) >= 15  # every kind of kill point happened
    assert set(summary["violations"].values()) == {0} and len(summary["violations"]) >= 9
