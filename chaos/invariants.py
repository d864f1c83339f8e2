"""The promise, checked after every round of the crash suite: nothing lost, doubled or reset.

Two kinds of check, each returning the rows (or ledger calls) that break it (empty: it holds):

- the state store against itself, in SQL (``CHECKS``, ``history``, ``decreased``);
- the state store against what its clients saw (``chaos/ledger.py``: every call of every worker
  and of the controller, with what the API answered), as Jepsen checks a database against its
  clients' history (``LEDGER_CHECKS``).

``INVARIANTS`` names them all; ``check`` runs every one that its arguments allow, and the crash
suite requires each of them to have run. ``tests/system/test_invariants.py`` plants one violation of each
in a small state and asserts that exactly that invariant reports it.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import psycopg
from dropped import install, uninstall  # noqa: F401 (the suite's set-up, named here for its callers)
from ledger import Call, events
from outage_checks import GENERATIONS_SQL, OPEN_BREAKER_SQL

ONE_PLACE = (
    "a message is, for each group, in one place: a delivery row or a dead letter, never one past its offset"
)
FOREIGN_DELIVERY = "every delivery row belongs to a message in its topic's log and to a subscribed group"
DLQ_ROWS = "a dead letter is in one DLQ, once"
BATCH_COUNT = "each publish batch applied once, with the count it was published with"
EARLY_PROMOTION = "nothing promoted before its due time"
REDRIVE_AUDIT = "redrive audit rows equal the moves"
HISTORY = "each failed delivery appears once in the attempt history (no receipt honoured twice)"
DECREASED = "no delivery count, redrive count, offset or total ever decreased"
PUBLISHED = "every message a producer saw published exists once, with its key"
HANDED_ONCE = "a delivery (message, group, delivery count) was handed to at most one consumer"
APPLIED = "an answer the API applied holds: an ack ends COMMITTED, a nack or reject is in the history"
INCREASING = "delivery counts a consumer saw for a message strictly increase"
STALE = "an answer the API called stale changed nothing, and was counted"
REPORTED = "what tier runs and redrives reported is what the state store holds"
WORKERS = "no worker died of an error or exited unexpectedly"
COMMITTED_HANDED = "a message COMMITTED for a group was handed to that group"
COMMITTED_ACKED = (
    "a message COMMITTED for a group was acked at its last delivery to that group: a failed delivery"
    " (nacked, rejected, its lease run out) ends COMMITTED only by a later delivery, handed and acked"
)
RETAINED = "a message retention dropped had ended for every group (handed, or a dead letter)"
ORDERED_HEADS = (
    "an ordered subscription's key has one head (its unfinished message that is not BLOCKED) while"
    " it has messages BLOCKED, the oldest of them unless redriven, and its rows carry their message's"
    " ordering key ('' none)"
)
ORDERED = (
    "an ordered group was handed a message of a key only once every older message of the key had ended:"
    " committed in publish order, never two in flight"
)
BREAKER = (
    "while a group's breaker is open, no failure it counts spends an attempt or makes a dead letter:"
    " each is parked"
)
GENERATIONS = (
    "a standing redrive never brought a message back more often than its generation limit (max_generations)"
)
FINAL = "after draining, every message ended exactly once per group (COMMITTED or DLQ)"

#: Every invariant, in the order docs/crash-suite.md lists them.
INVARIANTS = (
    ONE_PLACE, FOREIGN_DELIVERY, DLQ_ROWS, BATCH_COUNT, EARLY_PROMOTION, REDRIVE_AUDIT, HISTORY,
    DECREASED, PUBLISHED, HANDED_ONCE, APPLIED, INCREASING, STALE, REPORTED, WORKERS, COMMITTED_HANDED,
    COMMITTED_ACKED, RETAINED, ORDERED_HEADS, ORDERED, BREAKER, GENERATIONS, FINAL,
)  # fmt: skip

#: name -> statement returning one row per violation
CHECKS = {
    ONE_PLACE: """
        SELECT d.message_id, d.group_id, 'a delivery row past the offset' FROM deliveries d
        JOIN subscriptions s ON s.topic_id = d.topic_id AND s.group_id = d.group_id
        WHERE d.message_id > s.consume_offset
        UNION ALL
        SELECT q.message_id, q.group_id, 'a dead letter past the offset' FROM dlq_messages q
        JOIN subscriptions s ON s.topic_id = q.topic_id AND s.group_id = q.group_id
        WHERE q.message_id > s.consume_offset
        UNION ALL
        SELECT d.message_id, d.group_id, 'a delivery row and a dead letter' FROM deliveries d
        JOIN dlq_messages q ON q.group_id = d.group_id AND q.message_id = d.message_id
        WHERE d.state <> 'HALTED'  -- a halted key's head: its dead letter, holding the key""",
    # no foreign key checks this row by row: the statements must (the log is partitioned)
    FOREIGN_DELIVERY: """
        SELECT d.message_id, d.group_id, d.topic_id FROM deliveries d
        WHERE (d.state <> 'HALTED'  -- a dead letter's: retention may drop its message, a redrive puts it back
               AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.topic_id = d.topic_id AND m.id = d.message_id
                                                          AND m.published_at = d.published_at))
           OR NOT EXISTS (SELECT 1 FROM subscriptions s
                          WHERE s.topic_id = d.topic_id AND s.group_id = d.group_id)
        UNION ALL
        SELECT q.message_id, q.group_id, q.topic_id FROM dlq_messages q
        WHERE NOT EXISTS (SELECT 1 FROM subscriptions s
                          WHERE s.topic_id = q.topic_id AND s.group_id = q.group_id)""",
    DLQ_ROWS: """
        SELECT message_id, group_id, count(*) FROM dlq_messages GROUP BY 1, 2 HAVING count(*) > 1""",
    # a batch's messages (its topic's ids in its range, or those it lists: recorded before 0013)
    # are all in one partition (one publish time): all of them, unless retention dropped a
    # partition of its time (chaos.dropped_partitions; a partition of that time may have been made
    # again since, by a publish at that time or a redrive putting some of them back); a batch of
    # messages knows them; and every message published (a copy to another topic aside) is in
    # exactly one batch, from the oldest recorded range on: a batch applied twice leaves messages
    # in none
    BATCH_COUNT: """
        WITH batch_messages AS (
          SELECT b.batch_id, m.id FROM publish_batches b
          JOIN messages m ON m.topic_id = b.topic_id AND m.id BETWEEN b.first_id AND b.last_id
          UNION ALL
          SELECT b.batch_id, m.id FROM publish_batches b
          JOIN messages m ON m.topic_id = b.topic_id AND m.id = ANY(b.message_ids)),
        batches AS (
          SELECT b.*, EXISTS (SELECT 1 FROM chaos.dropped_partitions l
                              WHERE coalesce(l.starts_at, '-infinity') <= b.published_at
                                AND l.ends_at > b.published_at) AS dropped
          FROM publish_batches b)
        SELECT b.batch_id, b.message_count, count(x.id) FROM batches b
        LEFT JOIN batch_messages x ON x.batch_id = b.batch_id
        GROUP BY b.batch_id, b.message_count, b.dropped, b.first_id, b.message_ids
        HAVING (count(x.id) <> b.message_count AND NOT b.dropped)
            OR (b.message_count > 0 AND b.first_id IS NULL AND b.message_ids IS NULL AND NOT b.dropped)
        UNION ALL
        SELECT 'message ' || m.id, 1, count(x.batch_id) FROM messages m
        LEFT JOIN batch_messages x ON x.id = m.id
        WHERE m.origin_message_id IS NULL AND m.id >= (SELECT min(first_id) FROM publish_batches)
        GROUP BY m.id HAVING count(x.batch_id) <> 1""",
    EARLY_PROMOTION: """
        SELECT message_id, group_id, due_at, ready_at FROM deliveries
        WHERE state IN ('READY', 'INFLIGHT') AND due_at IS NOT NULL AND ready_at < due_at""",
    REDRIVE_AUDIT: """
        SELECT r.run_key, r.moved, (SELECT count(*) FROM redrive_moves m WHERE m.run_id = r.id)
        FROM redrive_runs r
        WHERE r.moved <> (SELECT count(*) FROM redrive_moves m WHERE m.run_id = r.id)
        UNION ALL
        SELECT x.message_id::text, x.redrive_count, count(m.run_id)
        FROM (SELECT message_id, group_id, redrive_count FROM deliveries WHERE state <> 'HALTED'
              UNION ALL SELECT message_id, group_id, redrive_count FROM dlq_messages) x
        LEFT JOIN redrive_moves m ON m.message_id = x.message_id AND m.group_id = x.group_id
        GROUP BY x.message_id, x.group_id, x.redrive_count HAVING count(m.run_id) <> x.redrive_count""",
    # a key BLOCKED with no head is stuck for ever; a BLOCKED one older than its head, passed over
    ORDERED_HEADS: """
        SELECT d.topic_id, d.group_id, d.key, 'BLOCKED with no head' FROM deliveries d
        WHERE d.state = 'BLOCKED' AND NOT EXISTS (
          SELECT 1 FROM deliveries h WHERE h.topic_id = d.topic_id AND h.group_id = d.group_id
            AND h.key = d.key AND h.state <> 'BLOCKED')
        UNION ALL
        SELECT d.topic_id, d.group_id, d.key, 'BLOCKED older than its head' FROM deliveries d
        JOIN deliveries h ON h.topic_id = d.topic_id AND h.group_id = d.group_id AND h.key = d.key
         AND h.state <> 'BLOCKED'
        WHERE d.state = 'BLOCKED' AND d.redrive_count = 0 AND d.message_id < h.message_id
        UNION ALL
        SELECT d.topic_id, d.group_id, d.message_id::text, 'a key that is not its message''s'
        FROM deliveries d JOIN subscriptions s ON s.topic_id = d.topic_id AND s.group_id = d.group_id
        JOIN messages m ON m.topic_id = d.topic_id AND m.id = d.message_id
        WHERE d.key IS DISTINCT FROM CASE WHEN s.ordered THEN nullif(m.key, '') END
        UNION ALL
        SELECT d.topic_id, d.group_id, d.message_id::text, 'HALTED without its dead letter'
        FROM deliveries d WHERE d.state = 'HALTED' AND NOT EXISTS (
          SELECT 1 FROM dlq_messages q WHERE q.group_id = d.group_id AND q.message_id = d.message_id)""",
    BREAKER: OPEN_BREAKER_SQL,
    GENERATIONS: GENERATIONS_SQL,
}
HISTORY_LIMIT = 20  # the attempt history keeps the last 20 failed deliveries
#: The attempt history's outcomes of a consumer's failing answer (client._MODES): a nack while its
#: group's breaker is open is parked (issue 41).
FAILED_OUTCOME = {"nack": {"nack", "parked"}, "reject": {"rejected"}}
#: Per message of the log and subscribed group: where it is (a delivery row's state, DLQ, NEW
#: past the offset, or COMMITTED), its delivery count and its history (a row's or a dead letter's).
_STATES = """
    SELECT m.id, g.name,
           CASE WHEN d.message_id IS NOT NULL AND d.state <> 'HALTED' THEN d.state::text
                WHEN q.message_id IS NOT NULL THEN 'DLQ'
                WHEN m.id > s.consume_offset THEN 'NEW' ELSE 'COMMITTED' END,
           coalesce(d.delivery_count, q.delivery_count),
           coalesce(ARRAY(SELECT (e->>'delivery') || ':' || (e->>'outcome')
                          FROM jsonb_array_elements(coalesce(d.attempts, q.attempts)) e), '{}')
    FROM messages m JOIN subscriptions s ON s.topic_id = m.topic_id
    JOIN consumer_groups g ON g.id = s.group_id
    LEFT JOIN deliveries d ON d.topic_id = m.topic_id AND d.group_id = s.group_id AND d.message_id = m.id
    LEFT JOIN dlq_messages q ON q.group_id = s.group_id AND q.message_id = m.id"""


def check(
    conn: psycopg.Connection,
    previous: dict | None = None,
    calls: list[Call] | None = None,
    workers: list | None = None,
) -> dict[str, list]:
    """{invariant: violations} for every invariant its arguments allow: the SQL ones always;
    ``previous`` (a ``counts`` snapshot of an earlier round): nothing decreased since; ``calls``
    (``ledger.read``): the state store against what the clients saw; ``workers``: (tag, exit code,
    killed by the controller, traceback text or None) of the workers that ended."""
    found = {name: conn.execute(sql).fetchall() for name, sql in CHECKS.items()}
    found[HISTORY] = history(conn)
    if previous is not None:
        found[DECREASED] = decreased(previous, counts(conn))
    if calls is not None:
        states = delivery_states(conn)
        for name, ledger_check in LEDGER_CHECKS.items():
            found[name] = ledger_check(conn, calls, states)
    if workers is not None:
        found[WORKERS] = [w for w in workers if not w[2] and (w[1] != 0 or w[3])]
    return found


def history(conn: psycopg.Connection) -> list:
    """A delivery row's or a dead letter's attempt history lists deliveries k+1..n, one each, n
    being its delivery count less the delivery in flight, if any: a delivery answered twice would be
    listed twice."""
    bad = []
    rows = conn.execute("""
        SELECT message_id, group_id, state::text, delivery_count,
               ARRAY(SELECT (e->>'delivery')::int FROM jsonb_array_elements(attempts) e) FROM deliveries
        UNION ALL
        SELECT message_id, group_id, 'DLQ', delivery_count,
               ARRAY(SELECT (e->>'delivery')::int FROM jsonb_array_elements(attempts) e) FROM dlq_messages
        """).fetchall()
    for message_id, group_id, state, count, listed in rows:
        failed = count - (1 if state == "INFLIGHT" else 0)
        expected = list(range(max(1, failed - HISTORY_LIMIT + 1), failed + 1))
        if listed != expected:
            bad.append((message_id, group_id, state, count, listed))
    return bad


def counts(conn: psycopg.Connection) -> dict:
    """{(message id, group id): (delivery count, redrive count)} of the delivery rows and dead
    letters, {("group totals", group id): (promoted, dead-lettered, redriven, stale receipts)} (the
    metric counters of redelivery.metrics) and {("subscription", topic id, group id): (consume
    offset, messages taken, dead letters expired, COMMITTED)}, read in one snapshot."""
    autocommit = conn.autocommit
    with conn.transaction():
        if autocommit:  # a transaction of its own: one snapshot for every query
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found = {
            (m, g): (c, r)
            for m, g, c, r in conn.execute(
                "SELECT message_id, group_id, delivery_count, redrive_count FROM deliveries"
                " UNION ALL SELECT message_id, group_id, delivery_count, redrive_count FROM dlq_messages"
            )
        }
        for g, *totals in conn.execute(
            "SELECT id, promoted, dead_lettered, redriven, stale_receipts FROM consumer_groups"
        ):
            found[("group totals", g)] = tuple(totals)
        for t, g, *numbers in conn.execute(_SUBSCRIPTION_NUMBERS):
            found[("subscription", t, g)] = tuple(numbers)
    return found


#: A subscription's consume offset, messages taken, dead letters expired and COMMITTED count.
_SUBSCRIPTION_NUMBERS = """
    SELECT s.topic_id, s.group_id, s.consume_offset, s.messages_taken, s.dead_letters_expired,
           s.messages_taken - s.dead_letters_expired
           - (SELECT count(*) FROM deliveries d WHERE d.topic_id = s.topic_id AND d.group_id = s.group_id
                AND d.state <> 'HALTED')
           - (SELECT count(*) FROM dlq_messages q WHERE q.topic_id = s.topic_id AND q.group_id = s.group_id)
    FROM subscriptions s"""


def decreased(previous: dict, now: dict) -> list:
    """Counters lower now than before (a delivery row or dead letter gone is the other invariants'
    to judge)."""
    return [
        (key, before, now[key])
        for key, before in previous.items()
        if key in now and any(a < b for a, b in zip(now[key], before, strict=True))
    ]


def final(conn: psycopg.Connection) -> list:
    """After draining: no delivery row left, and every consume offset at its topic's newest message."""
    return conn.execute("""
        SELECT message_id, group_id, state::text FROM deliveries
        UNION ALL
        SELECT min(m.id), s.group_id, 'past the offset'
        FROM subscriptions s JOIN messages m ON m.topic_id = s.topic_id AND m.id > s.consume_offset
        GROUP BY s.topic_id, s.group_id
        """).fetchall()


# ---- the state store against the ledger ------------------------------------------------------


def delivery_states(conn: psycopg.Connection) -> dict:
    """{(message id, group name): (where, delivery count, {delivery: outcome} of its history)} for
    every message of the log and group subscribed to its topic (``_STATES``)."""
    return {
        (m, g): (state, count, dict((int(a.split(":")[0]), a.split(":", 1)[1]) for a in attempts))
        for m, g, state, count, attempts in conn.execute(_STATES).fetchall()
    }


def deleted_since(calls: list[Call]):
    """Whether a publish call's topic was deleted (or a delete of it began) after the call began: its
    messages, batch record and deliveries may be gone with the topic."""
    deletes = [(c.asked["topic"], c.began) for c in events(calls, "delete_topic", phase=None)]

    def deleted(call: Call) -> bool:
        return any(topic == call.asked["topic"] and began > call.began for topic, began in deletes)

    return deleted


def published(conn, calls: list[Call], states) -> list:
    """Each publish a producer saw answered: its batch holds exactly the ids the API gave, with the
    keys the producer asked for, as many as it asked for (once retention dropped a partition of its
    time, only ids it gave, those a redrive put back: RETAINED judges the others; nothing once its
    topic was deleted)."""
    bad, deleted = [], deleted_since(calls)
    for call in events(calls, "publish"):
        if deleted(call):
            continue
        rows = conn.execute(
            """SELECT m.id, m.key FROM publish_batches b
               JOIN messages m ON m.topic_id = b.topic_id
                AND (m.id BETWEEN b.first_id AND b.last_id OR m.id = ANY(b.message_ids))
               WHERE b.batch_id = %s ORDER BY m.id""",
            (call.asked["batch"],),
        ).fetchall()
        if _dropped(conn, call):  # gone, or some put back by a redrive: none but the ids it gave
            given = set(call.answer.get("ids", [r[0] for r in rows]))
            if not {r[0] for r in rows} <= given:
                bad.append((call.worker, call.asked["batch"], call.asked["count"], len(rows)))
            continue
        if (
            len(rows) != call.asked["count"]
            or sorted(r[0] for r in rows) != sorted(call.answer.get("ids", [r[0] for r in rows]))
            or Counter(r[1] for r in rows) != Counter(call.asked["keys"])
        ):
            bad.append((call.worker, call.asked["batch"], call.asked["count"], len(rows)))
    return bad


def _dropped(conn, call: Call) -> bool:
    """Whether retention dropped the messages of an answered publish: no partition holds the time
    its batch was published at."""
    row = conn.execute(
        """SELECT EXISTS (SELECT 1 FROM chaos.dropped_partitions l
                          WHERE coalesce(l.starts_at, '-infinity') <= b.published_at
                            AND l.ends_at > b.published_at)
           FROM publish_batches b WHERE b.batch_id = %s""",
        (call.asked["batch"],),
    ).fetchone()
    return bool(row and row[0])


def handed(calls: list[Call]) -> list[tuple]:
    """(call, message id, group, delivery count) of every message a consumer was handed."""
    return [
        (call, m, call.answer["group"], c)
        for call in events(calls, "receive")
        for m, c in call.answer.get("handed", [])
    ]


def handed_once(conn, calls: list[Call], states) -> list:
    seen = Counter((m, g, c) for _, m, g, c in handed(calls))
    return [(m, g, c, n) for (m, g, c), n in seen.items() if n > 1]


def increasing(conn, calls: list[Call], states) -> list:
    """A receive that began after another one for the same message and group ended must hand out
    a higher delivery count (real time: the ledger's clock is the machine's)."""
    by_message = defaultdict(list)
    for call, m, g, c in handed(calls):
        by_message[(m, g)].append((call.began, call.ended, c, call.worker))
    bad = []
    for (m, g), seen in by_message.items():
        for began, _, count, worker in seen:
            for _, ended, earlier, other in seen:
                if ended < began and count <= earlier:
                    bad.append((m, g, earlier, count, other, worker))
    return bad


def _holds(verb: str, receipt: tuple, states: dict) -> bool:
    """Whether the state store shows ``verb`` applied to receipt (message, group, delivery): an
    ack, the message COMMITTED (or dropped by retention, which only drops what every group ended);
    a nack or reject, its outcome in the history of the delivery row or dead letter. A message
    COMMITTED since keeps no history, and nothing here contradicts the answer: whether it was
    committed by a later delivery, handed and acked, and not by a lost row or dead letter, is
    COMMITTED_ACKED's to judge (``committed_acked``), so that a lost row is reported once, as what
    it is."""
    m, g, c = receipt
    state, _, attempts = states.get((m, g), (None, None, {}))
    if verb == "ack":
        return state in ("COMMITTED", None)
    return state in ("COMMITTED", None) or attempts.get(c) in FAILED_OUTCOME[verb]


def applied(conn, calls: list[Call], states) -> list:
    """An answer the API said applied to n of its receipts: at least n of them show it (all of
    them when n is all)."""
    bad = []
    for call in events(calls, "answer"):
        receipts = [(m, call.asked["group"], c) for m, c in call.asked["receipts"]]
        showing = sum(_holds(call.asked["verb"], r, states) for r in receipts)
        if showing < call.answer["applied"]:
            bad.append((call.worker, call.asked["verb"], receipts, call.answer["applied"], showing))
    return bad


def stale(conn, calls: list[Call], states) -> list:
    """An answer the API called stale for every receipt changed none of them: no stale ack
    COMMITTED a message that no other ack (applied, or of unknown outcome: cut short, or a Spark
    task's) could have; no nack or reject put its outcome in the delivery's history unless another
    call of the same answer could have. And each group counted at least the stale receipts the API
    told of."""
    answers = events(calls, "answer", phase=None)
    maybe = Counter(
        (call.asked["verb"], m, call.asked["group"], None if call.asked["verb"] == "ack" else c)
        for call in answers
        if call.phase != "ok" or call.answer["applied"] > 0
        for m, c in call.asked["receipts"]
    )
    bad, told = [], Counter()
    for call in events(calls, "answer"):
        verb, group = call.asked["verb"], call.asked["group"]
        told[group] += len(call.asked["receipts"]) - call.answer["applied"]
        if call.answer["applied"]:
            continue
        for m, c in call.asked["receipts"]:
            if maybe[(verb, m, group, None if verb == "ack" else c)]:
                continue
            state, _, attempts = states.get((m, group), (None, None, {}))
            changed = state == "COMMITTED" if verb == "ack" else attempts.get(c) in FAILED_OUTCOME[verb]
            if changed:
                bad.append((call.worker, verb, m, group, c))
    counted = dict(conn.execute("SELECT name, stale_receipts FROM consumer_groups").fetchall())
    bad += [
        ("stale receipts counted", g, counted.get(g, 0), n) for g, n in told.items() if counted.get(g, 0) < n
    ]
    return bad


def reported(conn, calls: list[Call], states) -> list:
    """A tier run's reported promotions are its record's; a finished redrive's moves are its run's."""
    bad = []
    for call in events(calls, "tier"):
        row = conn.execute(
            "SELECT (summary->>'promoted')::int FROM tier_runs WHERE run_key = %s", (call.answer["run_key"],)
        ).fetchone()
        if row is None or row[0] != call.answer["promoted"]:
            bad.append(("tier", call.answer["run_key"], call.answer["promoted"], row))
    for call in events(calls, "redrive"):
        row = conn.execute(
            "SELECT status, moved FROM redrive_runs WHERE run_key = %s", (call.answer["run_key"],)
        ).fetchone()
        if row is None or tuple(row) != (call.answer["status"], call.answer["moved"]):
            bad.append(("redrive", call.answer["run_key"], call.answer["status"], call.answer["moved"], row))
    return bad


def committed_handed(conn, calls: list[Call], states) -> list:
    """A message COMMITTED for a group (at or below its offset, no delivery row, no dead letter)
    was handed to that group by some receive: an offset that passed a message never delivered
    would make it COMMITTED unseen."""
    seen = {(m, g) for _, m, g, _ in handed(calls)}
    return [(m, g) for (m, g), (state, _, _) in states.items() if state == "COMMITTED" and (m, g) not in seen]


#: (message id, group name) of the dead letters a redrive copied to another topic: COMMITTED
#: for their group with no ack (``REDRIVE_MOVE_BATCH``).
_COPIED_AWAY = """
    SELECT m.message_id, g.name FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
    JOIN consumer_groups g ON g.id = m.group_id WHERE r.filter->>'destination_topic' IS NOT NULL"""


def committed_acked(conn, calls: list[Call], states) -> list:
    """A message COMMITTED for a group was acked at its last delivery the ledger shows for that
    group (the highest delivery count handed to it, or named by an answer): some ack of that very
    delivery applied, or may have (cut short by a kill, lost in a commit answer, or a Spark task's:
    outcome unknown), as in ``stale``. Only an ack ends a delivery COMMITTED, and nothing comes
    after COMMITTED; a delivery that failed (nacked, rejected, its lease run out unanswered) is
    followed by a higher count if its message is received again (after a retry, or a redrive of
    its dead letter). So a failed last delivery, or one the ledger shows unanswered, ending
    COMMITTED is a lost delivery row or dead letter: a message that looks processed and never was.
    The crash suite's clients record every ack they make (an ack made outside the ledger would be
    reported). A dead letter a redrive copied to another topic ends COMMITTED unacked: left out."""
    last: dict[tuple, int] = {}
    for _, m, g, c in handed(calls):
        last[(m, g)] = max(c, last.get((m, g), c))
    verbs: dict[tuple, set] = defaultdict(set)
    for call in events(calls, "answer", phase=None):
        verb, group = call.asked["verb"], call.asked["group"]
        if verb == "ack" and call.phase == "ok" and call.answer["applied"] == 0:
            verb = "stale ack"  # the API applied none of its receipts
        elif verb == "ack":
            verb = "ack" if call.phase == "ok" else "ack of unknown outcome"
        for m, c in call.asked["receipts"]:
            last[(m, group)] = max(c, last.get((m, group), c))
            verbs[(m, group, c)].add(verb)
    copied = set(conn.execute(_COPIED_AWAY).fetchall())
    bad = []
    for (m, g), c in sorted(last.items()):
        if states.get((m, g), (None,))[0] != "COMMITTED" or (m, g) in copied:
            continue
        answered = verbs[(m, g, c)]
        if not answered & {"ack", "ack of unknown outcome"}:
            bad.append((m, g, c, sorted(answered) or ["unanswered"]))
    return bad


def retained(conn, calls: list[Call], states) -> list:
    """Every message an answered publish gave an id to and the log no longer holds was, for every
    group subscribed to its topic, handed to it or is its dead letter: retention drops only what
    every group finished."""
    in_log = {m for m, _ in states}
    groups = defaultdict(set)
    for topic, group in conn.execute(
        "SELECT t.name, g.name FROM subscriptions s JOIN topics t ON t.id = s.topic_id"
        " JOIN consumer_groups g ON g.id = s.group_id"
    ):
        groups[topic].add(group)
    ended = {(m, g) for _, m, g, _ in handed(calls)}
    ended |= set(conn.execute("SELECT q.message_id, g.name FROM dlq_messages q"
                              " JOIN consumer_groups g ON g.id = q.group_id").fetchall())  # fmt: skip
    bad, deleted = [], deleted_since(calls)
    for call in events(calls, "publish"):
        if deleted(call):  # gone with its topic, not by retention
            continue
        for m in call.answer.get("ids", []):
            if m not in in_log:
                bad += [(m, g) for g in sorted(groups[call.asked["topic"]]) if (m, g) not in ended]
    return bad


#: (message id, group name, key) of every keyed message for each ordered group of its topic; and
#: (message id, group name) of the messages a redrive brought back to a group.
_ORDERED_MESSAGES = """SELECT m.id, g.name, m.key FROM messages m
    JOIN subscriptions s ON s.topic_id = m.topic_id AND s.ordered
    JOIN consumer_groups g ON g.id = s.group_id WHERE nullif(m.key, '') IS NOT NULL"""
_REDRIVEN = """SELECT DISTINCT m.message_id, g.name FROM redrive_moves m
    JOIN consumer_groups g ON g.id = m.group_id"""


def ordered(conn, calls: list[Call], states) -> list:
    """For an ordered group, messages m1 < m2 of one key (ids grow in publish order): after a receive
    handing m2 ended, no receive handing m1 and no answer to m1 applied to all its receipts began
    (real time: a call that may have overlapped proves nothing): neither an ack (m2 committed ahead),
    a nack (m1 in flight) nor a later delivery of m1 (its retry passed over). A message a redrive
    brought back re-enters behind its key's current head: left out as m1."""
    keys = {(m, g): k for m, g, k in conn.execute(_ORDERED_MESSAGES).fetchall()}
    redriven = set(conn.execute(_REDRIVEN).fetchall())
    handed_end: dict[tuple, float] = {}  # (m, group) -> the earliest end of a receive handing it
    unfinished_at: dict[tuple, float] = {}  # (m, group) -> the latest start of a call showing it unfinished
    for call, m, g, _ in handed(calls):
        if (m, g) in keys:
            handed_end[(m, g)] = min(call.ended, handed_end.get((m, g), call.ended))
            unfinished_at[(m, g)] = max(call.began, unfinished_at.get((m, g), call.began))
    applied_all = [c for c in events(calls, "answer") if c.answer["applied"] == len(c.asked["receipts"])]
    for call, key in ((c, (m, c.asked["group"])) for c in applied_all for m, _ in c.asked["receipts"]):
        if key in keys:
            unfinished_at[key] = max(call.began, unfinished_at.get(key, call.began))
    by_key = defaultdict(list)
    for (m, g), k in sorted(keys.items()):
        by_key[(g, k)].append(m)
    return [
        (g, k, older, later)
        for (g, k), ids in by_key.items()
        for i, later in enumerate(ids)
        if (later, g) in handed_end
        for older in ids[:i]
        if (older, g) not in redriven and unfinished_at.get((older, g), 0) > handed_end[(later, g)]
    ]


LEDGER_CHECKS = {
    PUBLISHED: published,
    HANDED_ONCE: handed_once,
    APPLIED: applied,
    INCREASING: increasing,
    STALE: stale,
    REPORTED: reported,
    COMMITTED_HANDED: committed_handed,
    COMMITTED_ACKED: committed_acked,
    RETAINED: retained,
    ORDERED: ordered,
}
