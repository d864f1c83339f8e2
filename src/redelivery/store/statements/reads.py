"""Read-only snapshots: the operator page and the Prometheus metrics."""

from __future__ import annotations

from redelivery.store.statements._shared import AT, _named
from redelivery.store.statements.ordered import _BLOCKED_OF

# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- operator page --------------------------------------------------------------------------------
# The "Dead letters" page (``redelivery.airflow.ui.app``), read on each page load. Like the metrics, each
# costs what it counts (a live state through its partial index, the messages past an offset through
# the log's primary key, dead letters through their narrow index, a tier's latest runs through
# tier_runs_window).

#: The tiers that have runs, by a skip scan of tier_runs_window (one index descent per tier).
_TIERS_WITH_RUNS = """WITH RECURSIVE tiers AS (
        SELECT min(tier) AS tier FROM tier_runs
        UNION ALL
        SELECT (SELECT min(r.tier) FROM tier_runs r WHERE r.tier > t.tier)
        FROM tiers t WHERE t.tier IS NOT NULL)"""
#: The latest ``n`` successful real runs of each tier, oldest first: window end, promoted, and the
#: lateness (window end minus due time) p50, p99 and max in seconds (NULL: the run promoted nothing).
#: The tiers are found by a skip scan of tier_runs_window, then each tier's runs read backwards from it.
RECENT_TIER_LATENESS = _named("RECENT_TIER_LATENESS", f"""
    {_TIERS_WITH_RUNS}
    SELECT t.tier, r.window_end, (r.summary->>'promoted')::bigint,
           (r.summary->'lateness_seconds'->>'p50')::float8, (r.summary->'lateness_seconds'->>'p99')::float8,
           (r.summary->'lateness_seconds'->>'max')::float8
    FROM tiers t CROSS JOIN LATERAL (
        SELECT window_end, summary FROM tier_runs
        WHERE tier = t.tier AND status = 'success' AND NOT dry_run
        ORDER BY window_end DESC LIMIT %(runs)s) r
    WHERE t.tier IS NOT NULL ORDER BY 1, 2""")
#: The groups the page lists, at most ``limit``: each group whose name contains ``name`` (as text,
#: case-insensitively; '' matches every group) and that has live messages (READY: READY rows and
#: messages past its offsets; INFLIGHT, WAITING_RETRY, BLOCKED) or dead letters, most dead letters
#: first, then by name. Per group: id, name, its counts per live state, its oldest and newest dead-lettering
#: time, and how many groups matched in all (before the limit). The counts come from the partial
#: indexes, the log's primary key and dlq_messages_browse.
PAGE_GROUPS = _named("PAGE_GROUPS", """
    WITH chosen AS MATERIALIZED (
        SELECT id, name FROM consumer_groups WHERE strpos(lower(name), lower(%(name)s::text)) > 0),
    counts AS (
        SELECT group_id, count(*) AS ready, 0::bigint AS inflight, 0::bigint AS waiting, 0::bigint AS dead,
               0::bigint AS blocked, NULL::timestamptz AS oldest, NULL::timestamptz AS newest
        FROM deliveries WHERE state = 'READY' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT s.group_id, p.n, 0, 0, 0, 0, NULL, NULL
        FROM subscriptions s CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM messages m WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset) p
        WHERE s.group_id IN (SELECT id FROM chosen) AND p.n > 0
        UNION ALL
        SELECT group_id, 0, count(*), 0, 0, 0, NULL, NULL
        FROM deliveries WHERE state = 'INFLIGHT' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, 0, count(*), 0, 0, NULL, NULL
        FROM deliveries WHERE state = 'WAITING_RETRY' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, 0, 0, count(*), 0, min(dead_lettered_at), max(dead_lettered_at)
        FROM dlq_messages WHERE group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, 0, 0, 0, count(*), NULL, NULL
        FROM deliveries WHERE state = 'BLOCKED' AND group_id IN (SELECT id FROM chosen) GROUP BY 1),
    per_group AS (
        SELECT c.id, c.name, sum(k.ready)::bigint AS ready, sum(k.inflight)::bigint AS inflight,
               sum(k.waiting)::bigint AS waiting, sum(k.dead)::bigint AS dead,
               sum(k.blocked)::bigint AS blocked, min(k.oldest) AS oldest, max(k.newest) AS newest
        FROM counts k JOIN chosen c ON c.id = k.group_id GROUP BY 1, 2)
    SELECT id, name, ready, inflight, waiting, dead, blocked, oldest, newest, count(*) OVER ()
    FROM per_group ORDER BY dead DESC, name LIMIT %(limit)s""")
#: The keys an ordered subscription of the groups ``ids`` holds by a failure: its head waits for a
#: retry (WAITING_RETRY) or is dead-lettered and holds the key (HALTED: ``on_exhausted`` halt); a
#: head READY or in flight is busy, not held. At most ``limit`` a group, held longest first: (group
#: id, topic, key, the head's message id, state, since (its first failure), its retry's due time,
#: the messages BLOCKED behind it, the group's held keys in all). Through ``deliveries_held``, the
#: BLOCKED ones by the key's digest (``deliveries_blocked``), the key compared exactly.
PAGE_HELD_KEYS = _named("PAGE_HELD_KEYS", f"""
    WITH held AS (
      SELECT h.group_id, h.topic_id, h.key, h.message_id, h.state, h.first_failure_at, h.due_at,
             row_number() OVER (PARTITION BY h.group_id ORDER BY h.first_failure_at, h.message_id) AS rank,
             count(*) OVER (PARTITION BY h.group_id) AS total
      FROM deliveries h
      WHERE h.group_id = ANY(%(ids)s::int[]) AND h.key IS NOT NULL AND h.state IN ('WAITING_RETRY', 'HALTED'))
    SELECT x.group_id, t.name, x.key, x.message_id, x.state::text, x.first_failure_at, x.due_at,
           (SELECT count(*) FROM deliveries b
            WHERE {_BLOCKED_OF.format("b", "x.topic_id", "x.group_id", "x.key")}),
           x.total
    FROM held x JOIN topics t ON t.id = x.topic_id
    WHERE x.rank <= %(limit)s ORDER BY x.group_id, x.rank""")
#: The ordered subscriptions' BLOCKED messages of the groups ``ids``: (group id, BLOCKED messages,
#: when the oldest was written: the offset passed it), through ``deliveries_blocked``.
PAGE_BLOCKED = _named("PAGE_BLOCKED", """
    SELECT group_id, count(*), min(created_at) FROM deliveries
    WHERE state = 'BLOCKED' AND group_id = ANY(%(ids)s::int[])
    GROUP BY 1""")
#: Retries waiting (WAITING_RETRY) per delay level of the groups ``ids``: (group id, level, count).
PAGE_WAITING_PER_LEVEL = _named("PAGE_WAITING_PER_LEVEL", """
    SELECT group_id, delay_level, count(*) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2 ORDER BY 1, 2""")
#: Dead letters per DLQ of the groups ``ids``, at most ``limit`` DLQs per group, most first:
#: (group id, DLQ name, count).
PAGE_DLQ_QUEUES = _named("PAGE_DLQ_QUEUES", """
    SELECT group_id, name, n FROM (
        SELECT c.group_id, dq.name, c.n,
               row_number() OVER (PARTITION BY c.group_id ORDER BY c.n DESC, dq.name) AS rank
        FROM (SELECT group_id, dlq_id, count(*) AS n FROM dlq_messages
              WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2) c
        JOIN dead_letter_queues dq ON dq.id = c.dlq_id) r
    WHERE rank <= %(limit)s ORDER BY 1, 3 DESC, 2""")
#: Dead letters per reason of the groups ``ids`` (every reason a group has): (group id, reason,
#: count), most first.
PAGE_DLQ_REASONS = _named("PAGE_DLQ_REASONS", """
    SELECT group_id, reason::text, count(*) FROM dlq_messages
    WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2""")
#: The ``limit`` most frequent failures of the groups ``ids``, by the signature of their dead
#: letters' last failure (issue 40; index ``dlq_messages_signature`` alone): (group id, signature,
#: count, how many failed again after a redrive, first and last dead-lettered at, and the newest
#: one's class, error text (its first ``error_chars`` characters) and top frame), most first.
PAGE_DLQ_TOP_FAILURES = _named("PAGE_DLQ_TOP_FAILURES", """
    SELECT c.group_id, c.signature, c.n, c.failed_again, c.first_at, c.last_at, r.error_class, r.last_error,
           r.error_frame
    FROM (SELECT group_id, signature, count(*) AS n,
                 count(*) FILTER (WHERE redrive_count > 0) AS failed_again, min(dead_lettered_at) AS first_at,
                 max(dead_lettered_at) AS last_at,
                 row_number() OVER (PARTITION BY group_id ORDER BY count(*) DESC, signature) AS rank
          FROM dlq_messages WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2) c
    LEFT JOIN LATERAL (
      SELECT q.error_class, left(q.last_error, %(error_chars)s) AS last_error, q.error_frame
      FROM dlq_messages q WHERE q.group_id = c.group_id AND q.signature = c.signature
      ORDER BY q.dead_lettered_at DESC, q.message_id DESC LIMIT 1) r ON true
    WHERE c.rank <= %(limit)s ORDER BY 1, 3 DESC, 2""")
#: The dead letters of one group's failures ``signatures`` over time: per signature, how many in
#: each of ``buckets`` equal spans from ``low`` to ``high`` (epoch seconds; the last span includes
#: ``high``): (signature, span 1..buckets, count), spans without any left out; from the index
#: ``dlq_messages_signature`` alone.
PAGE_DLQ_FAILURE_TIMELINE = _named("PAGE_DLQ_FAILURE_TIMELINE", """
    SELECT signature, least(width_bucket(extract(epoch FROM dead_lettered_at), %(low)s::float8,
                                         %(high)s::float8, %(buckets)s), %(buckets)s) AS span, count(*)
    FROM dlq_messages
    WHERE group_id = %(group_id)s AND signature = ANY(%(signatures)s::text[])
    GROUP BY 1, 2""")
#: Per tier with runs: its latest run (by window end: run key, window end, status, dry run,
#: promoted, dead-lettered, lateness p99 in seconds) and when its latest finished run finished.
#: The tiers by the skip scan of RECENT_TIER_LATENESS, each tier's runs read backwards.
PAGE_TIER_RUNS = _named("PAGE_TIER_RUNS", f"""
    {_TIERS_WITH_RUNS}
    SELECT t.tier, r.run_key, r.window_end, r.status, r.dry_run, (r.summary->>'promoted')::bigint,
           (r.summary->>'dead_lettered')::bigint, (r.summary->'lateness_seconds'->>'p99')::float8,
           f.finished_at
    FROM tiers t
    CROSS JOIN LATERAL (
        SELECT run_key, window_end, status, dry_run, summary FROM tier_runs
        WHERE tier = t.tier ORDER BY window_end DESC LIMIT 1) r
    LEFT JOIN LATERAL (
        SELECT finished_at FROM tier_runs
        WHERE tier = t.tier AND finished_at IS NOT NULL ORDER BY window_end DESC LIMIT 1) f ON true
    WHERE t.tier IS NOT NULL ORDER BY 1""")
#: Retries waiting at the delay levels ``levels`` (a paused tier's), and how many of them are due
#: (at ``at``, default the database clock): from the index deliveries_waiting alone.
PAGE_WAITING_AT_LEVELS = _named("PAGE_WAITING_AT_LEVELS", f"""
    SELECT count(*), count(*) FILTER (WHERE due_at <= {AT}) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND delay_level = ANY(%(levels)s::smallint[])""")

# ---- metrics --------------------------------------------------------------------------------------
# Read at scrape time (``redelivery.metrics``), together in one read-only snapshot. Each costs what
# it counts: a live state's rows through its partial index, the messages past an offset through the
# log's primary key, the dead letters through their narrow index, the subscriptions, the groups, the
# tiers.

#: READY messages per subscription (its READY rows and the messages past its consume offset): how
#: many, and the age in seconds (at ``at``, default the database clock) of the one READY the
#: longest (a READY row's ready_at: when it last became READY; a message past the offset: its
#: publish time). From the index deliveries_ready and the log's primary key alone.
METRICS_READY = _named("METRICS_READY", f"""
    SELECT t.name, g.name, r.n + p.n,
           coalesce(greatest(extract(epoch FROM {AT} - least(r.oldest, p.oldest)), 0), 0)::float8
    FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
    CROSS JOIN LATERAL (
      SELECT count(*) AS n, min(d.ready_at) AS oldest FROM deliveries d
      WHERE d.topic_id = s.topic_id AND d.group_id = s.group_id AND d.state = 'READY') r
    CROSS JOIN LATERAL (
      SELECT count(*) AS n, min(m.published_at) AS oldest FROM messages m
      WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset) p""")
#: COMMITTED messages per subscription, a total that never decreases (``SUBSCRIPTION_STATES``: what
#: it took past its offset less its delivery rows, HALTED ones aside, and its dead letters, deleted
#: ones included).
METRICS_COMMITTED = _named("METRICS_COMMITTED", """
    WITH dead AS (SELECT topic_id, group_id, count(*) AS n FROM dlq_messages GROUP BY 1, 2),
    unfinished AS (SELECT topic_id, group_id, count(*) AS n FROM deliveries WHERE state <> 'HALTED'
                   GROUP BY 1, 2)
    SELECT t.name, g.name,
           s.messages_taken - coalesce(u.n, 0) - coalesce(q.n, 0) - s.dead_letters_expired
    FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
    LEFT JOIN unfinished u ON u.topic_id = s.topic_id AND u.group_id = s.group_id
    LEFT JOIN dead q ON q.topic_id = s.topic_id AND q.group_id = s.group_id""")
METRICS_INFLIGHT = _named("METRICS_INFLIGHT", """
    SELECT t.name, g.name, c.n
    FROM (SELECT topic_id, group_id, count(*) AS n FROM deliveries WHERE state = 'INFLIGHT' GROUP BY 1, 2) c
    JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id""")
#: WAITING_RETRY deliveries per subscription and delay level.
METRICS_WAITING = _named("METRICS_WAITING", """
    SELECT t.name, g.name, c.delay_level, c.n
    FROM (SELECT topic_id, group_id, delay_level, count(*) AS n FROM deliveries
          WHERE state = 'WAITING_RETRY' GROUP BY 1, 2, 3) c
    JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id""")
#: Dead letters per DLQ, topic, group and reason (the DLQ state of the deliveries, row for row).
METRICS_DEAD_LETTERS = _named("METRICS_DEAD_LETTERS", """
    SELECT dq.name, t.name, g.name, c.reason::text, c.n
    FROM (SELECT dlq_id, group_id, topic_id, reason, count(*) AS n FROM dlq_messages GROUP BY 1, 2, 3, 4) c
    JOIN dead_letter_queues dq ON dq.id = c.dlq_id JOIN topics t ON t.id = c.topic_id
    JOIN consumer_groups g ON g.id = c.group_id""")
#: Dead letters per group by the signature of their last failure (issue 40): the ``top`` most
#: frequent signatures of each group with their class, the rest summed as signature 'other' (a
#: bounded number of series however many distinct failures there are); index
#: ``dlq_messages_signature``.
METRICS_DEAD_LETTER_SIGNATURES = _named("METRICS_DEAD_LETTER_SIGNATURES", """
    SELECT g.name, c.signature, x.error_class, c.n
    FROM (SELECT group_id, CASE WHEN rank <= %(top)s THEN signature ELSE 'other' END AS signature,
                 sum(n)::bigint AS n
          FROM (SELECT group_id, coalesce(signature, 'none') AS signature, count(*) AS n,
                       row_number() OVER (PARTITION BY group_id
                                          ORDER BY count(*) DESC, coalesce(signature, 'none')) AS rank
                FROM dlq_messages GROUP BY group_id, signature) r
          GROUP BY 1, 2) c
    JOIN consumer_groups g ON g.id = c.group_id
    -- the class of a signature shown (one probe each; 'other' and 'none' match no row)
    LEFT JOIN LATERAL (SELECT q.error_class FROM dlq_messages q
                       WHERE q.group_id = c.group_id AND q.signature = c.signature LIMIT 1) x ON true""")
#: Ordered subscriptions' keys held by a failure and BLOCKED messages: (topic, group, keys whose head
#: waits for a retry or is HALTED (``deliveries_held``; a head in flight or READY is busy, not held),
#: BLOCKED messages, the age in seconds at ``at`` (default the database clock) of the oldest BLOCKED
#: one: how long a message has waited behind its key's head, from when the offset passed it
#: (``deliveries_blocked``)).
METRICS_BLOCKED = _named("METRICS_BLOCKED", f"""
    SELECT t.name, g.name, coalesce(k.keys, 0), coalesce(b.blocked, 0), coalesce(b.oldest, 0)
    FROM (SELECT topic_id, group_id, count(*) AS keys FROM deliveries
          WHERE key IS NOT NULL AND state IN ('WAITING_RETRY', 'HALTED') GROUP BY 1, 2) k
    FULL JOIN (SELECT topic_id, group_id, count(*) AS blocked,
                      greatest(extract(epoch FROM {AT} - min(created_at)), 0)::float8 AS oldest
               FROM deliveries WHERE state = 'BLOCKED' GROUP BY 1, 2) b USING (topic_id, group_id)
    JOIN topics t ON t.id = topic_id JOIN consumer_groups g ON g.id = group_id""")
METRICS_GROUP_TOTALS = _named("METRICS_GROUP_TOTALS", """
    SELECT name, promoted, dead_lettered, redriven, stale_receipts FROM consumer_groups""")
METRICS_HISTOGRAMS = _named("METRICS_HISTOGRAMS", """
    SELECT tier, metric, bounds, counts, sum FROM tier_histograms ORDER BY 1, 2""")
# fmt: on
