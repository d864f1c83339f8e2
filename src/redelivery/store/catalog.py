"""Topics, consumer groups and subscriptions as the state changes need them: ids by name, each
subscription's policy as SQL parameters (``policy_table``), and the DLQ tables (made with the
first dead letter of each DLQ)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from redelivery.config import RedeliveryConfig
from redelivery.errors import ConfigError, UnknownGroupError, UnknownTopicError
from redelivery.rules.breaker import counting_rule
from redelivery.rules.names import check_name, is_valid_queue_name
from redelivery.rules.policies import EffectivePolicy
from redelivery.store import statements as S

DLQ_TABLE_LOCK = 7_424_002  # advisory lock namespace: creating a DLQ table
BACKLOG_LOCK = 7_424_003  # advisory lock namespace: a topic's ready backlog (flow control)
DLQ_SCHEMA = "redelivery_dlq"


def topic_id(conn: psycopg.Connection, name: str, what: str = "topic") -> int:
    """The id of topic ``name``. Raises ``InvalidNameError`` (not a name), ``UnknownTopicError``
    ("unknown <what> 'name'")."""
    check_name("topic", name)
    row = conn.execute(S.TOPIC_ID, {"name": name}).fetchone()
    if row is None:
        raise UnknownTopicError(f"unknown {what} {name!r}")
    return row[0]


def lock_topic_for_publish(conn: psycopg.Connection, topic_id: int) -> None:
    """Hold topic ``topic_id`` until the transaction ends, as a writer of new messages of it
    (publish, redrive to it): publishers of the topic take turns, so its message ids grow in commit
    order (a consume offset never passes a message committed later); deleting the topic waits, and
    nothing is written to a deleted topic. Raises ``UnknownTopicError`` when it is gone."""
    if conn.execute(S.LOCK_TOPIC_FOR_PUBLISH, {"topic_id": topic_id}).fetchone() is None:
        raise UnknownTopicError(f"the topic (id {topic_id}) was deleted")


def lock_topics_shared(conn: psycopg.Connection, topic_ids: list[int]) -> None:
    """Hold topics ``topic_ids`` until the transaction ends, as a writer of delivery rows no
    subscription lock covers (a redrive reviving dead letters): deleting them waits."""
    conn.execute(S.LOCK_TOPICS_SHARED, {"topic_ids": sorted(topic_ids)})


def group(conn: psycopg.Connection, name: str) -> tuple[int, int | None]:
    """(id, own max reconsume times) of group ``name``. Raises ``InvalidNameError`` (not a name),
    ``UnknownGroupError``."""
    check_name("group", name)
    row = conn.execute(S.GROUP_BY_NAME, {"name": name}).fetchone()
    if row is None:
        raise UnknownGroupError(f"unknown consumer group {name!r}")
    return row[0], row[1]


def subscribed_groups(conn: psycopg.Connection, topic: int) -> list[int]:
    """Ids of the groups subscribed to topic id ``topic``."""
    return [g for (g,) in conn.execute(S.SUBSCRIBED_GROUPS, {"topic_id": topic})]


def subscribed_topics(conn: psycopg.Connection, group_id: int) -> list[int]:
    """Ids of the topics group id ``group_id`` is subscribed to, ascending."""
    return [t for (t,) in conn.execute(S.SUBSCRIBED_TOPICS, {"group_id": group_id})]


def lock_backlog(conn: psycopg.Connection, topic: int) -> None:
    """Serialise flow control on topic id ``topic`` until the transaction ends."""
    conn.execute(S.ADVISORY_XACT_LOCK, {"namespace": BACKLOG_LOCK, "key": topic})


def ready_count(conn: psycopg.Connection, group_id: int, topic: int) -> int:
    """The messages group id ``group_id`` has waiting on topic id ``topic``, what a ready-backlog cap
    counts: its READY rows, its BLOCKED rows (an ordered subscription's) and the messages past its
    consume offset."""
    return conn.execute(S.READY_COUNT, {"group_id": group_id, "topic_id": topic}).fetchone()[0]


def add_group_totals(
    conn: psycopg.Connection,
    *,
    promoted: dict[int, int] | None = None,
    dead_lettered: dict[int, int] | None = None,
    stale: dict[int, int] | None = None,
) -> None:
    """Add to groups' totals (``{group id: n}`` each; the counters of ``redelivery.metrics``) in
    the caller's transaction, as its last statement: the group rows are locked in id order, after
    the delivery rows of the change they count, so two such transactions never wait for each other
    in a circle. Nothing to add, no statement."""
    totals = {}
    for column, values in enumerate((promoted, dead_lettered, stale)):
        for group_id, n in (values or {}).items():
            totals.setdefault(group_id, [0, 0, 0])[column] += n
    groups = sorted(g for g, added in totals.items() if any(added))
    if not groups:
        return
    conn.execute(
        S.ADD_GROUP_TOTALS,
        {
            "total_groups": groups,
            "total_promoted": [totals[g][0] for g in groups],
            "total_dead_lettered": [totals[g][1] for g in groups],
            "total_stale": [totals[g][2] for g in groups],
        },
    )


# ---- policies -----------------------------------------------------------------------------------


def effective_policies(
    conn: psycopg.Connection,
    config: RedeliveryConfig,
    pairs: list[tuple[int, int]] | None = None,
    problems: dict | None = None,
) -> dict[tuple[int, int], EffectivePolicy]:
    """``{(topic_id, group_id): EffectivePolicy}`` for every subscription (or only ``pairs``).

    A subscription whose policy cannot be resolved (a DLQ or retry name too long for a table, after
    a config change) raises ``ConfigError``; with ``problems`` given, it is left out instead and
    reported there as ``{(topic name, group name): error text}``, so one bad subscription never
    stops the others."""
    params = {
        "all": pairs is None,
        "topic_ids": [p[0] for p in pairs or []],
        "group_ids": [p[1] for p in pairs or []],
    }
    found = {}
    for t, g, topic, grp, own_max in conn.execute(S.SUBSCRIPTIONS, params).fetchall():
        try:
            found[(t, g)] = config.policy_for(topic, grp, own_max)
        except ConfigError as exc:
            if problems is None:
                raise
            problems[(topic, grp)] = str(exc)
    return found


def check_level_table(conn: psycopg.Connection, config: RedeliveryConfig) -> None:
    """Raise ``ConfigError`` if messages wait at delay levels the config's level table no longer
    has: no tier would ever promote them."""
    beyond = conn.execute(S.WAITING_BEYOND_LEVELS, {"level_count": len(config.level_table)}).fetchall()
    if beyond:
        waiting = ", ".join(f"{n:,} at level {level}" for level, n in beyond)
        raise ConfigError(
            f"the configured level table has {len(config.level_table)} levels, but messages wait at "
            f"levels beyond it ({waiting}): no tier would promote them; keep those levels until they "
            "are promoted, or redrive them"
        )


def policy_table(conn: psycopg.Connection, config: RedeliveryConfig, policies: dict) -> dict:
    """The SQL parameters of ``statements.POLICIES_CTE`` for ``policies`` (from
    ``effective_policies``). Registers each DLQ name (not its table: that comes with the first dead
    letter)."""
    names = sorted({p.dlq_name for p in policies.values()})
    ids: dict[str, int] = {}
    if names:
        conn.execute(S.REGISTER_DLQ_NAMES, {"names": names})
        ids = dict(conn.execute(S.DLQ_IDS, {"names": names}).fetchall())
    table: dict[str, list] = {
        k: []
        for k in (
            "p_topic",
            "p_group",
            "p_max",
            "p_delays",
            "p_levels",
            "p_jitter",
            "p_dlq",
            "p_cap",
            "p_rule",
        )
    }
    routing = config.level_table
    for (topic, group_id), policy in policies.items():
        delays, levels = policy.schedule(routing)
        table["p_topic"].append(topic)
        table["p_group"].append(group_id)
        table["p_max"].append(policy.max_reconsume_times)
        table["p_delays"].append("{" + ",".join(repr(float(d)) for d in delays) + "}")
        table["p_levels"].append("{" + ",".join(str(lvl) for lvl in levels) + "}")
        table["p_jitter"].append(policy.jitter)
        table["p_dlq"].append(ids[policy.dlq_name])
        table["p_cap"].append(policy.max_ready_backlog)
        table["p_rule"].append(counting_rule(policy.breaker))
    return table


def lock_breakers(conn: psycopg.Connection, topic_ids: list[int], group_ids: list[int]) -> None:
    """In the caller's transaction, before a statement that may spend an attempt: the breaker locks
    of the subscriptions (``topic_ids``, ``group_ids``, every one, with a ``breaker:`` or not: an
    operator may open any) held shared until it commits (``BREAKERS_SHARE``, advisory: nothing
    written), so that the breaker's state the statement reads stays its state until the commit (a
    transition waits). Nothing for none."""
    if topic_ids:
        conn.execute(S.BREAKERS_SHARE, {"topic_ids": topic_ids, "group_ids": group_ids})


# ---- DLQ tables ---------------------------------------------------------------------------------


def ensure_dlq_tables(conn: psycopg.Connection, dlq_ids: set[int]) -> list[str]:
    """Create the table of each DLQ in ``dlq_ids`` that has none yet (a partition of dlq_messages
    in schema redelivery_dlq named after the DLQ); return the names made.

    Each creation is its own short transaction under an advisory lock, so concurrent callers make a
    table once. Call it before the transaction that dead-letters."""
    created = []
    for dlq_id in sorted(dlq_ids):
        with conn.transaction():
            conn.execute(S.ADVISORY_XACT_LOCK, {"namespace": DLQ_TABLE_LOCK, "key": dlq_id})
            name, made = conn.execute(S.DLQ_TABLE_STATE, {"dlq_id": dlq_id}).fetchone()
            if made is not None:
                continue
            if not is_valid_queue_name(
                name
            ):  # the CHECK constraint says the same; never build SQL from it unchecked
                raise ValueError(f"DLQ name {name!r} cannot name a table")
            conn.execute(
                S.CREATE_DLQ_TABLE.format(table=sql.Identifier(DLQ_SCHEMA, name), dlq_id=sql.Literal(dlq_id))
            )
            conn.execute(S.MARK_DLQ_TABLE_CREATED, {"dlq_id": dlq_id})
            created.append(name)
    return created


def missing_dlq_tables(conn: psycopg.Connection) -> set[int]:
    """Ids of the registered DLQs that have no table yet."""
    return {r[0] for r in conn.execute(S.DLQS_WITHOUT_TABLE)}
