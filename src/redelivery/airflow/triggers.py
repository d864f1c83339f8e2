"""``ReadyMessagesTrigger``: an event trigger (``AssetWatcher``) that starts a consumer DAG when a
topic has new READY messages for a consumer group. It fires on edges (messages new in the log
since its id watermark, deliveries that became READY again since its time watermark, both kept in
``asset_watermarks``), never on "rows exist"; in the triggerer it runs in Airflow's ack mode
(``ReadyMessagesProducer``), so each edge fires at least once. The design (the watermarks, the
horizon of open transactions, ack mode, why polling and not LISTEN/NOTIFY): docs/asset-watcher.md.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Hashable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer

from redelivery.airflow.assets import asset_uri
from redelivery.airflow.env import DB_CONN_ID
from redelivery.airflow.hooks import RedeliveryHook, store_problem
from redelivery.errors import DatabaseUnavailableError, RedeliveryError
from redelivery.store import db
from redelivery.store import statements as S
from redelivery.store.db import connect_timeouts, session_options

#: Seconds between polls (default), and the bounds accepted.
DEFAULT_POLL_SECONDS = 5.0
MIN_POLL_SECONDS, MAX_POLL_SECONDS = 0.1, 3600.0
#: Seconds an open transaction may hold the time watermark (READY delivery rows') back (default),
#: and the bounds accepted.
DEFAULT_SETTLE_SECONDS = 120.0
MAX_SETTLE_SECONDS = 86_400.0
#: Longest wait, in seconds, between attempts while the database cannot be reached.
MAX_BACKOFF_SECONDS = 60.0
#: Seconds a confirmation may wait for a connection (it holds up the trigger's later ones).
CONFIRM_TIMEOUT_SECONDS = 10


class Watermarks(NamedTuple):
    """How far an event reached: READY delivery rows with ``ready_at`` before ``time``, new log
    messages with ids up to ``id`` (None: no message seen yet). ``ReadyMessagesProducer``'s
    broker payload: what a confirmation moves the confirmed watermarks to."""

    time: datetime
    id: int | None


def _later(mine, stored):
    """The later of two watermarks of one kind (None: none yet)."""
    return stored if mine is None or (stored is not None and stored > mine) else mine


def _seconds(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low:g} to {high:g} seconds, got {value!r}")
    return float(value)


class ReadyMessagesTrigger(BaseEventTrigger):
    """Fires when messages of ``topic`` became READY for consumer group ``group`` since its last
    event: messages new in the log (past the group's consume offset), or delivery rows READY again
    (a retry promoted, a redrive). See the module's documentation for the watermarks.

    :param topic: the topic whose messages it watches.
    :param group: the consumer group they became READY for.
    :param poll_interval: seconds between polls (0.1 to 3600, default 5).
    :param settle_timeout: seconds an open transaction may hold the time watermark of the READY
        delivery rows back (at least ``poll_interval``, at most 86400, default 120; new log
        messages are told by id, which no open transaction holds back).
    :param conn_id: the Airflow connection of the application database (default ``redelivery_db``,
        for which ``REDELIVERY_DATABASE_URL`` wins when set: ``RedeliveryHook``).

    Each event's payload: ``{"topic", "group", "ready": n, "since": ISO time or None, "until": ISO
    time, "since_id": int or None, "until_id": int or None}``: n messages became READY, the delivery
    rows with ``ready_at`` in ``[since, until)`` and the messages of the log past the group's consume
    offset with ids in ``(since_id, until_id]``. ``since`` None: from the beginning, ``since_id``
    None: from the consume offset (the first event, or a repeat before any event was confirmed);
    ``until_id`` None: no message seen yet (then ``since_id`` is None too). Raises
    ``InvalidNameError`` or ``ValueError`` on bad arguments, before anything runs. A connection
    not defined, a database that cannot be reached, refuses the login or was never migrated is
    retried (waits double up to 60 s, one warning line each naming the connection and the fix),
    the connection read again before each new attempt, so a password rotated in the connection
    (or a moved host, or a connection defined since) is taken without re-creating the trigger;
    the trigger never ends on its own, except in ack mode for an
    event Airflow did not confirm stored (Airflow re-creates the trigger, which fires it again)."""

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
        self.id_watermark: int | None = None  # in memory: the highest message id counted
        self._stored: datetime | None = None  # the claimed watermarks, as last read or written
        self._stored_id: int | None = None
        self._loaded = False
        self._url: str | None = None  # the state store's, once resolved
        #: Airflow's ack mode (``create_shared_stream_producer``): the first load starts from the
        #: confirmed watermark.
        self.ack_mode = False

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
        """One poll per trigger in a triggerer (Airflow's shared streams); with
        ``create_shared_stream_producer`` this puts the trigger in Airflow's ack mode."""
        classpath, kwargs = self.serialize()
        return (classpath, *sorted(kwargs.items()))

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ReadyMessagesProducer:
        """The poll of Airflow's ack mode: ``kwargs`` are the trigger's serialized ones."""
        trigger = cls(**kwargs)
        trigger.ack_mode = True
        return ReadyMessagesProducer(trigger)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Every payload of the poll is an event of this trigger (the poll is per trigger)."""
        async for payload in shared_stream:
            yield TriggerEvent(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The trigger on its own (outside ack mode): at most once per edge."""
        async for payload, _ in self.events():
            yield TriggerEvent(payload)

    async def events(self) -> AsyncIterator[tuple[dict, Watermarks]]:
        """Poll forever: ``(payload, watermarks)`` for each edge this copy claimed, the watermarks
        its claim moved to. A connection not defined, a database that cannot be reached, refuses
        the login or was never migrated is retried (waits double up to 60 s, one line each naming
        the connection and the fix: ``hooks.store_problem``), with the connection as it is then
        (``_reread``)."""
        backoff = self.poll_interval
        conn: psycopg.AsyncConnection | None = None
        try:
            while True:
                try:
                    if conn is None:
                        url = await self._reread()
                        conn = await connect(url)
                        await asyncio.to_thread(_check_schema, url)  # never migrated: its own line
                        await self.load(conn)
                        self.log.info(
                            "watching READY messages of %s from watermarks %s and id %s, every %s s",
                            self.asset_uri,
                            self.watermark,
                            self.id_watermark,
                            self.poll_interval,
                        )
                    payload = await self.poll(conn)
                    backoff = self.poll_interval
                except (psycopg.Error, RedeliveryError) as exc:
                    found = store_problem(exc, RedeliveryHook(self.conn_id))
                    problem = found[0] if found else " ".join(str(exc).split())
                    self.log.warning("%s: %s; trying again in %s s", self.asset_uri, problem, backoff)
                    if conn is not None:
                        await conn.close()
                        conn = None
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                    continue
                if payload is not None:
                    self.log.info("%s: %s new READY messages", self.asset_uri, payload["ready"])
                    yield payload, Watermarks(self.watermark, self.id_watermark)
                await asyncio.sleep(self.poll_interval)
        finally:
            if conn is not None:
                await conn.close()

    async def _reread(self) -> str:
        """The state store's URL read from the connection before each new attempt (a password
        rotated there, ALTER ROLE ... PASSWORD and the connection changed to match, is taken; a
        connection defined since it was missing too); the last one read while Airflow's lookup
        fails (logged: the next attempt reads it again). Raises ``DatabaseUnavailableError`` when
        the connection is not defined, or Airflow's error when no URL was ever read."""
        try:
            self._url = await RedeliveryHook(self.conn_id).aget_database_url()
        except DatabaseUnavailableError:
            raise
        except Exception as exc:  # Airflow's lookup failing
            if self._url is None:
                raise
            self.log.warning("%s: reading the connection %r failed: %s", self.asset_uri, self.conn_id, exc)
        return self._url

    async def load(self, conn: psycopg.AsyncConnection) -> None:
        """Read the claimed watermarks (None: this asset never fired; the id one None too for a row
        from before migration 0014), the ``previous`` ones of the next claim. Only the first load
        sets the watermarks in memory: the claimed ones, or in ack mode the confirmed ones (events
        claimed but never stored fire again). A reload after a database error keeps those in
        memory, so the next claim covers a range whose claim committed unanswered, or that was to
        be fired again."""
        row = await (await conn.execute(S.ASSET_WATERMARK, {"asset_uri": self.asset_uri})).fetchone()
        self._stored, confirmed, self._stored_id, id_confirmed = row if row else (None,) * 4
        if not self._loaded:
            if self.ack_mode:
                self.watermark, self.id_watermark = confirmed, id_confirmed
            else:
                self.watermark, self.id_watermark = self._stored, self._stored_id
            self._loaded = True

    async def poll(self, conn: psycopg.AsyncConnection) -> dict | None:
        """One poll: the event's payload when delivery rows became READY in ``[watermark, horizon)``
        or messages past the consume offset were published with ids past ``id_watermark``, and this
        copy of the trigger claimed the range (moved the claimed watermarks); else None."""
        # Two statements, two snapshots: the horizon is read before the deliveries are counted, so
        # that every transaction that started before it has committed (or aborted) by the count.
        # The new messages are counted on every poll, whatever the horizon: by id (READY_SINCE
        # says why no open transaction can hold an id back), so a long publish or a forgotten
        # session delays only the READY rows' part, and a publish whose ``at`` lies in the past
        # (a Spark publish's job start) still counts.
        horizon = (await (await conn.execute(S.READY_HORIZON, {"settle": self.settle_timeout})).fetchone())[0]
        since, since_id = self.watermark, self.id_watermark
        # never back: the horizon can lie before a watermark read from the store (an open
        # transaction older than another copy's claim); the READY rows' range is then empty
        until = _later(since, horizon)
        params = {
            "topic": self.topic,
            "group": self.group,
            "watermark": since,
            "horizon": horizon,
            "id_watermark": since_id,
        }
        promoted, published, last_id = await (await conn.execute(S.READY_SINCE, params)).fetchone()
        until_id = _later(since_id, last_id)
        if not promoted + published:
            self.watermark = until  # nothing there to fire for: no write
            return None
        claim = {
            "asset_uri": self.asset_uri,
            "watermark": until,
            "id_watermark": until_id,
            "previous": self._stored,
            "previous_id": self._stored_id,
        }
        moved = await (await conn.execute(S.ADVANCE_ASSET_WATERMARK, claim)).fetchone()
        if moved is None:  # another copy of this trigger fired first: take its watermarks
            await self.load(conn)
            self.watermark = _later(self.watermark, self._stored)
            self.id_watermark = _later(self.id_watermark, self._stored_id)
            return None
        self.watermark, self.id_watermark = until, until_id
        self._stored, self._stored_id = moved
        return {
            "topic": self.topic,
            "group": self.group,
            "ready": promoted + published,
            "since": since.isoformat() if since else None,
            "until": until.isoformat(),
            "since_id": since_id,
            "until_id": until_id,
        }

    async def confirm(self, watermarks: Watermarks) -> None:
        """Ack mode: Airflow stored the events up to ``watermarks``; the confirmed watermarks move
        forward to them. Raises ``psycopg.Error``."""
        url = self._url or await RedeliveryHook(self.conn_id).aget_database_url()
        params = {"asset_uri": self.asset_uri, "watermark": watermarks.time, "id_watermark": watermarks.id}
        async with await connect(url, connect_timeout=CONFIRM_TIMEOUT_SECONDS) as conn:
            await conn.execute(S.CONFIRM_ASSET_WATERMARK, params)


class EventNotStoredError(RuntimeError):
    """Airflow did not confirm an event stored: its range fires again from the confirmed watermark."""


class ReadyMessagesProducer(SharedStreamProducer):
    """``ReadyMessagesTrigger``'s poll in Airflow's ack mode: yields ``(payload, watermarks)`` for
    each edge it claimed, and confirms the watermarks of the events Airflow stored (``advance``)."""

    def __init__(self, trigger: ReadyMessagesTrigger) -> None:
        self.trigger = trigger

    async def open_stream(self) -> AsyncIterator[tuple[dict, Watermarks]]:
        async for payload, watermarks in self.trigger.events():
            yield payload, watermarks

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Confirm the last watermarks of the events of ``batch`` (in poll order) that Airflow stored,
        up to the first it did not; then raise ``EventNotStoredError`` for that one (Airflow ends
        this poll and the trigger; the re-created trigger starts from the confirmed watermark).

        A confirmation that fails is logged and left to the next event's (the confirmed
        watermark only moves forward): raising would end the trigger, and the re-created one
        would fire the same, stored, edge again."""
        stored = list(itertools.takewhile(lambda item: item.outcome.is_clean, batch))
        if stored:
            try:
                await self.trigger.confirm(stored[-1].broker_payload)
            except Exception as exc:  # the database's refusal or the connection's lookup
                self.trigger.log.error("%s: confirming the watermark failed: %s", self.trigger.asset_uri, exc)
        if len(stored) < len(batch):
            item, until = batch[len(stored)], batch[len(stored)].broker_payload
            raise EventNotStoredError(
                f"{self.trigger.asset_uri}: the event until {until.time.isoformat()} and id {until.id} "
                f"was not confirmed stored ({item.outcome}); it fires again from the confirmed watermarks"
            )


def _check_schema(url: str) -> None:
    """``db.check_schema`` of ``url``'s database (``SchemaNotMigratedError``: never migrated, or at
    an older revision), on a connection of its own."""
    with db.connect(url) as conn:
        db.check_schema(conn)


async def connect(url: str, **kwargs) -> psycopg.AsyncConnection:
    """An autocommit connection to the state store, named in ``pg_stat_activity``, within
    ``REDELIVERY_CONNECT_TIMEOUT`` seconds unless the URL or ``kwargs`` say (``connect_timeouts``)."""
    return await psycopg.AsyncConnection.connect(
        url,
        autocommit=True,
        application_name="redelivery-asset-watcher",
        options=session_options(url),
        **{**connect_timeouts(url), **kwargs},
    )
