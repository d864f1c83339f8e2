"""``ReadyMessagesTrigger``: an event trigger (``AssetWatcher``) that starts a consumer DAG when a
topic has new READY messages for a consumer group.

It fires on edges, never on "rows exist": an event means "deliveries of (topic, group) became
READY since the last event" (a publish, a promotion by a tier run, a redrive: every one of them
sets ``ready_at``), and deliveries whose event Airflow stored never fire again, however long they
stay READY. A trigger that fired on a backlog would make Airflow schedule the consumer forever.

The watermark
-------------
The trigger polls every ``poll_interval`` seconds. An event covers the deliveries whose
``ready_at`` lies in ``[watermark, horizon)``; the watermark then moves to the horizon:

- The horizon is the start of the oldest transaction still open in the database (other sessions'
  ``pg_stat_activity.xact_start``), or now. A delivery's ``ready_at`` is the start of the
  transaction that made it READY (``now()``), so a long publish or promotion that commits after a
  poll can never land behind the watermark: the watermark waits for it. A transaction open longer
  than ``settle_timeout`` seconds stops holding it back (so a forgotten session cannot stall the
  trigger); what such a transaction makes READY later with an older ``ready_at`` is not an event
  of its own: the consumer run of a later event drains it with everything else.
- The watermark of each asset is kept in the state store (``asset_watermarks``): a trigger
  re-created from its serialized kwargs (a triggerer restart, a re-assignment) starts from it, so
  it does not fire again for deliveries whose event Airflow has, and does not miss the ones that
  became READY in between.
- In a triggerer the trigger runs in Airflow's ack mode (``shared_stream_key`` and
  ``create_shared_stream_producer``, Airflow 3.3's shared streams): ``ReadyMessagesProducer``
  polls, and stores an event's watermark only once the triggerer has confirmed the event stored in
  Airflow's metadata database (``advance``). An event Airflow never stored (the triggerer died
  in between, the confirmation timed out) fires again from the stored watermark when the trigger
  is re-created: at least once per edge; a repeat starts one more consumer run, which finds what
  is still READY. One poll per asset and triggerer: copies of the trigger in one triggerer share
  it.
- ``run`` (the trigger on its own, outside a triggerer's shared streams) writes the watermark
  before it hands the event over, as a compare-and-set, so two copies never fire for the same
  deliveries; an event lost between that write and its consumer is not repeated (at most once).
- With no stored watermark (the first start for an asset) the trigger fires once for the READY
  backlog, so that a consumer DAG deployed onto a waiting topic starts.

Visibility: the horizon needs the watcher's database role to see other sessions' transaction
starts (the same role as the producers and tier jobs, a superuser, or ``pg_read_all_stats``);
sessions it cannot see do not hold it back. Publishes given an explicit ``at`` (a simulated clock)
earlier than the watermark are not seen as new.

Why polling and not LISTEN/NOTIFY: a NOTIFY would have to be added to the publish, promote and
redrive statements (or a trigger on ``deliveries``), and PostgreSQL serialises the commits of
notifying transactions; notifications are also lost while nobody listens, so the watermark would be
needed anyway. A poll is two indexed queries (``deliveries_ready_at``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Hashable, Sequence
from datetime import datetime
from typing import Any

import psycopg
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from .. import statements as S
from ..db import session_options
from .assets import asset_uri
from .env import DB_CONN_ID
from .hooks import RedeliveryHook

#: Seconds between polls (default), and the bounds accepted.
DEFAULT_POLL_SECONDS = 5.0
MIN_POLL_SECONDS, MAX_POLL_SECONDS = 0.1, 3600.0
#: Seconds an open transaction may hold the watermark back (default), and the bounds accepted.
DEFAULT_SETTLE_SECONDS = 120.0
MAX_SETTLE_SECONDS = 86_400.0
#: Longest wait, in seconds, between attempts while the database cannot be reached.
MAX_BACKOFF_SECONDS = 60.0


def _seconds(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low:g} to {high:g} seconds, got {value!r}")
    return float(value)


class ReadyMessagesTrigger(BaseEventTrigger):
    """Fires when deliveries of ``topic`` for consumer group ``group`` became READY since its last
    event (see the module's documentation for the watermark).

    ``poll_interval``: seconds between polls (0.1 to 3600, default 5). ``settle_timeout``: seconds
    an open transaction may hold the watermark back (at least ``poll_interval``, at most 86400,
    default 120). ``conn_id``: the Airflow connection of the application database (default
    ``redelivery_db``; without it ``REDELIVERY_DATABASE_URL`` or the embedded PostgreSQL).

    Each event's payload: ``{"topic", "group", "ready": n, "since": ISO time or None (the first
    event), "until": ISO time}``: n deliveries became READY with ``ready_at`` in ``[since,
    until)``. Raises ``InvalidNameError`` or ``ValueError`` on bad arguments, before anything runs.
    A database that cannot be reached is retried (waits double up to 60 s); the trigger never ends
    on its own, except in ack mode for an event Airflow did not confirm stored (Airflow re-creates
    the trigger, which fires it again)."""

    def __init__(
        self,
        *,
        topic: str,
        group: str,
        poll_interval: float = DEFAULT_POLL_SECONDS,
        settle_timeout: float = DEFAULT_SETTLE_SECONDS,
        conn_id: str = DB_CONN_ID,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.asset_uri = asset_uri(topic, group)  # InvalidNameError
        self.topic, self.group = topic, group
        self.poll_interval = _seconds("poll_interval", poll_interval, MIN_POLL_SECONDS, MAX_POLL_SECONDS)
        self.settle_timeout = _seconds(
            "settle_timeout", settle_timeout, self.poll_interval, MAX_SETTLE_SECONDS
        )
        if not isinstance(conn_id, str) or not conn_id:
            raise ValueError(f"conn_id must be a connection id, got {conn_id!r}")
        self.conn_id = conn_id
        self.watermark: datetime | None = None  # in memory: moves on every poll
        self._stored: datetime | None = None  # the state store's value, as last read or written

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topic": self.topic,
                "group": self.group,
                "poll_interval": self.poll_interval,
                "settle_timeout": self.settle_timeout,
                "conn_id": self.conn_id,
            },
        )

    def shared_stream_key(self) -> Hashable:
        """One poll per asset and settings in a triggerer (Airflow's shared streams); with
        ``create_shared_stream_producer`` this puts the trigger in Airflow's ack mode."""
        _, kwargs = self.serialize()
        return (type(self).__qualname__, *sorted(kwargs.items()))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ReadyMessagesProducer:
        """The poll of Airflow's ack mode: ``kwargs`` are the trigger's serialized ones."""
        return ReadyMessagesProducer(cls(**kwargs))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Every payload of the shared poll is an event of this trigger (the poll is per asset)."""
        async for payload in shared_stream:
            yield TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The trigger on its own: the watermark is stored (compare-and-set) before each event."""
        async for payload, _ in self.events(store_first=True):
            yield TriggerEvent(payload)

    async def events(self, *, store_first: bool) -> AsyncIterator[tuple[dict, datetime]]:
        """Poll forever: ``(payload, horizon)`` for each edge. ``store_first``: store the watermark
        before yielding and skip an edge another copy stored first; else the caller stores it
        (``store``). A database that cannot be reached is retried (waits double up to 60 s)."""
        url = await RedeliveryHook(self.conn_id).aget_database_url()
        backoff = self.poll_interval
        conn: psycopg.AsyncConnection | None = None
        try:
            while True:
                try:
                    if conn is None:
                        conn = await connect(url)
                        await self.load(conn)
                        self.log.info(
                            "watching READY deliveries of %s from watermark %s, every %s s",
                            self.asset_uri,
                            self.watermark,
                            self.poll_interval,
                        )
                    payload = await self.poll(conn, store=store_first)
                    backoff = self.poll_interval
                except psycopg.Error as exc:
                    self.log.warning("%s: %s; trying again in %s s", self.asset_uri, exc, backoff)
                    if conn is not None:
                        await conn.close()
                        conn = None
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                    continue
                if payload is not None:
                    self.log.info("%s: %s new READY deliveries", self.asset_uri, payload["ready"])
                    yield payload, self.watermark
                await asyncio.sleep(self.poll_interval)
        finally:
            if conn is not None:
                await conn.close()

    async def load(self, conn: psycopg.AsyncConnection) -> None:
        """Read the stored watermark (None: this asset never fired)."""
        row = await (await conn.execute(S.ASSET_WATERMARK, {"asset_uri": self.asset_uri})).fetchone()
        self._stored = row[0] if row else None
        if self.watermark is None or (self._stored is not None and self._stored > self.watermark):
            self.watermark = self._stored

    async def poll(self, conn: psycopg.AsyncConnection, store: bool = True) -> dict | None:
        """One poll: the event's payload when deliveries became READY in ``[watermark, horizon)``
        (and, ``store``, this copy of the trigger moved the stored watermark); else None. The
        watermark in memory moves to the horizon either way."""
        # Two statements, two snapshots: the horizon is read before the deliveries are counted, so
        # that every transaction that started before it has committed (or aborted) by the count.
        horizon = (await (await conn.execute(S.READY_HORIZON, {"settle": self.settle_timeout})).fetchone())[0]
        if self.watermark is not None and horizon <= self.watermark:
            return None
        since = self.watermark
        params = {"topic": self.topic, "group": self.group, "watermark": since, "horizon": horizon}
        ready = (await (await conn.execute(S.READY_SINCE, params)).fetchone())[0]
        if not ready:
            self.watermark = horizon  # nothing there to fire for: no write
            return None
        if not store:
            self.watermark = horizon
            return self._payload(ready, since, horizon)
        moved = await (
            await conn.execute(
                S.ADVANCE_ASSET_WATERMARK,
                {"asset_uri": self.asset_uri, "watermark": horizon, "previous": self._stored},
            )
        ).fetchone()
        if moved is None:  # another copy of this trigger fired first: take its watermark
            await self.load(conn)
            return None
        self.watermark = self._stored = horizon
        return self._payload(ready, since, horizon)

    def _payload(self, ready: int, since: datetime | None, until: datetime) -> dict:
        return {
            "topic": self.topic,
            "group": self.group,
            "ready": ready,
            "since": since.isoformat() if since else None,
            "until": until.isoformat(),
        }

    async def store(self, watermark: datetime, events: int) -> None:
        """Store ``watermark`` for this asset unless a later one is stored, counting ``events``
        (ack mode: after Airflow stored the events it covers). Raises ``psycopg.Error``."""
        url = await RedeliveryHook(self.conn_id).aget_database_url()
        params = {"asset_uri": self.asset_uri, "watermark": watermark, "events": events}
        async with await connect(url) as conn:
            await conn.execute(S.RAISE_ASSET_WATERMARK, params)


class WatermarkNotStoredError(RuntimeError):
    """An event was not confirmed stored by Airflow: its watermark stays where it was."""


class ReadyMessagesProducer(SharedStreamProducer):
    """``ReadyMessagesTrigger``'s poll in Airflow's ack mode: yields ``(payload, horizon)``, and
    stores the horizon of events Airflow confirmed stored (``advance``, events in poll order)."""

    def __init__(self, trigger: ReadyMessagesTrigger) -> None:
        self.trigger = trigger

    async def open_stream(self) -> AsyncIterator[tuple[dict, datetime]]:
        async for payload, horizon in self.trigger.events(store_first=False):
            yield payload, horizon

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Store the last horizon of ``batch`` when Airflow stored every event of it. Raises
        ``WatermarkNotStoredError`` otherwise (Airflow then ends this poll and the trigger, and the
        re-created trigger fires again from the stored watermark), or ``psycopg.Error``."""
        for item in batch:
            if not item.outcome.is_clean:
                raise WatermarkNotStoredError(
                    f"{self.trigger.asset_uri}: the event until {item.broker_payload.isoformat()} was not "
                    f"confirmed stored ({item.outcome}); it fires again from the stored watermark"
                )
        await self.trigger.store(batch[-1].broker_payload, len(batch))


async def connect(url: str) -> psycopg.AsyncConnection:
    """An autocommit connection to the state store, named in ``pg_stat_activity``."""
    return await psycopg.AsyncConnection.connect(
        url,
        autocommit=True,
        application_name="redelivery-asset-watcher",
        options=session_options(url),
    )
