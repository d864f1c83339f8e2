"""Standing redrive policies (issue 41): the policies, a tick's claim of one, the share of what it
brought back that died again, and its run's end. A run itself is a redrive run
(``REDRIVE_RUN_START`` with its ``standing_id``, then ``REDRIVE_MOVE_BATCH``, which counts its
moves in ``standing_redrives.brought_back``)."""

from __future__ import annotations

from redelivery.store.statements._shared import _named

# The statements keep the layout of SQL, not of Python.
# fmt: off

_STANDING_COLUMNS = """p.name, g.name AS "group", p.source, p.spec, p.state, p.stopped_reason, p.changed_at,
           p.changed_by, p.last_run_at, p.runs, p.brought_back, p.more_left,
           EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND l.classid = %(namespace)s::int AND l.objid = p.id AND l.objsubid = 2) AS running"""
#: The config file's policies (``names``, ``group_ids``, ``specs``, one per index), written over
#: those of the config file; a name an operator's policy holds is left to it (returned: not
#: written). A policy whose selection (group, topic, reasons, error text, signature) changed counts
#: what died again from now on.
STANDING_SYNC_CONFIG = _named("STANDING_SYNC_CONFIG", """
    WITH written AS (
      INSERT INTO standing_redrives AS p (name, group_id, source, spec, changed_by)
      SELECT n, g, 'config', s, 'config'
      FROM unnest(%(names)s::text[], %(group_ids)s::int[], %(specs)s::jsonb[]) AS c(n, g, s)
      ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, group_id = EXCLUDED.group_id,
          changed_at = now(),
          counting_since = CASE
            WHEN p.group_id <> EXCLUDED.group_id
              OR jsonb_build_array(p.spec->'topic', p.spec->'reasons', p.spec->'error_contains',
                                   p.spec->'signature')
                 <> jsonb_build_array(EXCLUDED.spec->'topic', EXCLUDED.spec->'reasons',
                                      EXCLUDED.spec->'error_contains', EXCLUDED.spec->'signature')
            THEN now() ELSE p.counting_since END
      WHERE p.source = 'config' AND (p.spec <> EXCLUDED.spec OR p.group_id <> EXCLUDED.group_id)
      RETURNING name)
    SELECT p.name FROM standing_redrives p
    WHERE p.name = ANY(%(names)s::text[]) AND p.source = 'operator'""")
#: The config file's policies that it no longer lists (their runs stay, without their policy).
STANDING_FORGET_CONFIG = _named("STANDING_FORGET_CONFIG", """
    DELETE FROM standing_redrives WHERE source = 'config' AND name <> ALL(%(names)s::text[])
    RETURNING name""")
#: An operator's new policy; nothing when the name is taken.
STANDING_ADD = _named("STANDING_ADD", """
    INSERT INTO standing_redrives (name, group_id, source, spec, changed_by)
    VALUES (%(name)s, %(group_id)s, 'operator', %(spec)s, %(changed_by)s)
    ON CONFLICT (name) DO NOTHING RETURNING id""")
#: An operator's policy removed (a config file's is removed from the file).
STANDING_REMOVE = _named("STANDING_REMOVE", """
    DELETE FROM standing_redrives WHERE name = %(name)s AND source = 'operator' RETURNING id""")
#: Stop (``reason`` given) or resume (``reason`` NULL: what died again counts from now on, and the
#: next tick looks at once) a policy; returns the state it had, nothing when there is no such policy.
STANDING_SET_STATE = _named("STANDING_SET_STATE", """
    UPDATE standing_redrives p
    SET state = CASE WHEN %(reason)s::text IS NULL THEN 'active' ELSE 'stopped' END,
        stopped_reason = %(reason)s::text, changed_at = now(), changed_by = %(changed_by)s,
        counting_since = CASE WHEN %(reason)s::text IS NULL AND p.state = 'stopped' THEN now()
                              ELSE p.counting_since END,
        more_left = %(reason)s::text IS NULL AND (p.spec->>'after' = 'every' OR p.trigger_at IS NOT NULL)
    FROM standing_redrives old WHERE old.id = p.id AND p.name = %(name)s
    RETURNING old.state""")
#: Every policy (``name`` NULL) or one, by name.
STANDING_LIST = _named("STANDING_LIST", f"""
    SELECT p.id, {_STANDING_COLUMNS}
    FROM standing_redrives p JOIN consumer_groups g ON g.id = p.group_id
    WHERE %(name)s::text IS NULL OR p.name = %(name)s::text ORDER BY p.name""")
#: A tick's hold on policy ``id`` (``namespace``: ``standing.STANDING_LOCK``), a session advisory
#: lock: two ticks never run a policy at once, and one that dies frees it with its connection.
#: True when taken.
STANDING_TRY_HOLD = _named("STANDING_TRY_HOLD", """
    SELECT pg_try_advisory_lock(%(namespace)s::int, %(id)s::int)""")
#: The hold let go.
STANDING_LET_GO = _named("STANDING_LET_GO", """
    SELECT pg_advisory_unlock(%(namespace)s::int, %(id)s::int)""")
_NO_BREAKER_OPEN = """NOT EXISTS (
        SELECT 1 FROM breakers b JOIN topics t ON t.id = b.topic_id
        WHERE b.group_id = p.group_id AND b.state <> 'closed'
          AND (p.spec->>'topic' IS NULL OR t.name = p.spec->>'topic'))"""
#: A tick's claim of policy ``id`` (held: STANDING_TRY_HOLD) when it is due: active, no breaker of
#: its group (of its topic, when it names one) other than closed, and either its last run left some
#: behind (or did not finish), or ``every`` seconds passed since its last run (``after: every``),
#: or a breaker of its group closed after the last close it saw (``after: breaker_closed``;
#: ``trigger_at`` keeps the latest close seen: one that commits late, after a claim, is seen by the
#: next; ``trigger_from`` the close it saw before, or the policy's creation: the outage's dead
#: letters are those between them). Marks it as having more left until its run says otherwise, so
#: that a tick that dies leaves it to the next. Returns ``trigger_at``, ``trigger_from``.
STANDING_CLAIM = _named("STANDING_CLAIM", f"""
    WITH closed AS (
      SELECT max(x.at) AS at
      FROM standing_redrives p0 JOIN breaker_transitions x ON x.group_id = p0.group_id
      JOIN topics t ON t.id = x.topic_id
      WHERE p0.id = %(id)s AND x.to_state = 'closed' AND x.at > coalesce(p0.trigger_at, p0.created_at)
        AND (p0.spec->>'topic' IS NULL OR t.name = p0.spec->>'topic'))
    UPDATE standing_redrives p SET more_left = true, last_run_at = now(),
        trigger_at = coalesce((SELECT at FROM closed), p.trigger_at),
        trigger_from = CASE WHEN (SELECT at FROM closed) IS NULL THEN p.trigger_from
                            ELSE coalesce(p.trigger_at, p.created_at) END
    WHERE p.id = %(id)s AND p.state = 'active' AND {_NO_BREAKER_OPEN}
      AND (p.more_left
           OR (p.spec->>'after' = 'every'
               AND (p.last_run_at IS NULL
                    OR p.last_run_at <= now() - make_interval(secs => %(every)s::float8)))
           OR (p.spec->>'after' = 'breaker_closed' AND (SELECT at FROM closed) IS NOT NULL))
    RETURNING p.trigger_at, p.trigger_from""")
#: Whether a claimed policy's run goes on (asked between its batches): still active, and no breaker
#: of its group other than closed.
STANDING_STILL_WANTED = _named("STANDING_STILL_WANTED", f"""
    SELECT p.state = 'active' AND {_NO_BREAKER_OPEN} FROM standing_redrives p WHERE p.id = %(id)s""")
#: The runs of policy ``id`` left running by a tick that died (its hold held: no other runs it),
#: ended as failed.
STANDING_END_ORPHANS = _named("STANDING_END_ORPHANS", """
    UPDATE redrive_runs SET status = 'failed', finished_at = now()
    WHERE standing_id = %(id)s AND status = 'running'""")
#: The end of a claim (still held): whether matching dead letters are left for the next tick, and
#: whether it ran a redrive run (``ran``).
STANDING_RELEASE = _named("STANDING_RELEASE", """
    UPDATE standing_redrives SET more_left = %(more_left)s AND state = 'active',
        runs = runs + CASE WHEN %(ran)s THEN 1 ELSE 0 END
    WHERE id = %(id)s""")
#: Of the messages policy ``id`` brought back (its last ``limit`` moves since it counts,
#: ``counting_since``; a message's latest move), those settled: (dead again, settled). Dead again: a
#: dead letter now; settled: that, or ended (no delivery row, no dead letter: acked). A message still
#: retrying is neither: it may yet die.
STANDING_DIED_AGAIN = _named("STANDING_DIED_AGAIN", """
    SELECT count(*) FILTER (WHERE x.dead), count(*) FILTER (WHERE x.dead OR NOT x.live)
    FROM (SELECT DISTINCT ON (m.group_id, m.message_id) m.group_id, m.message_id, m.topic_id
          FROM (SELECT m.group_id, m.message_id, m.topic_id, m.moved_at
                FROM redrive_runs r JOIN redrive_moves m ON m.run_id = r.id
                JOIN standing_redrives p ON p.id = r.standing_id
                WHERE r.standing_id = %(id)s AND m.moved_at >= p.counting_since
                ORDER BY r.id DESC LIMIT %(limit)s) m
          ORDER BY m.group_id, m.message_id, m.moved_at DESC) m,
    LATERAL (SELECT EXISTS (SELECT 1 FROM dlq_messages q
                            WHERE q.message_id = m.message_id AND q.group_id = m.group_id) AS dead,
                    EXISTS (SELECT 1 FROM deliveries d
                            WHERE d.topic_id = m.topic_id AND d.group_id = m.group_id
                              AND d.message_id = m.message_id) AS live) x""")
#: The figures of every standing redrive for the metrics: group, name, state, brought back.
METRICS_STANDING = _named("METRICS_STANDING", """
    SELECT g.name, p.name, p.state, p.brought_back
    FROM standing_redrives p JOIN consumer_groups g ON g.id = p.group_id ORDER BY g.name, p.name""")
# fmt: on
