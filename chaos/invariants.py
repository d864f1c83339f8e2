"""The promise, checked in SQL after every round of the crash suite: nothing lost, doubled or
reset. Each check returns the rows that break it (empty: it holds)."""

from __future__ import annotations

import psycopg

#: name -> statement returning one row per violation
CHECKS = {
    "every published message has exactly one delivery per subscribed group": """
        SELECT m.id, s.group_id FROM messages m JOIN subscriptions s ON s.topic_id = m.topic_id
        WHERE NOT EXISTS (SELECT 1 FROM deliveries d
                          WHERE d.message_id = m.id AND d.group_id = s.group_id)""",
    # no foreign key checks this row by row any more (migration 0008): the statements must
    "every delivery belongs to a message of its topic and to a subscribed group": """
        SELECT d.message_id, d.group_id, d.topic_id FROM deliveries d
        WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = d.message_id AND m.topic_id = d.topic_id)
           OR NOT EXISTS (SELECT 1 FROM subscriptions s
                          WHERE s.topic_id = d.topic_id AND s.group_id = d.group_id)""",
    "a DLQ row exists iff the delivery is in DLQ, once": """
        SELECT d.message_id, d.group_id, 'no DLQ row' FROM deliveries d
        WHERE d.state = 'DLQ' AND NOT EXISTS (
            SELECT 1 FROM dlq_messages q WHERE q.message_id = d.message_id AND q.group_id = d.group_id)
        UNION ALL
        SELECT q.message_id, q.group_id, 'DLQ row of a delivery not in DLQ' FROM dlq_messages q
        WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = q.message_id
                          AND d.group_id = q.group_id AND d.state = 'DLQ')
        UNION ALL
        SELECT message_id, group_id, 'two DLQ rows' FROM dlq_messages GROUP BY 1, 2 HAVING count(*) > 1""",
    "each publish batch applied once, with the count it was published with": """
        SELECT b.batch_id, b.message_count, count(m.id) FROM publish_batches b
        LEFT JOIN messages m ON m.publish_batch = b.batch_id
        GROUP BY 1, 2 HAVING count(m.id) <> b.message_count""",
    "nothing promoted before its due time": """
        SELECT message_id, group_id, due_at, ready_at FROM deliveries
        WHERE state IN ('READY', 'INFLIGHT', 'COMMITTED') AND due_at IS NOT NULL AND ready_at < due_at""",
    "redrive audit rows equal the moves": """
        SELECT r.run_key, r.moved, (SELECT count(*) FROM redrive_moves m WHERE m.run_id = r.id)
        FROM redrive_runs r
        WHERE r.moved <> (SELECT count(*) FROM redrive_moves m WHERE m.run_id = r.id)
        UNION ALL
        SELECT d.message_id::text, d.redrive_count, count(m.run_id) FROM deliveries d
        LEFT JOIN redrive_moves m ON m.message_id = d.message_id AND m.group_id = d.group_id
        GROUP BY d.message_id, d.group_id, d.redrive_count HAVING count(m.run_id) <> d.redrive_count""",
}
HISTORY_LIMIT = 20  # the attempt history keeps the last 20 failed deliveries


def check(
    conn: psycopg.Connection, previous: dict | None = None, published: dict | None = None
) -> dict[str, list]:
    """{invariant: violating rows} for every invariant (SQL and Python ones). ``previous``: a
    ``counts`` snapshot of an earlier round (delivery and redrive counts never go down);
    ``published``: {batch id: count} of the batches a producer saw published."""
    found = {name: conn.execute(sql).fetchall() for name, sql in CHECKS.items()}
    found["each failed delivery appears once in the attempt history (no receipt honoured twice)"] = history(
        conn
    )
    if previous is not None:
        now = counts(conn)
        found["no delivery count, redrive count or group total ever decreased"] = [
            (key, before, now.get(key))
            for key, before in previous.items()
            if key not in now or any(a < b for a, b in zip(now[key], before, strict=True))
        ]
    if published is not None:
        found["every batch a producer saw published is there, with its count"] = [
            (batch, count, row)
            for batch, count in published.items()
            if (
                row := conn.execute(
                    "SELECT message_count FROM publish_batches WHERE batch_id = %s", (batch,)
                ).fetchone()
            )
            is None
            or row[0] != count
        ]
    return found


def history(conn: psycopg.Connection) -> list:
    """A delivery's attempt history lists deliveries k+1..n, one each, n being its delivery count
    less the delivery in flight or committed, if any: a delivery answered twice would be listed
    twice, or be both failed and committed."""
    bad = []
    rows = conn.execute("""SELECT message_id, group_id, state::text, delivery_count, last_error,
                                  ARRAY(SELECT (e->>'delivery')::int FROM jsonb_array_elements(attempts) e)
                           FROM deliveries""").fetchall()
    for message_id, group_id, state, count, last_error, listed in rows:
        if last_error and last_error.startswith("redriven to topic"):
            continue  # closed by a redrive to another topic, with no delivery of its own
        failed = count - (1 if state in ("INFLIGHT", "COMMITTED") else 0)
        expected = list(range(max(1, failed - HISTORY_LIMIT + 1), failed + 1))
        if listed != expected:
            bad.append((message_id, group_id, state, count, listed))
    return bad


def counts(conn: psycopg.Connection) -> dict:
    """{(message id, group id): (delivery count, redrive count)} and {("group totals", group id):
    (promoted, dead-lettered, redriven, stale receipts)}: the metric counters of redelivery.metrics."""
    found = {
        (m, g): (c, r)
        for m, g, c, r in conn.execute(
            "SELECT message_id, group_id, delivery_count, redrive_count FROM deliveries"
        )
    }
    for g, *totals in conn.execute(
        "SELECT id, promoted, dead_lettered, redriven, stale_receipts FROM consumer_groups"
    ):
        found[("group totals", g)] = tuple(totals)
    return found


def final(conn: psycopg.Connection) -> list:
    """After draining: every delivery ended, COMMITTED or DLQ."""
    return conn.execute(
        "SELECT message_id, group_id, state::text FROM deliveries WHERE state NOT IN ('COMMITTED', 'DLQ')"
    ).fetchall()
