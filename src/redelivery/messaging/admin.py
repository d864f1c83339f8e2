"""The administration of a client (``Client.admin``; ``Client`` is the one class a user holds):
topics, groups and subscriptions created, updated and deleted, policies, ``stats``."""

from __future__ import annotations

from redelivery.errors import ConfigError, InvalidNameError, NotSubscribedError, UnknownTopicError
from redelivery.messaging import breaking
from redelivery.messaging.context import Role
from redelivery.rules.breaker import MAX_BREAKER_SECONDS, BreakerConfig
from redelivery.rules.names import check_name
from redelivery.rules.policies import MAX_INT, EffectivePolicy
from redelivery.rules.words import COUNTED_STATES, DEFAULT_ON_EXHAUSTED, ON_EXHAUSTED, OnExhausted, one_of
from redelivery.store import db
from redelivery.store import statements as S
from redelivery.store.log import RETENTION_LOCK


def check_max_reconsume_times(limit: object) -> int | None:
    """Return ``limit`` if it is None or an int from -1 (unlimited) to 2**31 - 1; else ``ValueError``."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not -1 <= limit <= MAX_INT
    ):
        raise ValueError(
            f"max_reconsume_times must be an integer from -1 (unlimited) to {MAX_INT}, or None; got {limit!r}"
        )
    return limit


def _ordering_text(ordered: bool, on_exhausted: str) -> str:
    return f"ordered (on_exhausted={on_exhausted!r})" if ordered else "unordered"


def _storable(value: object, most: int) -> bool:
    """A text PostgreSQL stores as given: at most ``most`` characters, no NUL, valid UTF-8."""
    if not isinstance(value, str) or len(value) > most or "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


class Administration(Role):
    """The admin calls of a client (``Client`` offers them as its own)."""

    def _get_or_create(self, statement: str, params: dict) -> int:
        for _ in range(2):  # a creator that lost a race finds the winner's row the second time
            row = self.conn.execute(statement, params).fetchone()
            if row is not None:
                return row[0]
        raise AssertionError(f"{statement.splitlines()[0]} returned no id twice")

    def create_topic(self, name: str) -> int:
        """Create topic ``name`` if it does not exist; return its id. ``InvalidNameError`` on a bad name."""
        check_name("topic", name)
        self.context.topics[name] = self._get_or_create(S.CREATE_TOPIC, {"name": name})
        return self.context.topics[name]

    def create_group(self, name: str, max_reconsume_times: int | None = None) -> int:
        """Create consumer group ``name`` if it does not exist; return its id.

        ``max_reconsume_times``: the group's own limit (RocketMQ group metadata), which wins over
        the policies; -1 = unlimited. ``None`` keeps an existing group's limit (a new group then has
        none: the matching policy decides, RocketMQ default 16); ``update_group`` clears it. Raises
        ``InvalidNameError``, ``ValueError``."""
        check_name("group", name)
        limit = check_max_reconsume_times(max_reconsume_times)
        group_id = self._get_or_create(S.CREATE_GROUP, {"name": name, "max_reconsume_times": limit})
        self.context.forget_group(name)
        return group_id

    def update_group(self, name: str, *, max_reconsume_times: int | None) -> None:
        """Set group ``name``'s own max reconsume times (-1 unlimited), or clear it with ``None`` so
        that the policies decide. Raises ``UnknownGroupError``, ``ValueError``."""
        limit = check_max_reconsume_times(max_reconsume_times)
        self.context.group(name)
        self.conn.execute(S.SET_GROUP_MAX, {"name": name, "max_reconsume_times": limit})
        self.context.forget_group(name)

    def policy(self, topic: str, group: str) -> EffectivePolicy:
        """The effective retry and dead-letter policy of ``group`` on ``topic``. Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``, ``ConfigError``."""
        return self.context.effective_policy(
            self.context.topic_id(topic), self.context.group(group)[0], topic, group
        )

    def subscribe(
        self,
        group: str,
        topic: str,
        start: str = "latest",
        *,
        ordered: bool | None = None,
        on_exhausted: OnExhausted | None = None,
    ) -> None:
        """Subscribe ``group`` to ``topic`` (idempotent: an existing subscription keeps its
        offset). ``start`` (Kafka's ``auto.offset.reset``): ``"latest"``, messages published from
        now on are delivered to the group; ``"earliest"``, every message the topic's log still holds
        too.

        ``ordered``: messages of one key are delivered one at a time in publish order, each after
        the one before it is committed or dead-lettered (SQS FIFO message groups, Pub/Sub ordering
        keys, RocketMQ orderly consumption); keyless messages stay unordered. ``on_exhausted``
        (ordered only): ``"continue"``, a dead-lettered message releases its key, as SQS FIFO and
        RocketMQ orderly do; ``"halt"``, its key stays held until its dead letter is redriven, when
        it is READY again and goes first. Both are the subscription's for life; ``None`` takes what
        the config's policy for (topic, group) says for a new subscription (``ordered``,
        ``on_exhausted``; by default unordered, and continue), and keeps an existing one's.

        Raises ``UnknownGroupError`` / ``UnknownTopicError``, ``ValueError`` (another ``start`` or
        ``on_exhausted``, ``on_exhausted`` without ``ordered``, or a subscription that exists with
        another ordering: nothing changes), and ``InvalidNameError`` when the pair's DLQ or retry
        name (by its policy) cannot name a table."""
        if start not in ("latest", "earliest"):
            raise ValueError(f"start must be 'latest' or 'earliest', got {start!r}")
        asked = (ordered, on_exhausted)
        if ordered is not None and not isinstance(ordered, bool):
            raise ValueError(f"ordered must be true or false, got {ordered!r}")
        if on_exhausted is not None and on_exhausted not in ON_EXHAUSTED:
            raise ValueError(f"on_exhausted must be {one_of(ON_EXHAUSTED)}, got {on_exhausted!r}")
        if on_exhausted not in (None, DEFAULT_ON_EXHAUSTED) and ordered is False:
            raise ValueError("on_exhausted applies to an ordered subscription only (ordered=True)")
        group_id, own_max = self.context.group(group)
        self.context.topic_renamed(topic)  # a rare call: never subscribe a topic id that is gone
        topic_id = self.context.topic_id(topic)
        try:
            policy = self.config.policy_for(topic, group, own_max)
        except ConfigError as exc:
            raise InvalidNameError(f"cannot subscribe group {group!r} to topic {topic!r}: {exc}") from None
        ordered = policy.ordered if ordered is None else ordered
        if on_exhausted is None:
            on_exhausted = policy.on_exhausted if ordered else DEFAULT_ON_EXHAUSTED
        elif on_exhausted != DEFAULT_ON_EXHAUSTED and not ordered:
            raise ValueError(
                f"on_exhausted applies to an ordered subscription only, and the config's policy for "
                f"topic {topic!r} and group {group!r} is unordered (ordered=True to order it)"
            )
        subscription = {
            "topic_id": topic_id,
            "group_id": group_id,
            "from_beginning": start == "earliest",
            "ordered": ordered,
            "on_exhausted": on_exhausted,
        }
        with self.conn.transaction():  # the offset read after the topic's publishes and retention
            if not self.conn.execute(
                S.LOCK_TOPIC_FOR_SUBSCRIBE, {**subscription, **RETENTION_LOCK}
            ).fetchone():
                raise UnknownTopicError(f"unknown topic {topic!r}")
            self.conn.execute(S.SUBSCRIBE, subscription)
            existing = tuple(self.conn.execute(S.SUBSCRIPTION_ORDERING, subscription).fetchone())
        self.context.forget_topic(topic_id)
        if any(want is not None and want != have for want, have in zip(asked, existing, strict=True)):
            have = _ordering_text(*existing)
            raise ValueError(
                f"group {group!r} is subscribed to topic {topic!r} {have} already; a subscription keeps "
                f"its ordering for life (subscribe another group to have them the other way)"
            )

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` with its messages, deliveries, subscriptions and dead letters, in one
        transaction: it waits for the publishes, receives and redrives writing to the topic, then
        for the answers and tier runs holding its delivery rows, so a dead letter written meanwhile
        goes too. Raises ``UnknownTopicError``."""
        topic_id = self.context.topic_id(name)

        def delete() -> None:  # a deadlock with a receive or a retention run: the victim runs again
            with self.conn.transaction():
                for statement in (S.LOCK_TOPIC_FOR_DELETE, S.LOCK_SUBSCRIPTIONS_FOR_DELETE):
                    self.conn.execute(statement, {"topic_id": topic_id})
                self.conn.execute(S.DELETE_TOPIC_DELIVERIES, {"topic_id": topic_id})
                self.conn.execute(S.DELETE_TOPIC, {"topic_id": topic_id})

        db.retry_lock_conflicts(delete)
        self.context.topics.pop(name, None)
        self.context.forget_topic(topic_id)

    def stats(self) -> dict:
        """Counts per topic, group and state: ``{topic: {group: {"READY": n, "INFLIGHT": n,
        "WAITING_RETRY": n, "COMMITTED": n, "DLQ": n}}}`` for every subscription."""
        out: dict = {}
        for topic, group, *counts in self.conn.execute(S.SUBSCRIPTION_STATES):
            out.setdefault(topic, {})[group] = dict(zip(COUNTED_STATES, counts, strict=True))
        return out

    # ---- circuit breakers (issue 41) --------------------------------------------------------------

    def breakers(self, group: str | None = None) -> list[dict]:
        """Every subscription's breaker (of ``group`` when given), not closed ones first: topic,
        group, state ("closed", "open", "half_open", "held"), open_until, opened_at, open_seconds,
        probe_size, changed_at, changed_by, opened/closed/held totals, and its answers of the last
        minute (succeeded, failed: counted failures)."""
        return breaking.breakers(self.conn, group)

    def breaker_history(self, group: str | None = None, limit: int = 20) -> list[dict]:
        """The latest ``limit`` (1..10,000) breaker transitions (of ``group`` when given), newest
        first, each with its figures and who made it. Raises ``ValueError`` for a bad limit."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ValueError(f"limit must be an int in 1..10000, got {limit!r}")
        return breaking.history(self.conn, group, limit)

    def open_breaker(
        self,
        topic: str,
        group: str,
        *,
        seconds: float | None = None,
        by: str = "api",
        note: str | None = None,
    ) -> dict:
        """Open the breaker of ``group`` on ``topic`` by hand: for ``seconds`` (1..604800; half-open
        after, as after a trip), or, None, held open until ``close_breaker``. Receives hand nothing
        out, counted failures are parked, due retries wait. ``by`` and ``note`` go into the audit.
        Returns {"from", "to", "open_until"}. Raises ``UnknownTopicError``, ``UnknownGroupError``,
        ``NotSubscribedError``, ``ValueError`` (seconds, note), before anything changes."""
        if seconds is not None and (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 1 <= seconds <= MAX_BREAKER_SECONDS
        ):
            raise ValueError(
                f"seconds must be a number in 1..{MAX_BREAKER_SECONDS}, or None (held), got {seconds!r}"
            )
        state = "held" if seconds is None else "open"
        return self._set_breaker(topic, group, state, None if seconds is None else float(seconds), by, note)

    def close_breaker(self, topic: str, group: str, *, by: str = "api", note: str | None = None) -> dict:
        """Close the breaker of ``group`` on ``topic`` by hand: deliveries go on, parked retries are
        promoted by their tier's next window, answers counted before no longer count. Returns
        {"from", "to", "open_until"}; raises what ``open_breaker`` raises."""
        return self._set_breaker(topic, group, "closed", None, by, note)

    def _set_breaker(self, topic: str, group: str, state: str, seconds, by: str, note: str | None) -> dict:
        for name, value, most in (("by", by, 200), ("note", note, 1000)):
            if value is not None and not _storable(value, most):
                raise ValueError(
                    f"{name} must be a text of at most {most} characters, no NUL or lone surrogate"
                )
        topic_id, group_id = self.context.topic_id(topic), self.context.group(group)[0]
        try:  # the probe of the subscription's breaker, or the default one's without a policy of it
            breaker = (
                self.context.effective_policy(topic_id, group_id, topic, group).breaker or BreakerConfig()
            )
        except (NotSubscribedError, ConfigError):  # no row: refused below, nothing changed; a bad
            breaker = BreakerConfig()  # policy must not keep an operator from closing it
        now = [b for b in breaking.breakers(self.conn, group) if b["topic"] == topic]
        if now and now[0]["state"] == state and state in ("closed", "held"):  # nothing to change or audit
            return {"from": state, "to": state, "open_until": None}
        done = breaking.set_state(self.conn, topic_id, group_id, state, seconds, by, note, breaker.probe_size)
        if done is None:
            raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
        return done
