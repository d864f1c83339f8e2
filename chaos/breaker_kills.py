"""The crash suite's outage handling (issue 41): an operator's hands on the circuit breaker, the
kill points where a statement waits for its lock (``breaker_row_held``), and a standing redrive's
batch killed (``standing_inside_batch``)."""

from __future__ import annotations

import time
import uuid

#: The group whose subscription has a circuit breaker (chaos/config.yaml).
BREAKER_GROUP = "g2"
#: The group whose standing redrive brings its dead letters back every second (chaos/config.yaml).
STANDING_GROUP = "g1"


class BreakerKillPoints:
    """The breaker's scenarios, a part of ``scenarios.KillPoints``."""

    def operate_breaker(self, close_all: bool = False) -> None:
        """An operator's hands: a held breaker closed; now and then one opened by hand (held) or
        for a second. ``close_all``: every breaker closed (the drain's)."""
        for breaker in self.client.client.breakers():
            if breaker["state"] != "closed" and (close_all or breaker["state"] == "held"):
                self.client.client.close_breaker(breaker["topic"], breaker["group"], by="chaos")
        from scenarios import TOPIC  # (scenarios imports this module)

        if not close_all and self.rng.random() < 0.15:
            seconds = self.rng.choice([None, 1.0])
            self.client.client.open_breaker(TOPIC, BREAKER_GROUP, seconds=seconds, by="chaos")

    def consumer_group(self) -> str:
        """A group for a consumer scenario; the breaker group's breaker closed first, as an operator
        would (while open, its consumer would receive nothing and the scenario would kill nobody)."""
        from scenarios import CONSUMERS  # (scenarios imports this module)

        group = self.rng.choice(CONSUMERS)
        if group == BREAKER_GROUP:
            self.operate_breaker(close_all=True)
        return group

    def breaker_row_held(self, kind: str) -> None:
        """The breaker group's breaker lock (``statements.breakers``, advisory) held here: exclusive,
        as a transition holds it, for ``answer`` (a consumer's failing answer waits for it:
        ``BREAKERS_SHARE``, first in its transaction) and ``tier`` (a tier window's range does, or
        its transitions); shared, as an answer holds it, for ``transition`` (a consumer's
        transition after its answer committed waits: ``LOCK_BREAKER``). Killed there."""
        self.operate_breaker(close_all=True)  # a closed breaker: its group's consumers get messages
        self.top_up()
        self.make_due_retries(BREAKER_GROUP)
        lock = "pg_advisory_xact_lock_shared" if kind == "transition" else "pg_advisory_xact_lock"
        with self.holding(
            f"""SELECT {lock}((s.topic_id::bigint << 32) | s.group_id::bigint)
                FROM subscriptions s JOIN consumer_groups g ON g.id = s.group_id
                JOIN topics t ON t.id = s.topic_id WHERE g.name = %s AND t.name = %s""",
            (BREAKER_GROUP, "chaos"),
        ):
            if kind == "tier":
                worker = self.spawn("tier", "--run-key", f"chaos-{uuid.uuid4().hex[:8]}")
                self.freeze_and_kill(worker, "breaker: a tier window waiting for its rows", "%BREAKER%")
                return
            worker = self.spawn("consume", "--group", BREAKER_GROUP, "--max", "10", "--lease", "2", "--loop")
            if kind == "answer":
                kind = "breaker: a failing answer waiting for its row"
                self.freeze_and_kill(worker, kind, "%BREAKERS_SHARE%")
            else:
                self.freeze_and_kill(worker, "breaker: inside a transition", "%LOCK_BREAKER%")

    def standing_inside_batch(self) -> None:
        """A standing redrive's batch, killed while its last step waits for the group's row (it adds
        to the group's redriven total: the dead letters are out of the DLQ, uncommitted). Fresh
        dead letters first, and their first generation's wait (1 s) passed."""
        from scenarios import TOPIC  # (scenarios imports this module)

        self.top_up()
        self.client.answer(
            "reject", STANDING_GROUP, self.client.receive(STANDING_GROUP, TOPIC, 5, 30), error="chaos"
        )
        time.sleep(1.1)
        with self.holding(
            "SELECT 1 FROM consumer_groups WHERE name = %s FOR NO KEY UPDATE", (STANDING_GROUP,)
        ):
            worker = self.spawn("standing")
            self.freeze_and_kill(worker, "standing redrive: inside a batch", "%REDRIVE_MOVE_BATCH%")

    def standing_now(self) -> None:
        """A tick of the standing redrives in this process (never killed)."""
        from redelivery.standing import tick

        tick(self.url(), self.client.client.config, sync_config=True, log=lambda *_: None)
