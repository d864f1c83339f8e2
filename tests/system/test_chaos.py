"""A short run of the crash suite (chaos/run.py; `make chaos` runs 1000 kill points): every kind
of kill point at least once, 30 in all, every invariant checked (tests/test_invariants.py shows
each one catches its own violation), and not one broken."""

import json
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "chaos"))
from invariants import INVARIANTS  # noqa: E402
from run import KINDS  # noqa: E402

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
    assert set(summary["by_kind"]) == set(KINDS)  # every kind of kill point happened
    assert summary["violations"] == dict.fromkeys(INVARIANTS, 0)  # every invariant checked, none broken
    assert summary["ledger_calls_compared"] > 100  # the clients' history was read
    # issue 36: an on_exhausted halt group too, whose keys its dead letters held, released by redrives
    assert summary["ordered_groups"] == {"halting": "halt", "ordered": "continue"}
    assert summary["halted_most"] > 0 and summary["halted_redriven"] > 0
