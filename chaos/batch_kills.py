"""Kill points inside a tier DAG run that applies several windows in turn (issue 38,
``redelivery.tiers.batch``): killed inside a later window's transaction, its earlier windows
committed, and killed while it sleeps between windows. A part of the controller (chaos/run.py),
through ``KillPoints``, with its plumbing (``spawn``, ``holding``, ``freeze_and_kill``, ``kills``)."""

from __future__ import annotations

import time
import uuid

TOPIC = "chaos"  # scenarios.TOPIC (which imports this module)
INSIDE = "tier batch: inside a later window's transaction"
BETWEEN = "tier batch: asleep between two windows"
#: the nacked rows of group g1 a window is about to promote, locked before they come due
HOLD_RETRIES = """SELECT d.message_id FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
                  WHERE g.name = 'g1' AND d.message_id = ANY(%s) AND d.state = 'WAITING_RETRY'
                  ORDER BY d.message_id FOR UPDATE"""


class BatchKillPoints:
    """The two kill points of a batched tier run."""

    def _batch_started(self) -> tuple | None:
        """A batch worker of four 1 s windows, once its first window's record committed."""
        key = f"chaos-batch-{uuid.uuid4().hex[:8]}"
        worker = self.spawn("tier-batch", "--run-key", key, "--windows", "4")
        done = "SELECT count(*) FROM tier_runs WHERE run_key LIKE %s AND status = 'success'"
        if not self.wait_until(lambda: self.conn.execute(done, (key + "/%",)).fetchone()[0] >= 1, 15):
            worker.kill()
            return None
        return worker, key

    def tier_batch_inside_window(self) -> None:
        self.top_up()
        started = self._batch_started()
        if started is None:
            return
        worker, _ = started
        got = self.client.receive("g1", TOPIC, 3, 30)
        if not got:
            worker.kill()
            return
        self.client.answer("nack", "g1", got, error="chaos")  # due in 1 s: a later window's
        with self.holding(HOLD_RETRIES, ([m.message_id for m in got],)):
            self.freeze_and_kill(worker, INSIDE, "%redelivery:%")

    def tier_batch_between_windows(self) -> None:
        self.make_due_retries()
        started = self._batch_started()
        if started is None:
            return
        worker, _ = started
        time.sleep(self.rng.uniform(0.1, 0.8))  # asleep until its next window's end, most likely
        if worker.proc.poll() is None:
            worker.kill()
            self.kills[BETWEEN] += 1
