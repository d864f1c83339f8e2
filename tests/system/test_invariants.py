"""The crash suite's invariants can fail: a small state built through the API (its clients' calls
in a ledger, chaos/ledger.py), checked clean, then corrupted one way per invariant; exactly that
invariant must report it (chaos/invariants.py)."""

from __future__ import annotations

import sys

import pytest

from helpers import REPO_ROOT, at

sys.path.insert(0, str(REPO_ROOT / "chaos"))

import invariants as inv  # noqa: E402
import ledger as ledger_module  # noqa: E402

TOPIC = "orders"


class State:
    """The state: group billing and audit subscribed to orders, group other not.

    billing, batch b1 of 6 (keys b1:0..5), received at 0 s: m[0] acked; m[1] nacked (level 1,
    due 11 s), promoted by tier run t1 (window end 20 s), received again (delivery 2, in flight);
    m[2] rejected, then redriven (run r1: READY, redrive count 1); m[3] acked without the ledger
    (an answer the ledger did not see); m[4], m[5] in flight. audit: m[0] rejected, the rest
    acked. Batch old (key old:0) published two days before, in a partition of its own, past both
    groups' offsets."""

    def __init__(self, client, database_url, tmp_path):
        from redelivery.client import Message
        from redelivery.redrive import RedriveRequest, redrive
        from redelivery.tiers.run import run_tier_window

        self.client, self.url, self.dir = client, database_url, tmp_path / "ledger"
        self.ledger = ledger_module.Ledger(self.dir, "consumer-1")
        lc = ledger_module.LedgeredClient(client, self.ledger)
        client.create_topic(TOPIC)
        for group in ("billing", "audit", "other"):
            client.create_group(group)
        client.subscribe("billing", TOPIC)
        client.subscribe("audit", TOPIC)
        messages = [Message({"n": i}, key=f"b1:{i}") for i in range(6)]
        self.ids = lc.publish(TOPIC, messages, batch_id="b1", at=at(0))
        got = lc.receive("billing", TOPIC, 6, 30, at=at(0))
        lc.answer("ack", "billing", got[0:1])
        lc.answer("nack", "billing", got[1:2], error="later", at=at(1))
        lc.answer("reject", "billing", got[2:3], error="bad", at=at(1))
        client.ack("billing", got[3:4])  # not in the ledger: a Spark task's answer
        self.ledger.record(
            "tier", {"run_key": "t1"},
            lambda: run_tier_window(tier="seconds", window_end=at(20), run_key="t1", url=database_url),
            lambda s: {"run_key": "t1", "promoted": s["promoted"]},
        )  # fmt: skip
        self.again = lc.receive("billing", TOPIC, 1, 30, at=at(21))
        audit = lc.receive("audit", TOPIC, 6, 30, at=at(0))
        lc.answer("reject", "audit", audit[:1], error="bad", at=at(1))
        lc.answer("ack", "audit", audit[1:])
        self.ledger.record(
            "redrive", {"group": "billing", "run_key": "r1"},
            lambda: redrive(RedriveRequest(group="billing", rate_limit=None, dry_run=False), run_key="r1",
                            url=database_url, log=lambda *_: None),
            lambda r: {"run_key": r["run_key"], "status": r["status"], "moved": r["moved"]},
        )  # fmt: skip
        self.old = lc.publish(TOPIC, [Message({"old": 1}, key="old:0")], batch_id="old", at=at(-2 * 86400))
        self.previous = inv.counts(client.conn)

    def sql(self, statement: str, params=()) -> None:
        self.client.conn.execute(statement, params)

    def group_id(self, name: str) -> int:
        return self.client.conn.execute("SELECT id FROM consumer_groups WHERE name = %s", (name,)).fetchone()[
            0
        ]

    def plant_call(
        self, op: str, asked: dict, answer: dict, began: float, ended: float, worker="planted"
    ) -> None:
        """A call in another worker's ledger, as if that worker had made it."""
        planted = ledger_module.Ledger(self.dir, worker)
        planted.write(id=f"planted-{op}-{began}", op=op, phase="call", **asked, t=began)
        planted.write(id=f"planted-{op}-{began}", op=op, phase="ok", **answer, t=ended)
        planted.close()

    def reported(self, workers=()) -> set[str]:
        found = inv.check(self.client.conn, self.previous, ledger_module.read(self.dir), list(workers))
        return {name for name, rows in found.items() if rows}

    def handed(self, message_index: int, group="billing") -> list:
        """The ledger's receive calls that handed out message ``message_index`` of b1."""
        mid = self.ids[message_index]
        return [c for c in ledger_module.read(self.dir) if c.op == "receive"
                and c.answer["group"] == group and any(m == mid for m, _ in c.answer["handed"])]  # fmt: skip


@pytest.fixture()
def state(client, database_url, tmp_path):
    built = State(client, database_url, tmp_path)
    assert built.reported() == set(), "the state must be clean before a violation is planted"
    assert len(ledger_module.read(built.dir)) == 12
    return built


def test_every_check_runs_and_the_clean_state_passes(state):
    found = inv.check(state.client.conn, state.previous, ledger_module.read(state.dir), [])
    assert set(found) == set(inv.INVARIANTS) - {inv.FINAL}


def plant_in_two_places(s):
    """m[4], in flight to billing, is also one of billing's dead letters (its history as one; the
    subscription's counter of messages taken one more, so that its COMMITTED total stays)."""
    s.sql(
        "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,"
        " content_type, properties, published_at, reason, delivery_count, reconsume_times, attempts)"
        " SELECT (SELECT id FROM dead_letter_queues WHERE name = %s), d.group_id, d.message_id, d.topic_id,"
        " m.id, m.key, m.body, m.content_type, m.properties, m.published_at, 'REJECTED', 1, 0,"
        ' \'[{"delivery": 1, "outcome": "rejected"}]\''
        " FROM deliveries d JOIN messages m ON m.topic_id = d.topic_id AND m.id = d.message_id"
        " WHERE d.message_id = %s AND d.group_id = %s",
        ("%DLQ%billing", s.ids[4], s.group_id("billing")),
    )
    s.sql(
        "UPDATE subscriptions SET messages_taken = messages_taken + 1 WHERE group_id = %s",
        (s.group_id("billing"),),
    )


def plant_foreign_delivery(s):
    s.sql(
        "INSERT INTO deliveries (topic_id, group_id, message_id, published_at, state, ready_at)"
        " SELECT topic_id, %s, id, published_at, 'READY', now() FROM messages WHERE id = %s",
        (s.group_id("other"), s.ids[0]),
    )


def plant_second_dlq_row(s):
    """A second DLQ row of audit's dead letter, in billing's DLQ table (audit's counter of messages
    taken one more, so that its COMMITTED total stays)."""
    s.sql(
        "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,"
        " content_type, properties, published_at, reason, delivery_count, reconsume_times, dead_lettered_at,"
        " attempts, redrive_count)"
        " SELECT (SELECT id FROM dead_letter_queues WHERE name = %s), group_id, message_id,"
        " topic_id, origin_message_id, key, body, content_type, properties, published_at, reason,"
        " delivery_count, reconsume_times, dead_lettered_at, attempts, redrive_count"
        " FROM dlq_messages WHERE group_id = %s",
        ("%DLQ%billing", s.group_id("audit")),
    )
    s.sql(
        "UPDATE subscriptions SET messages_taken = messages_taken + 1 WHERE group_id = %s",
        (s.group_id("audit"),),
    )


def plant_wrong_batch_count(s):
    s.sql("UPDATE publish_batches SET message_count = message_count + 1 WHERE batch_id = 'b1'")


def plant_batch_applied_twice(s):
    """Batch b1's messages written into the log a second time, by a publish whose record never
    took them (the answer to the first was lost and the retry wrote again): messages in no batch."""
    s.sql(
        "INSERT INTO messages (topic_id, key, body, content_type, properties, published_at)"
        " SELECT topic_id, key, body, content_type, properties, published_at FROM messages"
        " WHERE key LIKE 'b1:%%'"
    )


def plant_early_promotion(s):
    s.sql(
        "UPDATE deliveries SET ready_at = due_at - interval '1 second'"
        " WHERE message_id = %s AND group_id = %s",
        (s.ids[1], s.group_id("billing")),
    )


def plant_move_without_audit(s):
    s.sql("DELETE FROM redrive_moves")


def plant_attempt_listed_twice(s):
    s.sql(
        "UPDATE deliveries SET attempts = attempts || attempts WHERE message_id = %s AND group_id = %s",
        (s.ids[1], s.group_id("billing")),
    )


def plant_decreased_delivery_count(s):
    s.sql(
        "UPDATE deliveries SET delivery_count = delivery_count - 1 WHERE message_id = %s AND group_id = %s",
        (s.ids[4], s.group_id("billing")),
    )


def plant_lost_key(s):
    s.sql("UPDATE messages SET key = 'another' WHERE id = %s", (s.ids[5],))


def plant_ack_not_committed(s):
    """The ledger says an ack of m[1]'s first delivery was applied; it was nacked."""
    first = min(s.handed(1), key=lambda c: c.began)
    s.plant_call("answer", {"verb": "ack", "group": "billing", "receipts": [[s.ids[1], 1]]}, {"applied": 1},
                 first.ended + 0.001, first.ended + 0.002)  # fmt: skip


def plant_two_consumers_one_delivery(s):
    """Another consumer handed m[4]'s delivery 1 while the first receive was running."""
    [first] = s.handed(4)
    s.plant_call("receive", {"group": "billing"}, {"group": "billing", "handed": [[s.ids[4], 1]]},
                 first.began, first.ended)  # fmt: skip


def plant_decreasing_count(s):
    """A receive after m[1]'s second delivery hands out a lower count (one never handed before)."""
    last = max(s.handed(1), key=lambda c: c.ended)
    s.plant_call("receive", {"group": "billing"}, {"group": "billing", "handed": [[s.ids[1], 0]]},
                 last.ended + 1, last.ended + 2)  # fmt: skip


def plant_stale_answer_that_changed(s):
    """An ack the API called stale, yet its delivery is COMMITTED under it (m[3], acked unledgered)."""
    last = max(c.ended for c in ledger_module.read(s.dir))
    s.plant_call("answer", {"verb": "ack", "group": "billing", "receipts": [[s.ids[3], 1]]}, {"applied": 0},
                 last + 1, last + 2)  # fmt: skip


def plant_misreported_tier_run(s):
    s.sql("UPDATE tier_runs SET summary = jsonb_set(summary, '{promoted}', '99') WHERE run_key = 't1'")


def plant_committed_unseen(s):
    """A message published outside the ledger, then billing's offset moved past it: COMMITTED for
    billing, which never received it."""
    [mid] = s.client.publish(TOPIC, [{"unseen": 1}], batch_id="unseen")
    s.sql("UPDATE subscriptions SET consume_offset = %s WHERE group_id = %s", (mid, s.group_id("billing")))


def plant_dropped_unfinished(s):
    """The old batch's partition dropped (and forgotten) while neither group had received it."""
    from psycopg import sql

    [(name,)] = s.client.conn.execute(
        "SELECT partition_name FROM log_partitions WHERE starts_at <= %s AND ends_at > %s",
        (at(-2 * 86400),) * 2,
    ).fetchall()
    s.sql(sql.SQL("DROP TABLE {}").format(sql.Identifier("redelivery_log", name)))
    s.sql("DELETE FROM log_partitions WHERE partition_name = %s", (name,))


PLANTED = [
    (plant_in_two_places, inv.ONE_PLACE),
    (plant_foreign_delivery, inv.FOREIGN_DELIVERY),
    (plant_second_dlq_row, inv.DLQ_ROWS),
    (plant_wrong_batch_count, inv.BATCH_COUNT),
    (plant_batch_applied_twice, inv.BATCH_COUNT),
    (plant_early_promotion, inv.EARLY_PROMOTION),
    (plant_move_without_audit, inv.REDRIVE_AUDIT),
    (plant_attempt_listed_twice, inv.HISTORY),
    (plant_decreased_delivery_count, inv.DECREASED),
    (plant_lost_key, inv.PUBLISHED),
    (plant_two_consumers_one_delivery, inv.HANDED_ONCE),
    (plant_ack_not_committed, inv.APPLIED),
    (plant_decreasing_count, inv.INCREASING),
    (plant_stale_answer_that_changed, inv.STALE),
    (plant_misreported_tier_run, inv.REPORTED),
    (plant_committed_unseen, inv.COMMITTED_HANDED),
    (plant_dropped_unfinished, inv.RETAINED),
]


@pytest.mark.parametrize(
    "plant, invariant", PLANTED, ids=[p.__name__.removeprefix("plant_") for p, _ in PLANTED]
)
def test_each_invariant_reports_its_own_violation_and_only_it(state, plant, invariant):
    plant(state)
    assert state.reported() == {invariant}


def test_a_worker_that_died_of_an_error_is_reported_and_a_killed_one_is_not(state):
    died = ("consume-1", 1, False, "Traceback (most recent call last): ...")
    killed = ("consume-2", -9, True, None)
    assert state.reported([killed]) == set()
    assert state.reported([died, killed]) == {inv.WORKERS}
    assert state.reported([("consume-3", 0, False, "Traceback ...")]) == {inv.WORKERS}  # printed one


def test_every_invariant_has_its_planted_violation():
    covered = {name for _, name in PLANTED} | {inv.WORKERS, inv.FINAL}
    assert covered == set(inv.INVARIANTS)


def test_an_unfinished_message_after_draining_is_reported(client, database_url, tmp_path):
    """The final check: no delivery row and no message past an offset, until one more message waits."""
    client.create_topic(TOPIC)
    client.create_group("billing")
    client.subscribe("billing", TOPIC)
    client.publish(TOPIC, [{"n": 1}])
    client.ack("billing", client.receive("billing", TOPIC, 1, 30))
    assert inv.final(client.conn) == []
    [mid] = client.publish(TOPIC, [{"n": 2}])
    assert [row[0] for row in inv.final(client.conn)] == [mid]


def test_a_ledger_line_cut_by_a_kill_leaves_its_call_unknown(tmp_path):
    """A call with no line after it is unknown, never done; a torn last line is left out."""
    ledger = ledger_module.Ledger(tmp_path, "w")
    ledger.write(id="a", op="answer", phase="call", verb="ack", group="g", receipts=[[1, 1]])
    with open(tmp_path / "w.jsonl", "a") as fh:
        fh.write('{"t": 1, "w": "w", "id": "b", "op": "ans')  # killed inside a write
    [call] = ledger_module.read(tmp_path)
    assert (call.id, call.phase, call.ended) == ("a", None, None)
