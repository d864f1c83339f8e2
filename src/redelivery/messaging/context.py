"""What the roles of a client share (``redelivery.client.Client`` holds an administration, a
publisher and a consumer, as the Kafka and Pulsar clients do): one connection, the config, and
the caches of names to ids and of each subscription's policy. ``Role`` is the base of each role:
it reads the shared context, and holds no state of its own beyond it."""

from __future__ import annotations

import weakref

import psycopg

from redelivery.config import RedeliveryConfig
from redelivery.errors import ConfigError, NotSubscribedError
from redelivery.rules.breaker import BreakerConfig
from redelivery.rules.levels import LevelTable
from redelivery.rules.policies import EffectivePolicy
from redelivery.store import catalog
from redelivery.store import statements as S


class ClientContext:
    """A client's connection ``conn`` (autocommit; a publish retry replaces a broken one), libpq
    ``url``, ``config``, and its caches: topic ids by name, (group id, own max reconsume times)
    by name, (policy, SQL parameters) by (topic id, group id), and each topic's ready-backlog
    caps. A cache entry is dropped when this client changes what it holds, or finds it gone."""

    def __init__(self, url: str, config: RedeliveryConfig, conn: psycopg.Connection):
        self.url, self.conn = url, conn
        self.topics: dict[str, int] = {}
        self.groups: dict[str, tuple[int, int | None]] = {}
        self.policies: dict[tuple[int, int], tuple[EffectivePolicy, dict]] = {}
        self.caps: dict[int, dict] = {}  # topic id -> {group id: policy with a ready-backlog cap}
        self.breakers: dict[tuple[int, int], BreakerConfig | None] = {}  # -> its policy's breaker:
        self.ordered: dict[tuple[int, int], bool] = {}  # (topic id, group id) -> an ordered subscription
        #: (topic id, group id) -> the share of free messages its ordered receive expects to read
        self.free_shares: dict[tuple[int, int], float] = {}
        #: (a connection, the server's pid of its session): the channel of a wait on it
        #: (``messaging.waiting``)
        self.server_pid: tuple[psycopg.Connection | None, int] = (None, 0)
        #: {a connection: what this client knows of its session's waiter locks}
        #: (``messaging.waiting.WaitLocks``; the entry goes with the connection)
        self.wait_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: (topic id, group id) whose last receive that could wait found nothing at once: its next
        #: one says it waits before it receives (``messaging.waiting.wait_for``)
        self.found_empty: set[tuple[int, int]] = set()
        self.config = config  # and ``levels``, its level table

    @property
    def config(self) -> RedeliveryConfig:
        return self._config

    @config.setter
    def config(self, config: RedeliveryConfig) -> None:
        """A new config: its level table parsed once; the policies resolved again when next used."""
        self._config, self.levels = config, config.level_table
        self.policies, self.caps, self.breakers = {}, {}, {}

    def topic_id(self, name: str) -> int:
        """Topic ``name``'s id; ``UnknownTopicError`` if there is none."""
        if name not in self.topics:
            self.topics[name] = catalog.topic_id(self.conn, name)
        return self.topics[name]

    def topic_renamed(self, name: str) -> bool:
        """Whether the id this client keeps for topic ``name`` no longer names it (another process
        deleted the topic and made it again): the new id is kept from now on. A call that found
        nothing under the old id (an empty receive, a publish lock on a deleted topic) runs again.
        Raises ``UnknownTopicError`` when the topic is gone."""
        kept = self.topics.pop(name, None)
        if self.topic_id(name) == kept:
            return False
        self.forget_topic(kept)
        return True

    def group(self, name: str) -> tuple[int, int | None]:
        """(id, own max_reconsume_times) of group ``name``; ``UnknownGroupError`` if there is none."""
        if name not in self.groups:
            self.groups[name] = catalog.group(self.conn, name)
        return self.groups[name]

    def forget_group(self, name: str) -> None:
        """Group ``name`` changed: its id, and every policy (its own limit takes part in them)."""
        self.groups.pop(name, None)
        self.policies.clear()
        self.caps.clear()
        self.breakers.clear()

    def forget_topic(self, topic_id: int | None) -> None:
        """Topic ``topic_id`` changed (deleted, or a subscription added): its policies and caps."""
        self.caps.pop(topic_id, None)
        self.policies = {k: v for k, v in self.policies.items() if k[0] != topic_id}
        self.breakers = {k: v for k, v in self.breakers.items() if k[0] != topic_id}
        self.ordered = {k: v for k, v in self.ordered.items() if k[0] != topic_id}

    def is_ordered(self, topic_id: int, group_id: int) -> bool:
        """Whether subscription (topic, group) is ordered (False for none: the receive then finds
        nothing), cached (an empty receive drops it, in case the subscription was made again with
        the other ordering)."""
        key = (topic_id, group_id)
        if key not in self.ordered:
            row = self.conn.execute(S.SUBSCRIPTION_ORDERING, {"topic_id": topic_id, "group_id": group_id})
            found = row.fetchone()
            self.ordered[key] = bool(found and found[0])
        return self.ordered[key]

    def effective_policy(self, topic_id: int, group_id: int, topic: str, group: str) -> EffectivePolicy:
        """The policy of one subscription, read only (a check before a change writes nothing)."""
        key = (topic_id, group_id)
        if key in self.policies:
            return self.policies[key][0]
        found = catalog.effective_policies(self.conn, self.config, [key])
        if key not in found:
            raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
        return found[key]

    def breaker(self, topic_id: int, group_id: int, topic: str, group: str) -> BreakerConfig | None:
        """The ``breaker:`` of one subscription's policy (None: none, or no such subscription, or a
        policy that does not resolve: the call's own checks say what it is), cached: an ack asks
        for it every time."""
        key = (topic_id, group_id)
        if key not in self.breakers:
            try:
                self.breakers[key] = self.effective_policy(topic_id, group_id, topic, group).breaker
            except (NotSubscribedError, ConfigError):
                return None
        return self.breakers[key]

    def policy(self, topic_id: int, group_id: int, topic: str, group: str) -> tuple[EffectivePolicy, dict]:
        """(policy, SQL parameters of the policy table) of one subscription, cached. Registers the
        DLQ's name (``catalog.policy_table``): for a call that is about to change state."""
        key = (topic_id, group_id)
        if key not in self.policies:
            policy = self.effective_policy(topic_id, group_id, topic, group)
            self.policies[key] = (policy, catalog.policy_table(self.conn, self.config, {key: policy}))
        return self.policies[key]


class Role:
    """A role of a client over its shared ``context``: ``conn``, ``config``, ``levels`` and
    ``url`` are the context's."""

    def __init__(self, context: ClientContext):
        self.context = context

    @property
    def conn(self) -> psycopg.Connection:
        return self.context.conn

    @property
    def config(self) -> RedeliveryConfig:
        return self.context.config

    @property
    def levels(self) -> LevelTable:
        return self.context.levels

    @property
    def url(self) -> str:
        return self.context.url
