"""A subscription's circuit breaker (issue 41): its lock, the answers it counts, its transitions.

A subscription's breaker lock is an advisory lock of the transaction, keyed by the subscription
(``_BREAKER_KEY``: its topic id in the high 32 bits, its group id in the low ones, the one-bigint
form, which no other lock of redelivery uses): a statement that may spend an attempt holds it
shared (``BREAKERS_SHARE``), a transition exclusively (``LOCK_BREAKER``), then decides in a
statement of its own, whose snapshot and clock come after the wait. PostgreSQL queues these locks
in order (a share asked after a waiting transition waits behind it: no opening starves), and they
write nothing (a row's share lock would write its tuple and a multixact each time). Lock order,
whoever takes them: the breaker lock first, then delivery rows, then group rows, then
``breaker_outcomes`` (``COUNT_OUTCOMES``, shards 0 to 3); a tier range's ended leases go into
rows of its own backend (shards 4 and up, ``statements.tiers``), which no answer and no other range
writes; a transition takes the breaker lock and its row alone, in a transaction of its own.
"""

from __future__ import annotations

from redelivery.store.statements._shared import FailureSql, _named, counted

# The statements keep the layout of SQL, not of Python.
# fmt: off

#: The advisory lock key of subscription (``{0}``, ``{1}``).
_BREAKER_KEY = "(({0})::bigint << 32) | ({1})::bigint"
#: The breaker locks of the subscriptions (``topic_ids``, ``group_ids``), shared, in the order of
#: their key, until the caller's transaction ends: a statement after it that may spend an attempt
#: (an answer's failure, a tier window's ended leases) reads a state no transition can change
#: before it commits (the transition waits; one before it is seen). Shares do not wait for each
#: other.
BREAKERS_SHARE = _named("BREAKERS_SHARE", f"""
    SELECT count(pg_advisory_xact_lock_shared(k.key))
    FROM (SELECT DISTINCT {_BREAKER_KEY.format("s.topic_id", "s.group_id")} AS key
          FROM unnest(%(topic_ids)s::int[], %(group_ids)s::int[]) AS s(topic_id, group_id)
          ORDER BY 1) k""")
#: A transition's first statement, in its transaction: the subscription's breaker lock, exclusive
#: (it waits for the answers and tier ranges that hold it shared).
LOCK_BREAKER = _named("LOCK_BREAKER", f"""
    SELECT pg_advisory_xact_lock({_BREAKER_KEY.format("%(topic_id)s::int", "%(group_id)s::int")})""")

#: One entry of an answer's ``errors`` (``receipts.error_lookup``: ``{"<message id>": {"error",
#: "class", "frame"} or null}``) as a failure.
_ENTRY = FailureSql(*(f"(e.value ->> '{k}')" for k in ("error", "class", "frame")))
#: In an answer's transaction, last: ``succeeded`` acks and the failures of ``errors`` (a JSON array
#: of ``error_lookup`` objects) that count under ``rule`` (the caller leaves out a late failure's
#: entry when the rule counts the ended lease it came after: ``Consumer._count``) added to the
#: subscription's answers of this second, in the row of the backend's shard (pid modulo 4:
#: concurrent answers of a group rarely wait on one row); none while the
#: breaker is open, so that half-open counts its probes from its first second. Returns (counted
#: failures, the breaker's state as this transaction sees it, an open one past its open time
#: 'half_open').
COUNT_OUTCOMES = _named("COUNT_OUTCOMES", f"""
    WITH failed AS (
      SELECT count(*) FILTER (WHERE {counted("%(rule)s::jsonb", _ENTRY)}) AS n
      FROM jsonb_array_elements(%(errors)s::jsonb) a CROSS JOIN LATERAL jsonb_each(a.value) e),
    added AS (
      INSERT INTO breaker_outcomes AS o (topic_id, group_id, second, shard, succeeded, failed)
      SELECT %(topic_id)s, %(group_id)s, date_trunc('second', now()), pg_backend_pid() %% 4,
             %(succeeded)s, f.n
      FROM failed f WHERE %(succeeded)s + f.n > 0
        -- while open, nothing is counted: what half-open counts from its start are its probes
        AND NOT coalesce((SELECT b.open_until > now() FROM breakers b
                          WHERE b.topic_id = %(topic_id)s AND b.group_id = %(group_id)s), false)
      ON CONFLICT (topic_id, group_id, second, shard) DO UPDATE
        SET succeeded = o.succeeded + excluded.succeeded, failed = o.failed + excluded.failed
      RETURNING 1)
    SELECT f.n, (SELECT CASE WHEN b.state = 'open' AND b.open_until <= now() THEN 'half_open' ELSE b.state END
                 FROM breakers b WHERE b.topic_id = %(topic_id)s AND b.group_id = %(group_id)s),
           (SELECT count(*) FROM added)
    FROM failed f""")

#: The breaker's next state, in a transaction of its own after LOCK_BREAKER (so that its snapshot
#: and its clock come after the wait: after an answer that counted a failure or found the breaker
#: half-open, and once per tier window). Its answers are those since its last
#: transition, at most ``window_seconds`` back when closed, since its open time ended when
#: half-open. Closed: ``min_attempts`` answers and a ``failure_ratio`` of counted failures open it
#: for ``open_seconds``. Open and past its open time (half-open): a counted failure opens it again
#: for twice as long, or holds it (an open period longer than ``max_open_seconds``); ``probe_size``
#: successes close it; neither yet, it is recorded half-open. Held rows are an operator's. Answers
#: older than what the breaker can still need go. Returns the transition (from, to, succeeded,
#: failed, open until: NULL when closed or held), audited in ``breaker_transitions`` (whose open
#: until is never infinity: no client type holds it); nothing when none.
EVALUATE_BREAKER = _named("EVALUATE_BREAKER", """
    WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
    b AS MATERIALIZED (
      SELECT x.topic_id, x.group_id, x.state, x.open_until, x.open_seconds, x.probe_size, x.changed_at
      FROM breakers x
      WHERE x.topic_id = %(topic_id)s AND x.group_id = %(group_id)s AND x.state <> 'held'
      FOR NO KEY UPDATE),
    seen AS MATERIALIZED (
      SELECT coalesce(sum(o.succeeded), 0) AS succeeded, coalesce(sum(o.failed), 0) AS failed
      FROM b JOIN breaker_outcomes o ON o.topic_id = b.topic_id AND o.group_id = b.group_id
       AND o.second >= CASE WHEN b.state = 'closed'
                            THEN greatest(date_trunc('second', b.changed_at),
                                          (SELECT now FROM c) - make_interval(secs => %(window_seconds)s))
                            ELSE date_trunc('second', b.open_until) END),
    next AS MATERIALIZED (
      SELECT b.topic_id, b.group_id, b.state AS from_state, s.succeeded, s.failed,
             CASE WHEN b.state = 'closed'
                    THEN CASE WHEN s.succeeded + s.failed >= %(min_attempts)s
                               AND s.failed >= %(failure_ratio)s * (s.succeeded + s.failed) THEN 'open' END
                  WHEN b.open_until > (SELECT now FROM c) THEN NULL
                  WHEN s.failed > 0
                    THEN CASE WHEN b.open_seconds * 2 > %(max_open_seconds)s THEN 'held' ELSE 'open' END
                  WHEN s.succeeded >= b.probe_size THEN 'closed'
                  WHEN b.state = 'open' THEN 'half_open' END AS to_state,
             CASE WHEN b.state = 'closed' THEN %(open_seconds)s::float8
                  ELSE b.open_seconds * 2 END AS open_for
      FROM b, seen s),
    changed AS (
      UPDATE breakers x SET state = n.to_state,
          open_until = CASE n.to_state
                         WHEN 'open' THEN (SELECT now FROM c) + make_interval(secs => n.open_for)
                                       WHEN 'held' THEN 'infinity'::timestamptz
                                       WHEN 'closed' THEN NULL ELSE x.open_until END,
          open_seconds = CASE n.to_state WHEN 'open' THEN n.open_for WHEN 'closed' THEN NULL
                                         ELSE x.open_seconds END,
          opened_at = CASE WHEN n.from_state = 'closed' THEN (SELECT now FROM c)
                           WHEN n.to_state = 'closed' THEN NULL ELSE x.opened_at END,
          probe_size = CASE WHEN n.from_state = 'closed' THEN %(probe_size)s ELSE x.probe_size END,
          changed_at = (SELECT now FROM c), changed_by = 'redelivery',
          opened_total = x.opened_total + (n.to_state = 'open')::int,
          closed_total = x.closed_total + (n.to_state = 'closed')::int,
          held_total = x.held_total + (n.to_state = 'held')::int
      FROM next n
      WHERE x.topic_id = n.topic_id AND x.group_id = n.group_id AND n.to_state IS NOT NULL
      RETURNING x.topic_id, x.group_id, x.state, x.open_seconds, x.open_until),
    audited AS (
      INSERT INTO breaker_transitions (topic_id, group_id, from_state, to_state, changed_by, succeeded,
                                       failed, open_seconds, open_until)
      SELECT c.topic_id, c.group_id, n.from_state, c.state, 'redelivery', n.succeeded, n.failed,
             c.open_seconds, nullif(c.open_until, 'infinity')
      FROM changed c JOIN next n ON n.topic_id = c.topic_id AND n.group_id = c.group_id
      RETURNING from_state, to_state, succeeded, failed, open_until),
    swept AS (
      DELETE FROM breaker_outcomes o
      WHERE o.topic_id = %(topic_id)s AND o.group_id = %(group_id)s
        AND o.second < (SELECT now FROM c) - make_interval(secs => %(window_seconds)s)
        AND o.second < coalesce((SELECT x.open_until FROM breakers x
                                 WHERE x.topic_id = %(topic_id)s AND x.group_id = %(group_id)s),
                                'infinity'))
    SELECT from_state, to_state, succeeded, failed, open_until FROM audited""")

#: An operator's transition of a subscription's breaker (after LOCK_BREAKER, in its transaction),
#: by ``changed_by`` (who and through what), with ``note``: ``state`` 'held' (open until an
#: operator closes it), 'open' (for ``open_seconds``, half-open after, a probe of ``probe_size``),
#: or 'closed' (the answers counted before no longer count).
#: Returns (from, to, open until: NULL when closed or held); nothing: no such subscription.
SET_BREAKER = _named("SET_BREAKER", """
    WITH b AS MATERIALIZED (
      SELECT x.topic_id, x.group_id, x.state FROM breakers x
      WHERE x.topic_id = %(topic_id)s AND x.group_id = %(group_id)s FOR NO KEY UPDATE),
    changed AS (
      UPDATE breakers x SET state = %(state)s::text,
          open_until = CASE %(state)s::text WHEN 'closed' THEN NULL WHEN 'held' THEN 'infinity'::timestamptz
                         ELSE clock_timestamp() + make_interval(secs => %(open_seconds)s::float8) END,
          open_seconds = CASE WHEN %(state)s::text = 'closed' THEN NULL
                              ELSE coalesce(%(open_seconds)s::float8, x.open_seconds) END,
          opened_at = CASE WHEN %(state)s::text = 'closed' THEN NULL
                           ELSE coalesce(x.opened_at, clock_timestamp()) END,
          probe_size = %(probe_size)s,
          changed_at = clock_timestamp(), changed_by = %(changed_by)s,
          opened_total = x.opened_total + (%(state)s::text = 'open')::int,
          closed_total = x.closed_total + (%(state)s::text = 'closed')::int,
          held_total = x.held_total + (%(state)s::text = 'held')::int
      FROM b WHERE x.topic_id = b.topic_id AND x.group_id = b.group_id
      RETURNING x.topic_id, x.group_id, x.state, x.open_seconds, x.open_until)
    INSERT INTO breaker_transitions (topic_id, group_id, from_state, to_state, changed_by, open_seconds,
                                     open_until, note)
    SELECT c.topic_id, c.group_id, b.state, c.state, %(changed_by)s, c.open_seconds,
           nullif(c.open_until, 'infinity'), %(note)s
    FROM changed c JOIN b ON b.topic_id = c.topic_id AND b.group_id = c.group_id
    RETURNING from_state, to_state, open_until""")

#: Every subscription's breaker (of group ``group`` when not NULL): topic, group, state ('open'
#: past its open time reads 'half_open'), open until (NULL: closed or held), opened at, open
#: seconds, probe size, changed at, by, times opened, closed, held; and its answers in the last
#: ``window_seconds`` (succeeded, counted failures).
BREAKERS = _named("BREAKERS", """
    SELECT t.name, g.name,
           CASE WHEN b.state = 'open' AND b.open_until <= now() THEN 'half_open' ELSE b.state END,
           nullif(b.open_until, 'infinity'), b.opened_at, b.open_seconds, b.probe_size, b.changed_at,
           b.changed_by,
           b.opened_total, b.closed_total, b.held_total, o.succeeded, o.failed
    FROM breakers b JOIN topics t ON t.id = b.topic_id JOIN consumer_groups g ON g.id = b.group_id
    CROSS JOIN LATERAL (
      SELECT coalesce(sum(x.succeeded), 0) AS succeeded, coalesce(sum(x.failed), 0) AS failed
      FROM breaker_outcomes x
      WHERE x.topic_id = b.topic_id AND x.group_id = b.group_id
        AND x.second >= now() - make_interval(secs => %(window_seconds)s::float8)) o
    WHERE %(group)s::text IS NULL OR g.name = %(group)s::text
    ORDER BY b.state = 'closed', t.name, g.name""")

#: The breakers for the metrics: topic, group, state at ``at`` (or now; an open one past its open
#: time reads 'half_open'), times opened, closed, held.
METRICS_BREAKERS = _named("METRICS_BREAKERS", """
    SELECT t.name, g.name,
           CASE WHEN b.state = 'open' AND b.open_until <= coalesce(%(at)s::timestamptz, now())
                THEN 'half_open' ELSE b.state END,
           b.opened_total, b.closed_total, b.held_total
    FROM breakers b JOIN topics t ON t.id = b.topic_id JOIN consumer_groups g ON g.id = b.group_id""")
#: The subscriptions whose breaker is not closed, and whether its open time ended (held: never).
BREAKERS_NOT_CLOSED = _named("BREAKERS_NOT_CLOSED", """
    SELECT topic_id, group_id, open_until <= now() FROM breakers WHERE state <> 'closed'
    ORDER BY topic_id, group_id""")
#: The names (topic, group) of a subscription by its ids, for a transition's log line.
BREAKER_NAMES = _named("BREAKER_NAMES", """
    SELECT t.name, g.name FROM topics t, consumer_groups g
    WHERE t.id = %(topic_id)s AND g.id = %(group_id)s""")
#: The latest ``limit`` transitions (of group ``group`` when not NULL), newest first: at, topic,
#: group, from, to, by, succeeded, failed, open seconds, open until, note.
BREAKER_TRANSITIONS = _named("BREAKER_TRANSITIONS", """
    SELECT r.at, t.name, g.name, r.from_state, r.to_state, r.changed_by, r.succeeded, r.failed,
           r.open_seconds, r.open_until, r.note
    FROM breaker_transitions r JOIN topics t ON t.id = r.topic_id JOIN consumer_groups g ON g.id = r.group_id
    WHERE %(group)s::text IS NULL OR g.name = %(group)s::text
    ORDER BY r.id DESC LIMIT %(limit)s""")
# fmt: on
