"""Pieces the statements share: the policy table, the receipt list, the dead-letter copy,
the dead-letter filter. Put together once, when the statements load."""

from __future__ import annotations

from textwrap import dedent
from typing import NamedTuple

from redelivery.rules.failures import LEASE_EXPIRED_CLASS


def _named(name: str, text: str) -> str:
    """``text`` dedented, after the comment ``/* redelivery:NAME */`` that finds it in
    pg_stat_activity and the server log."""
    return f"/* redelivery:{name} */\n" + dedent(text).strip()


# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- shared pieces --------------------------------------------------------------------------------

#: The time of a client call: the caller's ``at`` or the database clock.
AT = "coalesce(%(at)s::timestamptz, now())"

#: A subscription's waiter lock (``WAITER_PRESENT``, migration 0023): the two-int advisory key
#: (minus the topic id, the group id); its topic's waiter lock: (minus the topic id, 0). A waiting
#: consumer holds both, shared. redelivery's other two-int locks have positive namespaces.
_WAITER_KEY = "-%(topic_id)s::int, %(group_id)s::int"
_TOPIC_WAITER_KEY = "-%(topic_id)s::int, 0"
#: Whether a consumer waits on a subscription of topic ``topic_id``: the topic's waiter lock,
#: tried exclusively, is refused while one holds it shared. One lookup in the lock table, not a
#: read of ``pg_locks``: nobody waiting costs a publish nothing more. Granted, it is released at
#: once (CASE evaluates in order), never held until the commit: a publish inside the caller's long
#: transaction would have kept every consumer that began to wait on the topic waiting for its share.
_TOPIC_WAITED = (
    f"CASE WHEN pg_try_advisory_lock({_TOPIC_WAITER_KEY})"
    f" THEN NOT pg_advisory_unlock({_TOPIC_WAITER_KEY}) ELSE true END"
)

#: The policy of each subscription, one row each, from the parameters ``catalog.policy_table``
#: builds: waits (seconds) and routing levels of retries 1..K as array literals, the Artemis
#: collision-avoidance factor, max reconsume times (-1 unlimited), the DLQ and the ready-backlog cap.
#: With each, its breaker (issue 41): ``rule``, which failures count (``rules.breaker.counting_rule``),
#: and ``open_until``, read from its ``breakers`` row (NULL: closed; a time past: half-open). A
#: statement that may spend an attempt runs after BREAKERS_SHARE locked the rows of the subscriptions
#: with a breaker: no opening commits between this read and the statement's commit.
POLICIES_CTE = """policies AS MATERIALIZED (
    SELECT p.topic_id, p.group_id, p.max_times, p.delays::float8[] AS delays, p.levels::int[] AS levels,
           p.jitter, p.dlq_id, p.cap, p.rule::jsonb AS rule,
           (SELECT b.open_until FROM breakers b WHERE b.topic_id = p.topic_id AND b.group_id = p.group_id)
               AS open_until
    FROM unnest(%(p_topic)s::int[], %(p_group)s::int[], %(p_max)s::int[], %(p_delays)s::text[],
                %(p_levels)s::text[], %(p_jitter)s::float8[], %(p_dlq)s::int[], %(p_cap)s::int[],
                %(p_rule)s::text[])
        AS p(topic_id, group_id, max_times, delays, levels, jitter, dlq_id, cap, rule))"""
POLICY_JOIN = "p.topic_id = d.topic_id AND p.group_id = d.group_id"
CAN_RETRY = "(p.max_times = -1 OR d.reconsume_times < p.max_times)"
# Retry n = d.reconsume_times + 1: its routing level, and its wait in seconds with Artemis collision
# avoidance, wait + wait * factor * U[0,1) with a random sign (Artemis, "Message redelivery and
# undelivered messages"), at most 864000 s (levels.MAX_DELAY_SECONDS;
# policies.EffectivePolicy.delay cuts it the same way).
NEXT_LEVEL = "p.levels[least(d.reconsume_times + 1, cardinality(p.levels))]"
NEXT_DELAY = """least(p.delays[least(d.reconsume_times + 1, cardinality(p.delays))]
                 * (1 + p.jitter * (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END) * random()), 864000)"""

# Answers find their rows through the primary key (topic, group, message). Written as a text
# comparison so that the planner cannot use the partial index of leases instead: that index keeps
# an entry for every row that was ever in flight until VACUUM, and scanning it whole made each
# answer slower than the last.
_IS_INFLIGHT = "d.state::text = 'INFLIGHT'"
#: The receipts of a call are a lookup, not a relation (``receipts.receipt_lookup``): a JSON object
#: ``{"<message id>": ["<delivery count>:<topic id>", ...]}``, and ``errors`` ``{"<message id>":
#: error text or null}``. A statement finds its rows by their primary key (the ids as an array, an
#: index condition) and checks each against its receipts by its message id (a binary search in
#: the object, then the exact string among the message's receipts: ``?`` compares whole strings,
#: where ``@>`` on arrays of numbers would compare them as sets): there is no join of the receipts
#: for the planner to turn into a nested loop that reads every receipt for every row, which it
#: chose when the statistics of ``deliveries`` said it was empty (quadratic in the batch: 249,500
#: rows filtered for 500 receipts; issue 29).
_ANSWERS_RECEIPT = """(%(receipts)s::jsonb -> d.message_id::text)
                       ? (d.delivery_count::text || ':' || d.topic_id::text)"""
#: A failure as SQL expressions (``rules.failures.Failure``): its text, class, top frame and stack;
#: its signature is PostgreSQL's ``error_signature`` of the first three (migration 0020).
class FailureSql(NamedTuple):
    error: str
    error_class: str = "NULL::text"
    frame: str = "NULL::text"
    stack: str = "NULL::text"

    @property
    def signature(self) -> str:
        return f"error_signature({self.error_class}, {self.error}, {self.frame})"


def _receipt_part(key: str) -> str:
    return f"(%(errors)s::jsonb -> d.message_id::text ->> '{key}')"


#: The failure a call gives a delivery row's message (``errors``: ``{"<message id>": {"error",
#: "class", "frame", "stack"} or null}``, ``receipts.error_lookup``).
_RECEIPT_FAILURE = FailureSql(*(_receipt_part(k) for k in ("error", "class", "frame", "stack")))
#: The failure recorded last in a delivery row's history (``attempts``) with its ``last_error``.
_LAST_FAILURE = FailureSql(
    "d.last_error",
    # a history from before migration 0020 has no class: an ended lease's is still known
    "coalesce(d.attempts -> -1 ->> 'class', system_error_class(NULL, d.attempts))",
    *(f"(d.attempts -> -1 ->> '{k}')" for k in ("frame", "stack")),
)


def counted(rule: str, failure: FailureSql) -> str:
    """Whether ``failure`` counts for a breaker whose rule (jsonb, ``counting_rule``) is ``rule``:
    when the rule includes some, its class or signature is one of them; and neither is excluded
    (``rules.breaker.counts`` says the same in Python)."""
    names = f"ARRAY[{failure.error_class}, {failure.signature}]"
    return f"""(coalesce(NOT ({rule} ? 'include')
                       OR ({rule} -> 'include') ?| array_remove({names}, NULL), true)
              AND NOT coalesce(({rule} -> 'exclude') ?| array_remove({names}, NULL), false))"""


def parked(failure: FailureSql) -> str:
    """A failure whose delivery is parked rather than retried or dead-lettered, when it counts: its
    subscription's breaker is open now (``p.open_until`` past now(); held: infinity), or half-open
    (``p.open_until`` passed) and it has no retry left: a probe spends an attempt but never makes
    a dead letter of a failure the breaker counts."""
    return f"""(p.open_until IS NOT NULL AND (p.open_until > now() OR NOT {CAN_RETRY})
             AND {counted('p.rule', failure)})"""


#: The delivery rows the receipts of a call on one topic (``topic_id``) answer, with their policy.
_RECEIPT_MATCHES = f"""d.topic_id = %(topic_id)s AND d.group_id = %(group_id)s
                      AND d.message_id = ANY(%(ids)s::bigint[]) AND {_IS_INFLIGHT} AND {_ANSWERS_RECEIPT}
                      AND {POLICY_JOIN}"""


def _attempt(at: str, outcome: str, failure: FailureSql) -> str:
    """Appends one failed delivery to ``d.attempts``: its time, delivery count, outcome, error text
    and, when known, class, frame and stack, and its signature (the last 20 are kept, the newest
    one's stack only: ``append_attempt``); and when the statement recorded it (``recorded``, the
    clock, after the locks the transaction took first: what the crash suite compares with a
    breaker's transitions)."""
    parts = f"'class', {failure.error_class}, 'frame', {failure.frame}, 'stack', {failure.stack}"
    return (f"append_attempt(d.attempts, jsonb_build_object('at', {at}, 'delivery', d.delivery_count, "
            f"'outcome', {outcome}, 'error', {failure.error}, 'signature', {failure.signature}, "
            f"'recorded', clock_timestamp()) || jsonb_strip_nulls(jsonb_build_object({parts})))")


def _moved(failed_at: str, failure: FailureSql, attempts: str) -> str:
    """What a DELETE of delivery rows that dead-letters returns, for _DLQ_COPY (the CTE must be
    called "moved"): the failure that ends the delivery (at ``failed_at``, ``failure``, the history
    ``attempts``) goes into the dead letter, not into the row, which is gone."""
    return f"""RETURNING d.message_id, d.group_id, d.topic_id, d.published_at, p.dlq_id, d.delivery_count,
              d.reconsume_times, coalesce(d.first_failure_at, {failed_at}) AS first_failure_at,
              {failed_at} AS last_failure_at, {failure.error} AS last_error,
              {failure.error_class} AS error_class, {failure.frame} AS error_frame,
              {failure.stack} AS error_stack, {attempts} AS attempts, d.redrive_count"""


# Copies the rows of the CTE "moved" into dlq_messages with their message from the log, inside the
# database (payloads never leave it); the statement returns (group_id, reason, count). A message
# missing from the log leaves the body NULL, which the DLQ table refuses: the transaction fails
# instead of losing the dead letter. _DLQ_INSERT is the CTE alone, for a statement of other returns.
_DLQ_INSERT = """inserted AS (
    INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,
                              content_type, properties, published_at, reason, last_error, delivery_count,
                              reconsume_times, first_failure_at, last_failure_at, dead_lettered_at, attempts,
                              redrive_count, error_class, error_frame, error_stack, signature)
    SELECT mv.dlq_id, mv.group_id, mv.message_id, mv.topic_id, coalesce(m.origin_message_id, mv.message_id),
           m.key, m.body, m.content_type, m.properties, mv.published_at, %(reason)s::dlq_reason,
           mv.last_error,
           mv.delivery_count, mv.reconsume_times, mv.first_failure_at, mv.last_failure_at,
           coalesce(%(dead_lettered_at)s::timestamptz, now()), mv.attempts, mv.redrive_count,
           mv.error_class, mv.error_frame, mv.error_stack,
           error_signature(mv.error_class, mv.last_error, mv.error_frame)
    FROM moved mv LEFT JOIN messages m
      ON m.topic_id = mv.topic_id AND m.id = mv.message_id AND m.published_at = mv.published_at
    RETURNING group_id, reason, message_id)"""
_DLQ_COPY = _DLQ_INSERT + """
SELECT group_id, reason::text, count(*) FROM inserted GROUP BY 1, 2"""

#: A tier window's candidates: due retries of its levels, and leases ended by the window end.
_DUE = """d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[])
          AND d.due_at <= %(window_end)s"""
_EXPIRED = "d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s"
_IN_RANGE = f"d.message_id >= %(low)s AND d.message_id < %(high)s AND {POLICY_JOIN}"
#: An ended lease's failure (``LEASE_EXPIRED_CLASS``: no consumer raised it).
_LEASE_FAILURE = FailureSql("%(lease_error)s::text", f"'{LEASE_EXPIRED_CLASS}'::text")
_LEASE_FAILED = _attempt("d.invisible_until", "'lease_expired'", _LEASE_FAILURE)
#: Adds one batch of observations to a tier's cumulative histogram ``metric`` (table tier_histograms):
#: ``bucket_counts`` per bucket of ``bucket_bounds`` (seconds; the last count: above every bound),
#: ``observed_sum`` their sum in seconds; ``rows`` selects the tier from the CTE "finished". Other
#: bounds than the stored ones restart the histogram (Prometheus sees a counter reset).
_HISTOGRAM_ADD = """INSERT INTO tier_histograms AS h (tier, metric, bounds, counts, sum)
    SELECT tier, '{metric}', %(bucket_bounds)s::float8[], %(bucket_counts)s::bigint[],
           %(observed_sum)s::float8
    {rows}
    ON CONFLICT (tier, metric) DO UPDATE SET
        counts = CASE WHEN h.bounds = EXCLUDED.bounds
                      THEN ARRAY(SELECT a + b FROM unnest(h.counts, EXCLUDED.counts)
                                                   WITH ORDINALITY AS u(a, b, i) ORDER BY i)
                      ELSE EXCLUDED.counts END,
        sum = CASE WHEN h.bounds = EXCLUDED.bounds THEN h.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
        bounds = EXCLUDED.bounds, updated_at = now()"""
# The bucket of the tier's lateness histogram (``lateness_le``, bounds in seconds, ascending): the
# index of the first bound at least ``lateness`` (= how many bounds are below it), cardinality when
# none is. width_bucket counts thresholds <= its operand; on negated bounds, the bounds >= lateness.
_LATENESS_BUCKET = """cardinality(%(lateness_le)s::float8[]) - width_bucket(-lateness,
           (SELECT array_agg(-b ORDER BY -b) FROM unnest(%(lateness_le)s::float8[]) AS b))"""
# Promoted rows per (group, level, lateness bucket, histogram bucket): lateness = window end - due
# time, seconds; with its largest value and sum.
# The topic is returned too: a tier run emits an asset event per subscription with promotions.
_PROMOTED_COUNTS = f"""RETURNING d.group_id, d.delay_level, d.topic_id,
                            extract(epoch FROM %(window_end)s - d.due_at)::float8 AS lateness)
SELECT group_id, delay_level, floor(lateness * 1000 / %(bucket_ms)s)::int, count(*), max(lateness), topic_id,
       sum(lateness), {_LATENESS_BUCKET}
FROM promoted GROUP BY 1, 2, 3, 6, 8"""

#: The longest key (bytes) in the dead letters' key index (migration 0016's ``dlq_messages_short_key``,
#: partial: a btree entry holds 2,704 bytes). A filter by a key this short says so, for the planner
#: to use the index; a longer key is found among the group's rows.
SHORT_KEY_BYTES = 2000
#: A dead-letter filter of values (never SQL): every condition is a parameter, NULL = no condition;
#: text matches with strpos, so '%' and '_' are plain characters.
DLQ_FILTER = f"""q.group_id = %(group_id)s
    AND (%(topic_id)s::int IS NULL OR q.topic_id = %(topic_id)s::int)
    AND (%(dead_lettered_from)s::timestamptz IS NULL
         OR q.dead_lettered_at >= %(dead_lettered_from)s::timestamptz)
    AND (%(dead_lettered_to)s::timestamptz IS NULL OR q.dead_lettered_at < %(dead_lettered_to)s::timestamptz)
    AND (%(reasons)s::text[] IS NULL OR q.reason::text = ANY(%(reasons)s::text[]))
    AND (%(signature)s::text IS NULL OR q.signature = %(signature)s::text)
    AND (%(error_contains)s::text IS NULL
         OR strpos(lower(coalesce(q.last_error, '')), lower(%(error_contains)s::text)) > 0)
    AND (%(message_ids)s::bigint[] IS NULL OR q.message_id = ANY(%(message_ids)s::bigint[]))
    AND (%(key)s::text IS NULL
         OR (q.key = %(key)s::text AND (octet_length(%(key)s::text) > {SHORT_KEY_BYTES}
                                        OR octet_length(q.key) <= {SHORT_KEY_BYTES})))
    -- a standing redrive's: below its generation limit, and dead long enough for the generation
    -- (rules.standing.generation_wait_seconds), compared in seconds (an interval of 2^n waits
    -- would pass the range of a timestamp)
    AND (%(max_generations)s::int IS NULL
         OR (q.redrive_count < %(max_generations)s::int
             AND extract(epoch FROM now() - q.dead_lettered_at)
                 >= %(generation_wait)s::float8 * power(2::float8, least(q.redrive_count, 1000))))"""
_DLQ_FROM = "dlq_messages q JOIN topics t ON t.id = q.topic_id JOIN dead_letter_queues dq ON dq.id = q.dlq_id"
# fmt: on
