"""Dead letters: filter, count, select, summary; redrive runs and their batches."""

from __future__ import annotations

from redelivery.store.statements._shared import _DLQ_FROM, DLQ_FILTER, _named
from redelivery.store.statements.ordered import _BLOCKED_OF, _HELD, _ORDERING_KEY_OF

# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- dead letters ---------------------------------------------------------------------------------

DLQ_COUNT = _named("DLQ_COUNT", f"SELECT count(*) FROM dlq_messages q WHERE {DLQ_FILTER}")
#: Dead letter ``q`` holds its key: its delivery row is the HALTED head of an ordered subscription's
#: key, which the key's messages wait for (a backlog cap never holds it back).
_HOLDS_ITS_KEY = """EXISTS (
    SELECT 1 FROM deliveries h WHERE h.topic_id = q.topic_id AND h.group_id = q.group_id
      AND h.message_id = q.message_id AND h.state = 'HALTED')"""
#: The matching dead letters that hold their key (``_HOLDS_ITS_KEY``): a redrive moves them whatever
#: the backlog caps.
DLQ_COUNT_HOLDING = _named(
    "DLQ_COUNT_HOLDING", f"SELECT count(*) FROM dlq_messages q WHERE {DLQ_FILTER} AND {_HOLDS_ITS_KEY}"
)
#: The matching dead letters, oldest first, at most ``limit`` (with their last failure's signature,
#: class and top frame: a download says which failure each one is).
DLQ_SELECT = _named("DLQ_SELECT", f"""
    SELECT q.message_id, t.name AS topic, dq.name AS dead_letter_queue, q.reason::text AS reason,
           q.last_error, q.signature, q.error_class, q.error_frame, q.delivery_count, q.reconsume_times,
           q.dead_lettered_at, q.first_failure_at,
           q.last_failure_at, q.redrive_count,
           q.origin_message_id, q.key, q.body, q.content_type, q.properties, q.attempts
    FROM {_DLQ_FROM} WHERE {DLQ_FILTER}
    ORDER BY q.dead_lettered_at, q.message_id LIMIT %(limit)s""")
#: The matching dead letters grouped by the signature of their last failure, most first, at most
#: ``limit`` groups: per signature how many, how many of them had been redriven before (they failed
#: again after a redrive), the first and last dead-lettered at, the topics, and the newest one's
#: class, error text and top frame (what the group looks like). Counted per (signature, topic)
#: first, from the index ``dlq_messages_signature`` alone when only the group is filtered
#: (migration 0020), then per signature over those few rows.
DLQ_SIGNATURES = _named("DLQ_SIGNATURES", f"""
    SELECT s.signature, s.n AS count, s.failed_again, s.first_dead_lettered_at, s.last_dead_lettered_at,
           ARRAY(SELECT t.name FROM topics t WHERE t.id = ANY(s.topic_ids) ORDER BY 1) AS topics,
           r.error_class, r.last_error, r.error_frame, r.message_id AS newest_message_id
    FROM (SELECT p.signature, sum(p.n)::bigint AS n, sum(p.failed_again)::bigint AS failed_again,
                 min(p.first_at) AS first_dead_lettered_at, max(p.last_at) AS last_dead_lettered_at,
                 array_agg(p.topic_id) AS topic_ids
          FROM (SELECT q.signature, q.topic_id, count(*) AS n,
                       count(*) FILTER (WHERE q.redrive_count > 0) AS failed_again,
                       min(q.dead_lettered_at) AS first_at, max(q.dead_lettered_at) AS last_at
                FROM dlq_messages q WHERE {DLQ_FILTER} GROUP BY q.signature, q.topic_id) p
          GROUP BY p.signature ORDER BY 2 DESC, 1 LIMIT %(limit)s) s
    -- the newest of each listed signature only (one probe of the index each)
    LEFT JOIN LATERAL (
      SELECT q.error_class, q.last_error, q.error_frame, q.message_id FROM dlq_messages q
      WHERE {DLQ_FILTER} AND q.signature = s.signature
      ORDER BY q.dead_lettered_at DESC, q.message_id DESC LIMIT 1) r ON true
    ORDER BY s.n DESC, s.signature""")
#: Whether dead letter ``q`` holds its key (``halting``: its message is the HALTED head of its key,
#: an ordered subscription's with on_exhausted halt) and how many messages of the key wait BLOCKED
#: behind it (``behind``; NULL when it holds nothing): the HALTED row by its primary key, the
#: BLOCKED ones by the key's digest (``deliveries_blocked``).
_HALTED_ROW = """EXISTS (SELECT 1 FROM deliveries h WHERE h.topic_id = q.topic_id AND h.group_id = q.group_id
                            AND h.message_id = q.message_id AND h.state = 'HALTED')"""
_HALTING = f"""{_HALTED_ROW} AS halting,
           CASE WHEN {_HALTED_ROW}
                THEN (SELECT count(*) FROM deliveries b
                      WHERE {_BLOCKED_OF.format("b", "q.topic_id", "q.group_id", "nullif(q.key, '')")}) END
             AS behind"""
#: One page of the matching dead letters, newest first, after the keyset cursor
#: (``before_at``, ``before_id``: the last row of the previous page; NULL: the first page), at most
#: ``limit`` rows. Keyset, not OFFSET: a page costs the same at any depth (index
#: ``dlq_messages_browse``), and rows dead-lettered or redriven meanwhile never shift a page.
DLQ_BROWSE = _named("DLQ_BROWSE", f"""
    SELECT q.message_id, q.key, t.name AS topic, dq.name AS dead_letter_queue, q.reason::text AS reason,
           left(q.last_error, %(error_chars)s) AS last_error, length(q.last_error) AS error_length,
           q.delivery_count, q.reconsume_times, q.redrive_count, q.dead_lettered_at, {_HALTING}
    FROM {_DLQ_FROM} WHERE {DLQ_FILTER}
      AND (%(before_at)s::timestamptz IS NULL
           OR (q.dead_lettered_at, q.message_id) < (%(before_at)s::timestamptz, %(before_id)s::bigint))
    ORDER BY q.dead_lettered_at DESC, q.message_id DESC LIMIT %(limit)s""")
#: One dead letter of a group for its detail page: the first ``body_bytes`` bytes of its body
#: and the body's whole size (a body of megabytes never leaves the database whole).
DLQ_MESSAGE = _named("DLQ_MESSAGE", f"""
    SELECT q.message_id, q.key, t.name AS topic, dq.name AS dead_letter_queue, q.reason::text AS reason,
           q.last_error, q.delivery_count, q.reconsume_times, q.redrive_count, q.dead_lettered_at,
           q.first_failure_at, q.last_failure_at, q.published_at, q.origin_message_id, q.content_type,
           q.signature, q.error_class, q.error_frame, q.error_stack,
           substring(q.body FROM 1 FOR %(body_bytes)s) AS body, octet_length(q.body) AS body_size,
           q.properties, q.attempts, {_HALTING}
    FROM {_DLQ_FROM} WHERE q.group_id = %(group_id)s AND q.message_id = %(message_id)s""")
#: A message's redrives in a group, oldest first: (run key, who triggered it, when it moved,
#: where to: the destination topic or NULL for its own topic).
MESSAGE_REDRIVES = _named("MESSAGE_REDRIVES", """
    SELECT r.run_key, r.triggered_by, m.moved_at, r.filter->>'destination_topic' AS destination_topic
    FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
    WHERE m.group_id = %(group_id)s AND m.message_id = %(message_id)s
    ORDER BY m.moved_at, r.id""")
#: Per group with dead letters (one group by name, or all when ``group`` is NULL).
DLQ_SUMMARY_GROUPS = _named("DLQ_SUMMARY_GROUPS", """
    SELECT g.id, g.name, count(*), min(q.dead_lettered_at), max(q.dead_lettered_at)
    FROM dlq_messages q JOIN consumer_groups g ON g.id = q.group_id
    WHERE %(group)s::text IS NULL OR g.name = %(group)s::text
    GROUP BY 1, 2 ORDER BY 3 DESC, 2""")
DLQ_TOP_QUEUES = _named("DLQ_TOP_QUEUES", f"""
    SELECT dq.name, count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(group_id)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")
DLQ_TOP_REASONS = _named("DLQ_TOP_REASONS", f"""
    SELECT q.reason::text, count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(group_id)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")
DLQ_TOP_ERRORS = _named("DLQ_TOP_ERRORS", f"""
    SELECT coalesce(q.last_error, '(none)'), count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(group_id)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")

# ---- redrive --------------------------------------------------------------------------------------

#: Quantile cut points of the message ids a redrive selects (``plan_ranges``).
PLAN_REDRIVE_RANGES = _named("PLAN_REDRIVE_RANGES", f"""
    SELECT min(message_id), max(message_id),
           percentile_disc(%(fractions)s::float8[]) WITHIN GROUP (ORDER BY message_id)
    FROM dlq_messages q WHERE {DLQ_FILTER}""")
#: Start a redrive run, or resume it (same run key): a finished run stays finished, except that a
#: real run after a dry run under the same key moves (once real, a run stays real). A key stands
#: for one selection (``filter`` without ``dry_run``), and a dry run never resumes a real run:
#: otherwise the conflicting row is left as it is and nothing is returned (REDRIVE_RUN_BY_KEY says
#: why), so a refused call changes nothing.
REDRIVE_RUN_START = _named("REDRIVE_RUN_START", """
    INSERT INTO redrive_runs (run_key, triggered_by, group_id, filter, dry_run, standing_id, max_generations)
    VALUES (%(run_key)s, %(triggered_by)s, %(group_id)s, %(filter)s, %(dry_run)s, %(standing_id)s,
            %(max_generations)s)
    ON CONFLICT (run_key) DO UPDATE SET
        status = CASE WHEN redrive_runs.status = 'success' AND (EXCLUDED.dry_run OR NOT redrive_runs.dry_run)
                      THEN 'success' ELSE 'running' END,
        dry_run = redrive_runs.dry_run AND EXCLUDED.dry_run,
        finished_at = CASE WHEN redrive_runs.dry_run AND NOT EXCLUDED.dry_run THEN NULL
                           ELSE redrive_runs.finished_at END
    WHERE redrive_runs.filter - 'dry_run' = EXCLUDED.filter - 'dry_run'
      AND (redrive_runs.dry_run OR NOT EXCLUDED.dry_run)
    RETURNING id, moved, status, dry_run, filter""")
#: A redrive run's audit record by its key (why REDRIVE_RUN_START refused a call; the request a
#: spark-submit job runs; what it did), the columns of REDRIVE_RUN_FINISH.
REDRIVE_RUN_BY_KEY = _named("REDRIVE_RUN_BY_KEY", """
    SELECT run_key, triggered_by, filter, dry_run, status, matched, filter->'max_messages' AS max_messages,
           moved, held_by_backlog_cap, sample, started_at, finished_at
    FROM redrive_runs WHERE run_key = %(run_key)s""")
#: Pace a run's batches (all its Spark tasks included): reserve the next ``seconds`` of the run's
#: schedule; returns how long to wait (seconds, <= 0: go now) before moving the batch.
RESERVE_REDRIVE_SLOT = _named("RESERVE_REDRIVE_SLOT", """
    UPDATE redrive_runs
    SET next_slot_at = greatest(next_slot_at, clock_timestamp())
                       + make_interval(secs => %(seconds)s::float8)
    WHERE id = %(run)s
    RETURNING extract(epoch FROM next_slot_at - make_interval(secs => %(seconds)s::float8)
                                 - clock_timestamp())""")
#: How many selected dead letters come from topic ``dest`` (a redrive "to another topic" may not
#: copy a message into its own topic).
DLQ_COUNT_FROM_TOPIC = _named("DLQ_COUNT_FROM_TOPIC", f"""
    SELECT count(*) FROM dlq_messages q WHERE {DLQ_FILTER} AND q.topic_id = %(dest)s::int""")
#: One batch of a redrive, in one transaction: up to ``batch_size`` selected dead letters (in the id
#: range [low, high) when given; never one this run moved already) leave their DLQ table. To their
#: own topic: each becomes a READY delivery row again, or, of an ordered subscription, BLOCKED behind
#: its key's current head when its key has one (the delivery count and history kept: the
#: count never decreases, old receipts stay stale; ``reset`` restores the retry budget, reconsume
#: times 0; the redrive count goes up), and a message retention dropped from the log goes back into
#: it from the dead letter's copy, with its id and publish time (its partition made before:
#: DEAD_LETTER_LOG_GAPS). To another topic ``dest``: a copy is published there (new ids, under the
#: topic's publish lock, past every offset of its groups), and the dead letter ends (COMMITTED for
#: its group). Every move is audited, with the message's generation (its redrive count once moved),
#: and counted in its standing redrive's total when the run is one. Returns (dead letters removed,
#: moves audited).
REDRIVE_MOVE_BATCH = _named("REDRIVE_MOVE_BATCH", f"""
    WITH picked AS (
      SELECT q.dlq_id, q.group_id, q.message_id FROM dlq_messages q
      WHERE {DLQ_FILTER}
        AND (%(low)s::bigint IS NULL OR (q.message_id >= %(low)s::bigint AND q.message_id < %(high)s::bigint))
        AND NOT EXISTS (SELECT 1 FROM redrive_moves rm WHERE rm.run_id = %(run)s
                        AND rm.group_id = q.group_id AND rm.message_id = q.message_id)
        -- only the dead letters that hold their key (a HALTED head), the ones a backlog cap never
        -- holds back: the messages waiting for them are what fills it
        AND (NOT %(holding_only)s::bool OR {_HOLDS_ITS_KEY})
      ORDER BY q.message_id LIMIT %(batch_size)s FOR UPDATE SKIP LOCKED),
    -- by their primary key, the picked ids as arrays (not a join the planner may make a scan of the
    -- whole DLQ table): a group has one dead letter of a message, in one DLQ
    removed AS (
      DELETE FROM dlq_messages q
      WHERE q.dlq_id = ANY(ARRAY(SELECT dlq_id FROM picked)) AND q.group_id = %(group_id)s
        AND q.message_id = ANY(ARRAY(SELECT message_id FROM picked))
      RETURNING q.*),
    logged_again AS (
      INSERT INTO messages (topic_id, id, key, body, content_type, properties, origin_message_id,
                            published_at)
      SELECT r.topic_id, r.message_id, r.key, r.body, r.content_type, r.properties,
             nullif(r.origin_message_id, r.message_id), r.published_at
      FROM removed r
      WHERE %(dest)s::int IS NULL
      -- another group's redrive put it back (or is putting it back: this waits for its commit)
      ON CONFLICT DO NOTHING),
    -- an ordered subscription's revived message carries its ordering key (RECEIVE_ORDERED); its
    -- key is held when it has a head (locked FOR KEY SHARE, as RECEIVE_ORDERED does: _HELD)
    revived_keys AS (
      SELECT r.topic_id, r.message_id, CASE WHEN s.ordered THEN {_ORDERING_KEY_OF.format("r")} END AS key
      FROM removed r LEFT JOIN subscriptions s ON s.topic_id = r.topic_id AND s.group_id = r.group_id
      WHERE %(dest)s::int IS NULL),
    held AS (
      SELECT k.topic_id, k.key FROM (SELECT DISTINCT topic_id, key FROM revived_keys WHERE key IS NOT NULL) k
      WHERE {_HELD.format("k.topic_id", "%(group_id)s", "k.key")}),
    heads AS (
      SELECT k.topic_id, min(k.message_id) AS message_id FROM revived_keys k
      WHERE k.key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM held h WHERE h.topic_id = k.topic_id
                                                AND h.key = k.key)
      GROUP BY k.topic_id, k.key),
    -- to its own topic: READY, or BLOCKED behind its key's head (the first of a free key in the
    -- batch is the head); a HALTED head revived is READY again, in its own row
    revived AS (
      INSERT INTO deliveries AS d (topic_id, group_id, message_id, published_at, key, state, delivery_count,
                              reconsume_times, redrive_count, first_failure_at, last_failure_at, last_error,
                              attempts, ready_at)
      SELECT r.topic_id, r.group_id, r.message_id, r.published_at, k.key,
             CASE WHEN k.key IS NULL OR EXISTS (SELECT 1 FROM heads h WHERE h.topic_id = r.topic_id
                                                  AND h.message_id = r.message_id)
                  THEN 'READY' ELSE 'BLOCKED' END::delivery_state,
             r.delivery_count, CASE WHEN %(reset)s THEN 0 ELSE r.reconsume_times END, r.redrive_count + 1,
             r.first_failure_at, r.last_failure_at, r.last_error, r.attempts, now()
      FROM removed r JOIN revived_keys k ON k.topic_id = r.topic_id AND k.message_id = r.message_id
      ON CONFLICT (topic_id, group_id, message_id) DO UPDATE SET state = 'READY',
          delivery_count = EXCLUDED.delivery_count, reconsume_times = EXCLUDED.reconsume_times,
          redrive_count = EXCLUDED.redrive_count, first_failure_at = EXCLUDED.first_failure_at,
          last_failure_at = EXCLUDED.last_failure_at, last_error = EXCLUDED.last_error,
          attempts = EXCLUDED.attempts, ready_at = now(), updated_at = now()
      WHERE d.state = 'HALTED'),
    -- to another topic: the dead letter ends, and a HALTED head with it (its key is released:
    -- finish_ordered_heads promotes the next message)
    released AS (
      DELETE FROM deliveries d
      WHERE %(dest)s::int IS NOT NULL AND d.group_id = %(group_id)s AND d.state = 'HALTED'
        AND d.topic_id = ANY(ARRAY(SELECT topic_id FROM removed))
        AND d.message_id = ANY(ARRAY(SELECT message_id FROM removed))),
    copies AS (
      INSERT INTO messages (topic_id, id, key, body, content_type, properties, origin_message_id)
      SELECT %(dest)s::int, nextval('message_ids'), r.key, r.body, r.content_type, r.properties,
             r.origin_message_id
      FROM removed r WHERE %(dest)s::int IS NOT NULL ORDER BY r.message_id),
    logged AS (
      INSERT INTO redrive_moves (run_id, group_id, message_id, generation, topic_id)
      SELECT %(run)s, group_id, message_id, redrive_count + 1, topic_id FROM removed RETURNING 1),
    counted AS (
      UPDATE redrive_runs SET moved = moved + (SELECT count(*) FROM logged) WHERE id = %(run)s
      RETURNING standing_id),
    -- a standing redrive's total (redelivery_auto_redriven_total), in the moves' transaction
    standing_total AS (
      UPDATE standing_redrives SET brought_back = brought_back + (SELECT count(*) FROM logged)
      WHERE id = (SELECT standing_id FROM counted) AND EXISTS (SELECT 1 FROM logged)),
    -- the group's redriven total: its new value reads all of removed, so the row is locked last
    totals AS (
      UPDATE consumer_groups SET redriven = redriven + (SELECT count(*) FROM removed)
      WHERE id = %(group_id)s AND EXISTS (SELECT 1 FROM removed))
    SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM logged) FROM counted""")
#: The partitions of the log that moving the selected dead letters back to their topic needs and
#: that no longer exist: the start of each span (``span`` seconds, aligned on the epoch) holding the
#: publish time of a selected dead letter that no partition holds.
DEAD_LETTER_LOG_GAPS = _named("DEAD_LETTER_LOG_GAPS", f"""
    SELECT DISTINCT date_bin(make_interval(secs => %(span)s::float8), q.published_at, 'epoch'::timestamptz)
    FROM dlq_messages q
    WHERE {DLQ_FILTER} AND NOT EXISTS (
      SELECT 1 FROM log_partitions l
      WHERE coalesce(l.starts_at, '-infinity') <= q.published_at AND l.ends_at > q.published_at)
    ORDER BY 1""")
#: A redrive batch of a group locks its ordered subscriptions' rows first (in topic order), as their
#: receives do (LOCK_ORDERED_SUBSCRIPTION): the batch's statement then sees every delivery row they
#: committed.
LOCK_ORDERED_SUBSCRIPTIONS = _named("LOCK_ORDERED_SUBSCRIPTIONS", """
    SELECT 1 FROM subscriptions WHERE group_id = %(group_id)s AND ordered ORDER BY topic_id FOR UPDATE""")
#: A redrive batch holds the topics it revives dead letters of FOR KEY SHARE (``topic_ids``, in
#: id order): no topic is deleted under it.
LOCK_TOPICS_SHARED = _named("LOCK_TOPICS_SHARED", """
    SELECT id FROM topics WHERE id = ANY(%(topic_ids)s::int[]) ORDER BY id FOR KEY SHARE""")
#: Close a redrive run: ``status`` and, when given, ``matched``, ``held_by_backlog_cap`` and ``sample``.
REDRIVE_RUN_FINISH = _named("REDRIVE_RUN_FINISH", """
    UPDATE redrive_runs SET status = %(status)s, finished_at = now(),
        matched = coalesce(%(matched)s::bigint, matched),
        held_by_backlog_cap = coalesce(%(held_by_backlog_cap)s::bigint, held_by_backlog_cap),
        sample = coalesce(%(sample)s::jsonb, sample)
    WHERE id = %(run)s
    RETURNING run_key, triggered_by, filter, dry_run, status, matched, filter->'max_messages' AS max_messages,
              moved, held_by_backlog_cap, sample, started_at, finished_at""")
LATEST_REDRIVES = _named("LATEST_REDRIVES", """
    SELECT r.run_key, g.name, r.triggered_by, r.dry_run, r.status, r.matched,
           (r.filter->>'max_messages')::bigint, r.moved, r.held_by_backlog_cap, r.started_at
    FROM redrive_runs r JOIN consumer_groups g ON g.id = r.group_id ORDER BY r.id DESC LIMIT 10""")
# fmt: on
