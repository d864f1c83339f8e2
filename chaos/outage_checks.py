"""The crash suite's checks of issue 41's promises, in SQL (``invariants.CHECKS``): no attempt spent
while a group's breaker is open, and no message brought back by a standing redrive more often than its
generation limit."""

# a breaker is open from the audit's time of its opening (taken after the answers that held
# its row shared committed) until its open time ends or its next transition: a failure that
# spent an attempt (a history entry's outcome nack, reconsume_later or lease_expired; a reject
# is a verdict, not an attempt) recorded by its statement's clock in that span is a violation
OPEN_BREAKER_SQL = """
        WITH t AS (
          SELECT topic_id, group_id, to_state, at, open_until,
                 lead(at) OVER (PARTITION BY topic_id, group_id ORDER BY id) AS next_at
          FROM breaker_transitions),
        opened AS (
          SELECT topic_id, group_id, at AS since,
                 least(coalesce(open_until, 'infinity'), coalesce(next_at, 'infinity')) AS until
          FROM t WHERE to_state IN ('open', 'held')),
        entries AS (
          SELECT d.topic_id, d.group_id, d.message_id, e
          FROM deliveries d, jsonb_array_elements(d.attempts) e
          UNION ALL
          SELECT q.topic_id, q.group_id, q.message_id, e
          FROM dlq_messages q, jsonb_array_elements(q.attempts) e)
        SELECT x.message_id, x.group_id, x.e ->> 'outcome', x.e ->> 'recorded', o.since::text, o.until::text
        FROM entries x JOIN opened o ON o.topic_id = x.topic_id AND o.group_id = x.group_id
         AND (x.e ->> 'recorded')::timestamptz >= o.since AND (x.e ->> 'recorded')::timestamptz < o.until
        WHERE x.e ->> 'outcome' IN ('nack', 'reconsume_later', 'lease_expired')"""
# each move of a standing redrive's run records the message's generation (its redrive count once
# moved): none past the run's limit (its policy's max_generations when it ran), and no message
# moved by one policy's runs more often than that
GENERATIONS_SQL = """
        SELECT r.run_key, m.message_id, m.generation, r.max_generations
        FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
        WHERE r.max_generations IS NOT NULL AND (m.generation IS NULL OR m.generation > r.max_generations)
        UNION ALL
        SELECT r.standing_id::text, m.message_id, count(*), max(r.max_generations)
        FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
        WHERE r.standing_id IS NOT NULL
        GROUP BY r.standing_id, m.group_id, m.message_id
        HAVING count(*) > max(r.max_generations)"""
