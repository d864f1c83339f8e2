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
           EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.classid = %(namespace)s::int
                     AND l.objid = p.id AND l.objsubid = 2) AS running"""
#: The config file's policies (``names``, ``group_ids``, ``specs``, one per index), written over
#: those of the config file; a name an operator's policy holds is left to it (returned: not
#: written). A policy whose spec or group changed counts what died again from now on.
STANDING_SYNC_CONFIG = _named("STANDING_SYNC_CONFIG", """
    WITH written AS (
      INSERT INTO standing_redrives AS p (name, group_id, source, spec, changed_by)
      SELECT n, g, 'config', s, 'config'
      FROM unnest(%(names)s::text[], %(group_ids)s::int[], %(specs)s::jsonb[]) AS c(n, g, s)
      ON CONFLICT (name) DO UPDATE SET spec = EXCLUDED.spec, group_id = EXCLUDED.group_id,
          changed_at = now(), counting_since = now()
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
#: Stop (``reason`` given) or resume (``reason`` NULL: what died again counts from now on) a
#: policy; returns the state it had, nothing when there is no such policy.
STANDING_SET_STATE = _named("STANDING_SET_STATE", """
    UPDATE standing_redrives p
    SET state = CASE WHEN %(reason)s::text IS NULL THEN 'active' ELSE 'stopped' END,
        stopped_reason = %(reason)s::text, changed_at = now(), changed_by = %(changed_by)s,
        counting_since = CASE WHEN %(reason)s::text IS NULL AND p.state = 'stopped' THEN now()
                              ELSE p.counting_since END,
        more_left = CASE WHEN %(reason)s::text IS NULL THEN p.more_left ELSE false END
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
#: A tick's claim of policy ``id`` (held: STANDING_TRY_HOLD) when it is due: active, no breaker of
#: its group (of its topic, when it names one) other than closed, and either its last run left some
#: behind (or did not finish), or ``every`` seconds passed since its last run (``after: every``),
#: or a breaker of its group closed since (``after: breaker_closed``). Marks it as having more left
#: until its run says otherwise, so that a tick that dies leaves it to the next. Returns its id.
STANDING_CLAIM = _named("STANDING_CLAIM", """
    UPDATE standing_redrives p SET more_left = true, last_run_at = now()
    WHERE p.id = %(id)s AND p.state = 'active'
      AND NOT EXISTS (
        SELECT 1 FROM breakers b JOIN topics t ON t.id = b.topic_id
        WHERE b.group_id = p.group_id AND b.state <> 'closed'
          AND (p.spec->>'topic' IS NULL OR t.name = p.spec->>'topic'))
      AND (p.more_left
           OR (p.spec->>'after' = 'every'
               AND (p.last_run_at IS NULL
                    OR p.last_run_at <= now() - make_interval(secs => %(every)s::float8)))
           OR (p.spec->>'after' = 'breaker_closed' AND EXISTS (
                 SELECT 1 FROM breaker_transitions x JOIN topics t ON t.id = x.topic_id
                 WHERE x.group_id = p.group_id AND x.to_state = 'closed'
                   AND x.at > coalesce(p.last_run_at, p.created_at)
                   AND (p.spec->>'topic' IS NULL OR t.name = p.spec->>'topic'))))
    RETURNING p.id""")
#: The end of a claim (still held): whether matching dead letters are left for the next tick, and
#: whether it ran a redrive run (``ran``).
STANDING_RELEASE = _named("STANDING_RELEASE", """
    UPDATE standing_redrives SET more_left = %(more_left)s, runs = runs + CASE WHEN %(ran)s THEN 1 ELSE 0 END
    WHERE id = %(id)s""")
#: Of the last ``limit`` messages policy ``id`` brought back since it counts (``counting_since``):
#: how many, and how many are dead letters again, dead-lettered after they were brought back.
STANDING_DIED_AGAIN = _named("STANDING_DIED_AGAIN", """
    SELECT count(*), count(*) FILTER (WHERE EXISTS (
             SELECT 1 FROM dlq_messages q WHERE q.message_id = m.message_id AND q.group_id = m.group_id
               AND q.dead_lettered_at > m.moved_at))
    FROM (SELECT m.group_id, m.message_id, m.moved_at
          FROM redrive_runs r JOIN redrive_moves m ON m.run_id = r.id
          JOIN standing_redrives p ON p.id = r.standing_id
          WHERE r.standing_id = %(id)s AND m.moved_at >= p.counting_since
          ORDER BY r.id DESC LIMIT %(limit)s) m""")
#: The figures of every standing redrive for the metrics: group, name, state, brought back.
METRICS_STANDING = _named("METRICS_STANDING", """
    SELECT g.name, p.name, p.state, p.brought_back
    FROM standing_redrives p JOIN consumer_groups g ON g.id = p.group_id ORDER BY g.name, p.name""")
# fmt: on
