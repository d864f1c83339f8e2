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
    m[2] rejected, then redriven (run r1: READY, redrive count 1); m[3] acked as a Spark task acks
    (the ledger has the answer's call line only: its outcome unknown); m[4], m[5] in flight. audit:
    m[0] rejected, the rest acked. Batch old (key old:0) published two days before, in a partition
    of its own, past both groups' offsets. Group sequence, subscribed ordered to topic steps: batch
    o1 of 3 messages of key "o", received (o[0]), acked, received again (o[1] in flight, o[2]
    BLOCKED)."""

    def __init__(self, client, database_url, tmp_path):
        from redelivery.client import Message
        from redelivery.redrive import RedriveRequest, redrive
        from redelivery.tiers.run import TierRunRequest, run_tier

        self.client, self.url, self.dir = client, database_url, tmp_path / "ledger"
        self.ledger = ledger_module.Ledger(self.dir, "consumer-1")
        self.lc = lc = ledger_module.LedgeredClient(client, self.ledger)
        client.create_topic(TOPIC)
        for group in ("billing", "audit", "other", "sequence"):
            client.create_group(group)
        client.subscribe("billing", TOPIC)
        client.subscribe("audit", TOPIC)
        messages = [Message({"n": i}, key=f"b1:{i}") for i in range(6)]
        self.ids = lc.publish(TOPIC, messages, batch_id="b1", at=at(0))
        self.got = got = lc.receive("billing", TOPIC, 6, 30, at=at(0))
        lc.answer("ack", "billing", got[0:1])
        lc.answer("nack", "billing", got[1:2], error="later", at=at(1))
        lc.answer("reject", "billing", got[2:3], error="bad", at=at(1))
        self.spark_answer("ack", "billing", got[3:4])
        self.ledger.record(
            "tier", {"run_key": "t1"},
            lambda: run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="t1"), url=database_url),  # noqa: E501
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
        client.create_topic("steps")
        client.subscribe("sequence", "steps", ordered=True)
        steps = [Message({"o": i}, key="o") for i in range(3)]
        self.ordered = lc.publish("steps", steps, batch_id="o1", at=at(30))
        lc.answer("ack", "sequence", lc.receive("sequence", "steps", 10, 30, at=at(30)))
        self.sequence = lc.receive("sequence", "steps", 10, 30, at=at(31))
        self.previous = inv.counts(client.conn)

    def spark_answer(self, verb: str, group: str, messages: list) -> None:
        """An answer as a Spark task of the crash suite makes it: its call line in the ledger (the
        job settles it later: outcome unknown), then the answer itself, outside the ledger."""
        self.ledger.write(id=f"spark-{verb}-{messages[0].message_id}-{messages[0].delivery_count}",
                          op="answer", phase="call", verb=verb, group=group,
                          receipts=ledger_module.receipts(messages))  # fmt: skip
        getattr(self.client, verb)(group, messages)

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
    inv.install(client.conn)  # the record of dropped partitions, as the crash suite sets it up
    built = State(client, database_url, tmp_path)
    assert built.reported() == set(), "the state must be clean before a violation is planted"
    assert [m.message_id for m in built.sequence] == [built.ordered[1]]
    assert len(ledger_module.read(built.dir)) == 17
    yield built
    inv.uninstall(client.conn)


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
    """A nack the API called stale (and counted so), yet its outcome is in the delivery's history:
    m[4]'s delivery 1 WAITING_RETRY under it. (A stale ack whose message is COMMITTED with no other
    ack that could have done it is COMMITTED_ACKED's too: its last delivery is not acked.)"""
    last = max(c.ended or c.began for c in ledger_module.read(s.dir))
    s.plant_call("answer", {"verb": "nack", "group": "billing", "receipts": [[s.ids[4], 1]]}, {"applied": 0},
                 last + 1, last + 2)  # fmt: skip
    s.sql(
        "UPDATE deliveries SET state = 'WAITING_RETRY', reconsume_times = 1, delay_level = 1,"
        " due_at = %s, invisible_until = NULL, attempts = %s WHERE message_id = %s AND group_id = %s",
        (at(40), '[{"delivery": 1, "outcome": "nack", "error": "later"}]', s.ids[4], s.group_id("billing")),
    )
    s.sql("UPDATE consumer_groups SET stale_receipts = stale_receipts + 1 WHERE name = 'billing'")


def plant_misreported_tier_run(s):
    s.sql("UPDATE tier_runs SET summary = jsonb_set(summary, '{promoted}', '99') WHERE run_key = 't1'")


def plant_committed_unseen(s):
    """A message published outside the ledger, then billing's offset moved past it: COMMITTED for
    billing, which never received it."""
    [mid] = s.client.publish(TOPIC, [{"unseen": 1}], batch_id="unseen")
    s.sql("UPDATE subscriptions SET consume_offset = %s WHERE group_id = %s", (mid, s.group_id("billing")))


def plant_nacked_then_committed(s):
    """m[4] nacked (applied: WAITING_RETRY), then its delivery row lost, as if the nack or a promotion
    never kept it: COMMITTED for billing, never processed successfully."""
    s.lc.answer("nack", "billing", s.got[4:5], error="later", at=at(2))
    s.sql(
        "DELETE FROM deliveries WHERE message_id = %s AND group_id = %s AND state = 'WAITING_RETRY'",
        (s.ids[4], s.group_id("billing")),
    )


def plant_expired_then_committed(s):
    """m[5], handed and never answered (its lease runs out: a tier run makes it WAITING_RETRY), its
    delivery row lost: COMMITTED for billing with no ack of its delivery."""
    s.sql("DELETE FROM deliveries WHERE message_id = %s AND group_id = %s", (s.ids[5], s.group_id("billing")))


def plant_dropped_unfinished(s):
    """The old batch's partition dropped (and forgotten) while neither group had received it."""
    from psycopg import sql

    [(name,)] = s.client.conn.execute(
        "SELECT partition_name FROM log_partitions WHERE starts_at <= %s AND ends_at > %s",
        (at(-2 * 86400),) * 2,
    ).fetchall()
    s.sql(sql.SQL("DROP TABLE {}").format(sql.Identifier("redelivery_log", name)))
    s.sql("DELETE FROM log_partitions WHERE partition_name = %s", (name,))


def plant_blocked_key_without_its_head(s):
    """o[2], BLOCKED behind o[1], under another key: a key with no head (stuck), and a row whose
    key is not its message's."""
    s.sql("UPDATE deliveries SET key = 'p' WHERE message_id = %s", (s.ordered[2],))


def plant_handed_ahead_of_its_key(s):
    """Another consumer of the ordered group was handed o[2] before o[1] was handed (o[1] not
    ended): two messages of key "o" in flight, the later first."""
    [first] = [c for c in ledger_module.read(s.dir) if c.op == "receive" and c.answer["group"] == "sequence"
               and any(m == s.ordered[1] for m, _ in c.answer["handed"])]  # fmt: skip
    s.plant_call("receive", {"group": "sequence"}, {"group": "sequence", "handed": [[s.ordered[2], 1]]},
                 first.began - 0.002, first.began - 0.001)  # fmt: skip


def plant_attempt_spent_while_open(s):
    """billing's breaker held open from a second before m[1]'s nack was recorded: that nack spent
    an attempt while it was open (a parked one, outcome "parked", would not have)."""
    s.sql(
        """INSERT INTO breaker_transitions (topic_id, group_id, at, from_state, to_state, changed_by)
           SELECT d.topic_id, d.group_id, (d.attempts -> 0 ->> 'recorded')::timestamptz - interval '1 second',
                  'closed', 'held', 'planted'
           FROM deliveries d WHERE d.message_id = %s AND d.group_id = %s""",
        (s.ids[1], s.group_id("billing")),
    )


def plant_brought_back_past_its_generations(s):
    """m[2]'s redrive made a run of a standing redrive allowing one generation, and its move the
    second generation."""
    s.sql(
        """INSERT INTO standing_redrives (name, group_id, source, spec, changed_by)
           VALUES ('planted', %s, 'operator', '{"max_generations": 1}', 'planted')""",
        (s.group_id("billing"),),
    )
    s.sql(
        "UPDATE redrive_runs SET max_generations = 1,"
        " standing_id = (SELECT id FROM standing_redrives WHERE name = 'planted')"
    )
    s.sql("UPDATE redrive_moves SET generation = 2 WHERE message_id = %s", (s.ids[2],))


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
    (plant_nacked_then_committed, inv.COMMITTED_ACKED),
    (plant_expired_then_committed, inv.COMMITTED_ACKED),
    (plant_dropped_unfinished, inv.RETAINED),
    (plant_blocked_key_without_its_head, inv.ORDERED_HEADS),
    (plant_handed_ahead_of_its_key, inv.ORDERED),
    (plant_attempt_spent_while_open, inv.BREAKER),
    (plant_brought_back_past_its_generations, inv.GENERATIONS),
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


def test_a_failed_message_acked_at_a_later_delivery_ends_committed_cleanly(state, database_url):
    """Failed deliveries a later delivery acked: m[2] (rejected, redriven) received again and acked,
    the ack's commit answer lost (its outcome unknown) and the ack made again (stale); m[4] nacked,
    promoted by tier run t2 (which also runs out m[5]'s lease), received again and acked as a Spark
    task acks (outcome unknown). Both COMMITTED: nothing reported."""
    import psycopg

    from redelivery.tiers.run import TierRunRequest, run_tier

    s = state
    s.lc.answer("nack", "billing", s.got[4:5], error="later", at=at(25))
    s.ledger.record(
        "tier", {"run_key": "t2"},
        lambda: run_tier(TierRunRequest(tier="seconds", window_end=at(40), run_key="t2"), url=database_url),
        lambda summary: {"run_key": "t2", "promoted": summary["promoted"]},
    )  # fmt: skip
    again = {m.message_id: m for m in s.lc.receive("billing", TOPIC, 6, 30, at=at(41))}
    assert (again[s.ids[2]].delivery_count, again[s.ids[4]].delivery_count) == (2, 2)
    redriven = [again[s.ids[2]]]

    def commit_answer_lost():
        s.client.ack("billing", redriven)
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    asked = {"verb": "ack", "group": "billing", "receipts": ledger_module.receipts(redriven)}
    with pytest.raises(psycopg.OperationalError):
        s.ledger.record("answer", asked, commit_answer_lost, lambda n: {"applied": n})
    assert s.lc.answer("ack", "billing", redriven) == 0  # answered again: stale
    s.spark_answer("ack", "billing", [again[s.ids[4]]])
    states = inv.delivery_states(s.client.conn)
    assert {states[(s.ids[i], "billing")][0] for i in (2, 4)} == {"COMMITTED"}
    assert s.reported() == set()


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
