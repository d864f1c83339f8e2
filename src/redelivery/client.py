"""The Python client: topics, groups, publish, receive, ack, nack / reconsume_later, reject, stats.

Semantics, RocketMQ 5's PushConsumer state machine (RocketMQ 5, "Consumption retry"):

- ``publish`` appends each message once to the topic's log (one row, whatever the number of groups;
  each group's consume offset reaches it). A batch id publishes one batch once.
- ``receive`` takes the group's READY rows (retries, redriven messages; ``FOR UPDATE SKIP LOCKED``),
  then the messages past its consume offset (an INFLIGHT delivery row each, the offset moved), with
  a lease of ``invisible_duration`` seconds and the delivery count incremented; the transaction
  commits before any message is returned, Artemis's ``persist-delivery-count-before-delivery``
  (Artemis, "Message redelivery and undelivered messages"), so a crash can never under-count a
  delivery. The delivery count never decreases.
- ``ack`` commits (the delivery row goes); ``nack`` / ``reconsume_later`` schedule a retry
  (WAITING_RETRY, reconsume times + 1) or, once the group's max reconsume times are used up,
  dead-letter the message; ``reject`` dead-letters it at once; ``extend_lease`` keeps it invisible
  longer. A consumer that goes silent past its lease is handled by the tier job.
- A receipt, (group, message id, delivery count), answers exactly one delivery: a late or repeated
  answer changes nothing and is counted as stale; an answer for another group is refused.

Every call is one transaction and raises before changing anything on bad input. Times passed as
``at`` (timezone-aware ``datetime``) replace the database clock; ``None`` uses ``now()``.
A ``Client`` holds one connection: use one client per thread. The statements are in
``redelivery.store.statements``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.dead_letters import DlqFilter, select
from redelivery.messaging.admin import Administration
from redelivery.messaging.codec import Message, Receipt, ReceivedMessage
from redelivery.messaging.consuming import Consumer, Outcome
from redelivery.messaging.context import ClientContext
from redelivery.messaging.leasing import MAX_INVISIBLE_SECONDS, MIN_INVISIBLE_SECONDS, Receiver
from redelivery.messaging.publishing import Publisher
from redelivery.store import catalog, db

#: ``dlq_list`` gives at most this many dead letters.
MAX_LIST_LIMIT = 10_000


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _offered(
    role: str, function: Callable[Concatenate[Any, _P], _R]
) -> Callable[Concatenate[Client, _P], _R]:
    """``function`` of the client's ``role`` as a method of the client itself: its name, signature
    and docstring kept for ``help(Client.settle)`` (``functools.wraps``), and its parameters and
    return type for a type checker or an IDE (``ParamSpec``), so ``client.settle(`` shows what
    ``Consumer.settle`` takes."""

    @functools.wraps(function)
    def method(self: Client, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return function(getattr(self, role), *args, **kwargs)

    return method


class Client:
    """A connection to the state store. ``url``: libpq URL (default: ``database_url()``).

    A client holds four roles over one connection, as the Kafka and Pulsar clients hold a
    producer, a consumer and an admin client: ``admin`` (``messaging.admin.Administration``:
    topics, groups, subscriptions, policies, stats), ``publisher`` (``messaging.publishing``:
    ``publish``), ``receiver`` (``messaging.leasing``: ``receive``, ``lease_rows``) and
    ``consumer`` (``messaging.consuming``: ``ack``, ``nack`` / ``reconsume_later``, ``reject``,
    ``extend_lease``, ``settle``). The client offers their public calls as its own, and
    ``dlq_list``.

    Raises ``SchemaNotMigratedError`` when the database was never migrated or is at an older
    migration (run ``redelivery db upgrade``: a client never migrates), ``ConfigError`` when
    messages wait at delay levels the config's level table lacks."""

    def __init__(self, url: str | None = None, config: RedeliveryConfig | None = None):
        url = url or db.database_url()
        config = config or cached_config()
        conn = db.connect(url, autocommit=True)
        try:
            db.check_schema(conn)
            catalog.check_level_table(conn, config)
        except BaseException:
            conn.close()
            raise
        self.context = ClientContext(url, config, conn)
        self.admin = Administration(self.context)
        self.publisher = Publisher(self.context)
        self.receiver = Receiver(self.context)
        self.consumer = Consumer(self.context)

    @property
    def conn(self):
        """The client's connection, its roles' (a publish retry replaces a broken one). A caller
        may set another (a reconnect): every role uses it from then on."""
        return self.context.conn

    @conn.setter
    def conn(self, conn) -> None:
        self.context.conn = conn

    @property
    def url(self) -> str:
        return self.context.url

    @property
    def config(self) -> RedeliveryConfig:
        return self.context.config

    @config.setter
    def config(self, config: RedeliveryConfig) -> None:
        self.context.config = config

    @property
    def levels(self):
        return self.context.levels

    @property
    def publish_waits(self) -> list[float]:
        """The waits of the last publish's retries, seconds."""
        return self.publisher.publish_waits

    create_topic = _offered("admin", Administration.create_topic)
    create_group = _offered("admin", Administration.create_group)
    update_group = _offered("admin", Administration.update_group)
    subscribe = _offered("admin", Administration.subscribe)
    delete_topic = _offered("admin", Administration.delete_topic)
    policy = _offered("admin", Administration.policy)
    stats = _offered("admin", Administration.stats)
    breakers = _offered("admin", Administration.breakers)
    breaker_history = _offered("admin", Administration.breaker_history)
    open_breaker = _offered("admin", Administration.open_breaker)
    close_breaker = _offered("admin", Administration.close_breaker)
    publish = _offered("publisher", Publisher.publish)
    receive = _offered("receiver", Receiver.receive)
    lease_rows = _offered("receiver", Receiver.lease_rows)
    ack = _offered("consumer", Consumer.ack)
    extend_lease = _offered("consumer", Consumer.extend_lease)
    nack = _offered("consumer", Consumer.nack)
    reconsume_later = _offered("consumer", Consumer.reconsume_later)
    reject = _offered("consumer", Consumer.reject)
    settle = _offered("consumer", Consumer.settle)
    check_outcomes = _offered("consumer", Consumer.check_outcomes)
    stale_receipts = _offered("consumer", Consumer.stale_receipts)

    def dlq_list(self, group: str, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` (1..10000) dead letters of ``group`` as dicts (body decoded,
        properties, attempt history, DLQ name, redrive count): ``dead_letters.select``. Raises
        ``UnknownGroupError``, ``ValueError``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
        return select(self.conn, DlqFilter(group=group), limit=limit, with_body=True)

    def close(self) -> None:
        """Close the connection (a consumer's waiter lock and LISTEN go with its session)."""
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = [
    "Client",
    "Message",
    "ReceivedMessage",
    "Receipt",
    "Outcome",
    "MIN_INVISIBLE_SECONDS",
    "MAX_INVISIBLE_SECONDS",
]
