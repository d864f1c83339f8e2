"""Topics, groups and subscriptions of the client (``Client`` is the one class a user holds):
create, update, delete, policies, ``stats`` and ``dlq_list``."""

from __future__ import annotations

from redelivery.dead_letters import DlqFilter, select
from redelivery.errors import (
    ConfigError,
    InvalidNameError,
    NotSubscribedError,
    UnknownTopicError,
)
from redelivery.messaging.codec import (
    STATES,
)
from redelivery.rules.names import check_name
from redelivery.rules.policies import MAX_INT, EffectivePolicy
from redelivery.store import catalog, db
from redelivery.store import statements as S
from redelivery.store.log import RETENTION_LOCK

MAX_LIST_LIMIT = 10_000


def check_max_reconsume_times(limit: object) -> int | None:
    """Return ``limit`` if it is None or an int from -1 (unlimited) to 2**31 - 1; else ``ValueError``."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not -1 <= limit <= MAX_INT
    ):
        raise ValueError(
            f"max_reconsume_times must be an integer from -1 (unlimited) to {MAX_INT}, or None; got {limit!r}"
        )
    return limit


class Administration:
    """The admin calls of ``redelivery.client.Client`` (which sets ``conn``, ``config``, ``levels``
    and the caches these use)."""

    def _get_or_create(self, statement: str, params: dict) -> int:
        for _ in range(2):  # a creator that lost a race finds the winner's row the second time
            row = self.conn.execute(statement, params).fetchone()
            if row is not None:
                return row[0]
        raise AssertionError(f"{statement.splitlines()[0]} returned no id twice")

    def create_topic(self, name: str) -> int:
        """Create topic ``name`` if it does not exist; return its id. ``InvalidNameError`` on a bad name."""
        check_name("topic", name)
        self._topics[name] = self._get_or_create(S.CREATE_TOPIC, {"name": name})
        return self._topics[name]

    def create_group(self, name: str, max_reconsume_times: int | None = None) -> int:
        """Create consumer group ``name`` if it does not exist; return its id.

        ``max_reconsume_times``: the group's own limit (RocketMQ group metadata), which wins over
        the policies; -1 = unlimited. ``None`` keeps an existing group's limit (a new group then has
        none: the matching policy decides, RocketMQ default 16); ``update_group`` clears it. Raises
        ``InvalidNameError``, ``ValueError``."""
        check_name("group", name)
        limit = check_max_reconsume_times(max_reconsume_times)
        group_id = self._get_or_create(S.CREATE_GROUP, {"name": name, "max_reconsume_times": limit})
        self._forget_group(name)
        return group_id

    def update_group(self, name: str, *, max_reconsume_times: int | None) -> None:
        """Set group ``name``'s own max reconsume times (-1 unlimited), or clear it with ``None`` so
        that the policies decide. Raises ``UnknownGroupError``, ``ValueError``."""
        limit = check_max_reconsume_times(max_reconsume_times)
        self._group(name)
        self.conn.execute(S.SET_GROUP_MAX, {"name": name, "max_reconsume_times": limit})
        self._forget_group(name)

    def _forget_group(self, name: str) -> None:
        self._groups.pop(name, None)
        self._policies.clear()
        self._caps.clear()

    def policy(self, topic: str, group: str) -> EffectivePolicy:
        """The effective retry and dead-letter policy of ``group`` on ``topic``. Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``, ``ConfigError``."""
        return self._effective_policy(self._topic(topic), self._group(group)[0], topic, group)

    def _effective_policy(self, topic_id: int, group_id: int, topic: str, group: str) -> EffectivePolicy:
        """The policy of one subscription, read only (a check before a change writes nothing)."""
        key = (topic_id, group_id)
        if key in self._policies:
            return self._policies[key][0]
        found = catalog.effective_policies(self.conn, self.config, [key])
        if key not in found:
            raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
        return found[key]

    def _policy(self, topic_id: int, group_id: int, topic: str, group: str) -> tuple[EffectivePolicy, dict]:
        """(policy, SQL parameters of the policy table) of one subscription, cached. Registers the
        DLQ's name (``catalog.policy_table``): for a call that is about to change state."""
        key = (topic_id, group_id)
        if key not in self._policies:
            policy = self._effective_policy(topic_id, group_id, topic, group)
            self._policies[key] = (policy, catalog.policy_table(self.conn, self.config, {key: policy}))
        return self._policies[key]

    def subscribe(self, group: str, topic: str, start: str = "latest") -> None:
        """Subscribe ``group`` to ``topic`` (idempotent: an existing subscription keeps its
        offset). ``start`` (Kafka's ``auto.offset.reset``): ``"latest"``, messages published from
        now on are delivered to the group; ``"earliest"``, every message the topic's log still holds
        too. Raises ``UnknownGroupError`` / ``UnknownTopicError``, ``ValueError`` (another
        ``start``), and ``InvalidNameError`` when the pair's DLQ or retry name (by its policy)
        cannot name a table."""
        if start not in ("latest", "earliest"):
            raise ValueError(f"start must be 'latest' or 'earliest', got {start!r}")
        group_id, own_max = self._group(group)
        self._topic_renamed(topic)  # a rare call: never subscribe a topic id that is gone
        topic_id = self._topic(topic)
        try:
            self.config.policy_for(topic, group, own_max)
        except ConfigError as exc:
            raise InvalidNameError(f"cannot subscribe group {group!r} to topic {topic!r}: {exc}") from None
        subscription = {"topic_id": topic_id, "group_id": group_id, "from_beginning": start == "earliest"}
        with self.conn.transaction():  # the offset read after the topic's publishes and retention
            if not self.conn.execute(
                S.LOCK_TOPIC_FOR_SUBSCRIBE, {**subscription, **RETENTION_LOCK}
            ).fetchone():
                raise UnknownTopicError(f"unknown topic {topic!r}")
            self.conn.execute(S.SUBSCRIBE, subscription)
        self._policies.pop((topic_id, group_id), None)
        self._caps.pop(topic_id, None)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` with its messages, deliveries, subscriptions and dead letters, in one
        transaction: it waits for the publishes, receives and redrives writing to the topic, then
        for the answers and tier runs holding its delivery rows, so a dead letter written meanwhile
        goes too. Raises ``UnknownTopicError``."""
        topic_id = self._topic(name)

        def delete() -> None:  # a deadlock with a receive or a retention run: the victim runs again
            with self.conn.transaction():
                for statement in (S.LOCK_TOPIC_FOR_DELETE, S.LOCK_SUBSCRIPTIONS_FOR_DELETE):
                    self.conn.execute(statement, {"topic_id": topic_id})
                self.conn.execute(S.DELETE_TOPIC_DELIVERIES, {"topic_id": topic_id})
                self.conn.execute(S.DELETE_TOPIC, {"topic_id": topic_id})

        db.retry_lock_conflicts(delete)
        self._topics.pop(name, None)
        self._caps.pop(topic_id, None)
        self._policies = {k: v for k, v in self._policies.items() if k[0] != topic_id}

    def _topic(self, name: str) -> int:
        if name not in self._topics:
            self._topics[name] = catalog.topic_id(self.conn, name)
        return self._topics[name]

    def _topic_renamed(self, name: str) -> bool:
        """Whether the id this client keeps for topic ``name`` no longer names it (another process
        deleted the topic and made it again): the new id is kept from now on. A call that found
        nothing under the old id (an empty receive, a publish lock on a deleted topic) runs again.
        Raises ``UnknownTopicError`` when the topic is gone."""
        kept = self._topics.pop(name, None)
        if self._topic(name) == kept:
            return False
        self._caps.pop(kept, None)
        self._policies = {k: v for k, v in self._policies.items() if k[0] != kept}
        return True

    def _group(self, name: str) -> tuple[int, int | None]:
        """(id, own max_reconsume_times) of group ``name``; ``UnknownGroupError`` if there is none."""
        if name not in self._groups:
            self._groups[name] = catalog.group(self.conn, name)
        return self._groups[name]

    def stats(self) -> dict:
        """Counts per topic, group and state: ``{topic: {group: {"READY": n, "INFLIGHT": n,
        "WAITING_RETRY": n, "COMMITTED": n, "DLQ": n}}}`` for every subscription."""
        out: dict = {}
        for topic, group, *counts in self.conn.execute(S.SUBSCRIPTION_STATES):
            out.setdefault(topic, {})[group] = dict(zip(STATES, counts, strict=True))
        return out

    def dlq_list(self, group: str, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` (1..10000) dead letters of ``group`` as dicts (body decoded,
        properties, attempt history, DLQ name, redrive count). Raises ``UnknownGroupError``,
        ``ValueError``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
        return select(self.conn, DlqFilter(group=group), limit=limit, with_body=True)
