"""The Python client: topics, groups, publish, receive, ack, nack / reconsume_later, reject, stats.

Semantics (RocketMQ 5 PushConsumer state machine, seeds/001):

- ``publish`` appends each message once to the topic's log (one row, whatever the number of groups;
  each group's consume offset reaches it). A batch id publishes one batch once.
- ``receive`` takes the group's READY rows (retries, redriven messages; ``FOR UPDATE SKIP LOCKED``),
  then the messages past its consume offset (an INFLIGHT delivery row each, the offset moved), with
  a lease of ``invisible_duration`` seconds and the delivery count incremented; the transaction
  commits before any message is returned (Artemis ``persist-delivery-count-before-delivery``,
  seeds/004), so a crash can never under-count a delivery. The delivery count never decreases.
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

import time

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.messaging.codec import Message, Receipt, ReceivedMessage
from redelivery.messaging.consuming import MAX_INVISIBLE_SECONDS, MIN_INVISIBLE_SECONDS, Consuming, Outcome
from redelivery.messaging.publishing import Publishing
from redelivery.rules.policies import EffectivePolicy
from redelivery.store import catalog, db


class Client(Consuming, Publishing):
    """A connection to the state store. ``url``: libpq URL (default: ``database_url()``). Its
    calls by role: ``messaging.admin`` (topics, groups, subscriptions, stats), ``messaging.publishing``
    (``publish``), ``messaging.consuming`` (``receive``, ``ack``, ``nack`` / ``reconsume_later``,
    ``reject``, ``settle``).

    Raises ``SchemaNotMigratedError`` when the database was never migrated or is at an older
    migration (run ``redelivery db upgrade``: a client never migrates), ``ConfigError`` when
    messages wait at delay levels the config's level table lacks."""

    def __init__(self, url: str | None = None, config: RedeliveryConfig | None = None):
        self.url = url or db.database_url()
        self.config = config or cached_config()
        self.levels = self.config.level_table
        self.conn = db.connect(self.url, autocommit=True)
        try:
            db.check_schema(self.conn)
            catalog.check_level_table(self.conn, self.config)
        except BaseException:
            self.conn.close()
            raise
        self._groups: dict[str, tuple[int, int | None]] = {}
        self._topics: dict[str, int] = {}
        self._policies: dict[tuple[int, int], tuple[EffectivePolicy, dict]] = {}
        self._caps: dict[int, dict] = {}  # topic id -> {group id: policy with a ready-backlog cap}
        self._sleep = time.sleep  # the producer retry's sleep (tests replace it)
        self.publish_waits: list[float] = []  # the waits of the last publish's retries, seconds

    def close(self) -> None:
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
