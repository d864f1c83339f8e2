"""``ReadyMessagesTrigger`` against the real state store, run with asyncio as the triggerer runs it:
it fires on edges (messages new in the log by id, whatever their publish time, and deliveries
READY again since its last event), never again for the same ones, not after a restart from its
serialized kwargs either, and it waits for a transaction that could still make older deliveries
READY (not for one that could publish: its ids come later). In Airflow's ack mode (driven here by
Airflow's own ``SharedStreamManager``, the test confirming what the triggerer would have stored)
the watermarks move only once Airflow stored the event, and an event it did not store fires again."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from helpers import TriggerWatch

pytestmark = pytest.mark.airflow  # Airflow's trigger base class

POLL = 0.1  # seconds: the tests' poll interval
SETTLE = 2.0  # seconds: a transaction left open elsewhere delays a test's events no longer than this


def make_trigger(**kwargs):
    from redelivery.airflow.triggers import ReadyMessagesTrigger

    defaults = {"topic": "orders", "group": "billing", "poll_interval": POLL, "settle_timeout": SETTLE}
    return ReadyMessagesTrigger(**{**defaults, **kwargs})


class AckModeWatch(TriggerWatch):
    """Runs a trigger as Airflow 3.3's triggerer runs a shared-stream trigger: through a
    ``SharedStreamManager`` (subscribe, ``filter_shared_stream``, each event bound to a persist
    confirmation). The test plays the triggerer's supervisor: ``confirm()`` says Airflow stored
    the events so far; leaving the block unconfirmed is a triggerer that died before storing."""

    def __init__(self, trigger, ack_timeout: float = 300.0):
        from airflow.triggers.shared_stream import SharedStreamManager

        super().__init__(trigger)
        self.manager = SharedStreamManager(ack_timeout=ack_timeout)
        self.key, self.seqs = trigger.shared_stream_key(), []

    async def _run(self) -> None:
        raw = self.manager.subscribe(trigger_id=1, trigger=self.trigger, key=self.key)
        async for event in self.trigger.filter_shared_stream(raw):
            self.seqs.append(self.manager.bind_pending_event(trigger_id=1, key=self.key))
            self.events.append(event.payload)

    def confirm(self) -> None:
        assert None not in self.seqs  # every event was bound: the trigger runs in ack mode
        self.manager.confirm_persisted(self.seqs)
        self.seqs = []

    async def __aexit__(self, *exc) -> None:
        await super().__aexit__(*exc)
        await self.manager.stop_all()


def confirmed(client):
    row = client.conn.execute(
        "SELECT confirmed FROM asset_watermarks WHERE asset_uri = 'redelivery://orders/billing'"
    ).fetchone()
    return row[0] if row else None


async def confirmed_soon(client, until: str, timeout: float = 10):
    """Wait until the confirmed watermark is the ISO time ``until`` (an event's)."""
    deadline = time.monotonic() + timeout
    while (value := await asyncio.to_thread(confirmed, client)) != datetime.fromisoformat(until):
        assert time.monotonic() < deadline, f"confirmed: {value}, waited for {until}"
        await asyncio.sleep(0.05)
    return value


async def until_total(watches, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(w.events) for w in watches) < count:
        assert time.monotonic() < deadline, f"waited for {count} events in all"
        await asyncio.sleep(0.02)


#: The statements of a trigger's poll that end it when nothing fires (``ReadyMessagesTrigger.poll``):
#: the horizon, then the count of what became READY.
POLL_STATEMENTS = ("READY_HORIZON", "READY_SINCE")


def _wait_for_polls(url: str, count: int, copies: int, timeout: float) -> None:
    from redelivery.store import db

    query = (
        "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'redelivery-asset-watcher' AND query_start > %s AND ("
        + " OR ".join(f"query LIKE '/* redelivery:{name} */%%'" for name in POLL_STATEMENTS)
        + ")"
    )
    seen: dict[int, set] = {}
    with db.connect(url, autocommit=True) as conn:
        since = conn.execute("SELECT now()").fetchone()[0]
        deadline = time.monotonic() + timeout
        while True:
            for pid, started in conn.execute(query, (since,)):
                seen.setdefault(pid, set()).add(started)
            most = sorted((len(starts) for starts in seen.values()), reverse=True)[:copies]
            if len(most) == copies and most[-1] >= 2 * count - 1:
                return
            assert time.monotonic() < deadline, f"polls seen per copy of the trigger: {most}"
            time.sleep(0.01)


async def polls(client, count: int, copies: int = 1, timeout: float = 30) -> None:
    """Until each of ``copies`` running copies of the trigger has polled at least ``count`` more
    times, as PostgreSQL shows their sessions (``pg_stat_activity``): a poll that fires nothing runs
    the two ``POLL_STATEMENTS``, and the last one stays shown while it sleeps, so ``2 * count
    - 1`` statements seen are ``count`` polls at least. Instead of sleeping for a number of poll
    intervals: a slow machine polls less in that time, and a check that nothing fired would then
    prove nothing."""
    await asyncio.to_thread(_wait_for_polls, client.url, count, copies, timeout)


async def publish(client, n: int, hours_ago: float = 0) -> list[int]:
    """``hours_ago``: with an ``at`` that long ago (as a Spark publish stamps its job's start)."""
    at = datetime.now(UTC) - timedelta(hours=hours_ago) if hours_ago else None
    return await asyncio.to_thread(client.publish, "orders", [{"n": i} for i in range(n)], at=at)


def stored(client) -> tuple:
    return client.conn.execute(
        "SELECT watermark, events FROM asset_watermarks WHERE asset_uri = 'redelivery://orders/billing'"
    ).fetchone()


def test_fires_once_per_edge_not_while_rows_exist(client, topic_group):
    async def scenario():
        async with TriggerWatch(make_trigger()) as watch:
            await polls(client, 3)
            assert watch.events == []  # nothing READY
            await publish(client, 3)
            await watch.until(1)
            await polls(client, 4)  # the 3 are still READY: no new event
            assert [e["ready"] for e in watch.events] == [3]
            await publish(client, 2)
            await watch.until(2)
            await polls(client, 4)
            return watch.events

    events = asyncio.run(scenario())
    assert [e["ready"] for e in events] == [3, 2]
    assert events[0]["since"] < events[0]["until"] <= events[1]["since"] < events[1]["until"]  # ISO, UTC
    assert {e["topic"] for e in events} == {"orders"} and {e["group"] for e in events} == {"billing"}
    assert client.stats()["orders"]["billing"]["READY"] == 5
    assert stored(client)[1] == 2


def test_a_restart_from_serialized_kwargs_neither_fires_again_nor_misses(client, topic_group):
    from airflow._shared.module_loading import import_string  # what the triggerer uses

    first = make_trigger()
    classpath, kwargs = first.serialize()
    assert classpath == "redelivery.airflow.triggers.ReadyMessagesTrigger"
    assert kwargs == {
        "topic": "orders",
        "group": "billing",
        "poll_interval": POLL,
        "settle_timeout": SETTLE,
        "conn_id": "redelivery_db",
    }

    async def scenario():
        await publish(client, 3)  # a backlog before the first start: one event for it
        async with TriggerWatch(first) as watch:
            await watch.until(1)
            await polls(client, 3)
        found = [watch.events]
        await publish(client, 2)  # while no trigger runs
        for _ in range(2):  # the triggerer re-creates it from its kwargs: twice
            async with TriggerWatch(import_string(classpath)(**kwargs)) as watch:
                await polls(client, 5)
            found.append(watch.events)
        return found

    found = asyncio.run(scenario())
    assert [[e["ready"] for e in events] for events in found] == [[3], [2], []]
    assert client.stats()["orders"]["billing"]["READY"] == 5
    assert stored(client)[1] == 2


def make_ready(conn, message_id: int) -> None:
    """What a promotion does to a delivery: READY as of its transaction's start."""
    update = "UPDATE deliveries SET state = 'READY', invisible_until = NULL, ready_at = now()"
    conn.execute(update + " WHERE message_id = %s", (message_id,))


def test_waits_for_a_transaction_that_can_still_make_older_deliveries_ready(client, topic_group, clean_db):
    late, early = client.publish("orders", [{"late": True}, {"early": True}])
    client.receive("billing", "orders", 2, 60)  # INFLIGHT: nothing READY

    async def scenario():
        async with TriggerWatch(make_trigger()) as watch:
            with psycopg.connect(clean_db, options="-c search_path=redelivery") as slow:
                slow.execute("SELECT 1")  # a transaction starts (a promotion, a redrive)
                make_ready(client.conn, early)  # ready after it started, committed first (autocommit)
                await polls(client, 4)  # polls while the transaction is open
                held = list(watch.events)
                make_ready(slow, late)  # the slow transaction's, as of its start; then it commits
            await watch.until(1)
            await polls(client, 3)
            return held, watch.events

    held, events = asyncio.run(scenario())
    assert held == []  # the watermark did not pass the open transaction's start
    assert [e["ready"] for e in events] == [2]  # both, in one event: the late one is not lost


def test_a_publish_does_not_wait_for_an_open_transaction(client, topic_group, clean_db):
    """New messages are told by their ids, which grow in commit order: one published while an older
    transaction is open fires at once, not once the settle timeout let the horizon pass it."""

    async def scenario():
        async with TriggerWatch(make_trigger(settle_timeout=60.0)) as watch:
            with psycopg.connect(clean_db) as slow:
                slow.execute("SELECT 1")  # open from before the publish until the end
                await polls(client, 2)
                await publish(client, 2)
                await watch.until(1)
            return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [2]


def test_a_backdated_publish_fires_whenever_it_commits(client, topic_group):
    """Issue 27.4: messages published with an ``at`` two hours in the past (as a DataFrame publish
    stamps its job's start) after the trigger polled fire, and so do those published while no
    trigger runs (started again); the payload names the ids the event covers."""

    async def scenario():
        async with AckModeWatch(make_trigger()) as acked:
            await polls(client, 2)
            first = await publish(client, 3, hours_ago=2)
            await acked.until(1)
            acked.confirm()
            await confirmed_soon(client, acked.events[0]["until"])
        more = await publish(client, 2, hours_ago=2)  # while no trigger runs
        async with TriggerWatch(make_trigger()) as again:
            await again.until(1)
            await polls(client, 3)
        return first, more, [acked.events, again.events]

    first, more, found = asyncio.run(scenario())
    assert [[e["ready"] for e in events] for events in found] == [[3], [2]]
    assert [(e["since_id"], e["until_id"]) for [e] in found] == [(None, first[-1]), (first[-1], more[-1])]
    row = client.conn.execute("SELECT id_watermark, id_confirmed FROM asset_watermarks").fetchone()
    assert row == (more[-1], first[-1])  # the second watch ran outside ack mode: nothing confirmed


def tap_statements(monkeypatch, after) -> None:
    """The trigger's connections run ``await after(query)`` once each statement's answer arrived
    (an error raised there: the answer lost with the connection)."""
    from redelivery.airflow import triggers

    connect = triggers.connect

    class Tapped:
        def __init__(self, conn):
            self.conn = conn

        async def execute(self, query, params=None):
            cursor = await self.conn.execute(query, params)
            await after(query)
            return cursor

        async def close(self):
            await self.conn.close()

    async def connect_tapped(url, **kwargs):
        return Tapped(await connect(url, **kwargs))

    monkeypatch.setattr(triggers, "connect", connect_tapped)


@pytest.mark.parametrize("between,nth", [("READY_HORIZON", 2), ("READY_SINCE", 1)])
def test_a_backdated_publish_between_two_reads_fires(client, topic_group, monkeypatch, between, nth):
    """A backdated publish commits while a poll is between two reads: after it read the horizon
    (the second poll's, once the watermark moved), or after it counted a backlog and before its
    claim. The messages fire, in that poll's event or the next one's."""
    seen, published = [], []

    async def publish_between(query):
        if query.startswith(f"/* redelivery:{between} */"):
            seen.append(query)
            if len(seen) == nth:
                published.extend(await publish(client, 3, hours_ago=2))

    tap_statements(monkeypatch, publish_between)

    async def scenario():
        await publish(client, 2)  # a backlog: the first poll fires for it
        async with TriggerWatch(make_trigger()) as watch:
            await watch.until(2)
            await polls(client, 3)
        return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [2, 3] and len(published) == 3


def test_a_transaction_open_past_the_settle_timeout_stops_holding_it_back(client, topic_group, clean_db):
    async def scenario():
        async with TriggerWatch(make_trigger(settle_timeout=0.5)) as watch:
            with psycopg.connect(clean_db) as forgotten:
                forgotten.execute("SELECT 1")  # left open
                await publish(client, 2)
                await watch.until(1, timeout=5)
            return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [2]


def test_two_copies_of_the_trigger_fire_once(client, topic_group):
    async def scenario():
        async with TriggerWatch(make_trigger()) as one, TriggerWatch(make_trigger()) as two:
            await polls(client, 1, copies=2)  # both copies started before the publish
            await publish(client, 4)
            await until_total((one, two), 1)
            await polls(client, 5, copies=2)  # both copies polled on: no second event
            return one.events + two.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [4]
    assert stored(client)[1] == 1


def test_an_unreachable_database_is_retried_not_fatal(database_url, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_NOWHERE", "postgres://user:pw@127.0.0.1:9/redelivery")

    async def scenario():
        async with TriggerWatch(make_trigger(conn_id="redelivery_nowhere")) as watch:
            await asyncio.sleep(10 * POLL)
            assert not watch.task.done()
            return watch.events

    assert asyncio.run(scenario()) == []


def test_the_defaults():
    from redelivery.airflow.triggers import ReadyMessagesTrigger

    _, kwargs = ReadyMessagesTrigger(topic="flights", group="flights-http").serialize()
    assert kwargs == {
        "topic": "flights",
        "group": "flights-http",
        "poll_interval": 5.0,
        "settle_timeout": 120.0,
        "conn_id": "redelivery_db",
    }


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"topic": "bad topic"}, "topic name 'bad topic' is invalid"),
        ({"group": ""}, "group name '' is invalid"),
        ({"poll_interval": 0}, "poll_interval must be 0.1 to 3600 seconds"),
        ({"poll_interval": "5"}, "poll_interval must be a number of seconds"),
        ({"poll_interval": True}, "poll_interval must be a number of seconds"),
        ({"poll_interval": float("nan")}, "poll_interval must be a number of seconds"),
        ({"poll_interval": 5, "settle_timeout": 1}, "settle_timeout must be 5 to 86400 seconds"),
        ({"conn_id": ""}, "conn_id must be a connection id"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_trigger(**kwargs)


def test_in_ack_mode_the_watermark_is_confirmed_once_airflow_stored_the_event(client, topic_group):
    async def scenario():
        await publish(client, 3)
        async with AckModeWatch(make_trigger()) as watch:
            await watch.until(1)
            await polls(client, 4)
            assert watch.events[0]["ready"] == 3 and len(watch.events) == 1  # one event per edge
            assert stored(client)[1] == 1 and confirmed(client) is None  # claimed, not yet stored
            watch.confirm()
            await confirmed_soon(client, watch.events[0]["until"])
            await publish(client, 2)
            await watch.until(2)
            watch.confirm()
            await confirmed_soon(client, watch.events[1]["until"])
            return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [3, 2]
    assert stored(client)[1] == 2


def test_in_ack_mode_an_event_airflow_did_not_store_fires_again(client, topic_group):
    """The triggerer dies after the event left the trigger, before Airflow stored it: the trigger
    re-created from its kwargs fires again for the same deliveries, then not again."""
    from airflow._shared.module_loading import import_string

    classpath, kwargs = make_trigger().serialize()

    async def scenario():
        await publish(client, 3)
        found = []
        for confirm in (False, True):
            async with AckModeWatch(import_string(classpath)(**kwargs)) as watch:
                await watch.until(1)
                if confirm:
                    watch.confirm()
                    await confirmed_soon(client, watch.events[0]["until"])
            found.append(watch.events)
        async with AckModeWatch(import_string(classpath)(**kwargs)) as watch:
            await polls(client, 3)
            await publish(client, 1)  # a new edge: fires alone, the 3 stored ones do not again
            await watch.until(1)
            await polls(client, 3)
        found.append(watch.events)
        return found

    found = asyncio.run(scenario())
    assert [[e["ready"] for e in events] for events in found] == [[3], [3], [1]]
    assert found[1][0]["since"] is None  # from the confirmed watermark: none yet


def test_in_ack_mode_an_event_never_confirmed_ends_the_trigger_and_fires_again(client, topic_group):
    """Airflow's ack timeout: the confirmation never came; the trigger fails (Airflow re-creates
    it) and the confirmed watermark stays, so the re-created trigger fires again."""
    from airflow.triggers.shared_stream import AckTimeout

    async def scenario():
        await publish(client, 2)
        async with AckModeWatch(make_trigger(), ack_timeout=0.5) as watch:
            watch.expected_errors = (AckTimeout,)
            await watch.until(1)
            await asyncio.wait({watch.task}, timeout=10)
            assert isinstance(watch.task.exception(), AckTimeout)
        assert confirmed(client) is None
        async with AckModeWatch(make_trigger()) as again:
            await again.until(1)
            again.confirm()
            await confirmed_soon(client, again.events[0]["until"])
        return watch.events + again.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [2, 2]


def test_in_ack_mode_a_refused_confirmation_does_not_fire_the_edge_again(client, topic_group, monkeypatch):
    """The event is stored but the database refuses the confirmation (a read-only standby, a
    missing grant): logged, the trigger goes on and does not fire that edge again."""
    from redelivery.airflow import triggers

    calls = []

    async def refused(self, watermark):
        calls.append(watermark)
        raise psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")

    monkeypatch.setattr(triggers.ReadyMessagesTrigger, "confirm", refused)

    async def scenario():
        await publish(client, 3)
        async with AckModeWatch(make_trigger()) as watch:
            await watch.until(1)
            watch.confirm()
            await polls(client, 5)  # the trigger polls on after the refused confirmation
            assert not watch.task.done()
            await publish(client, 1)
            await watch.until(2)
        return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [3, 1]
    assert confirmed(client) is None and len(calls) >= 1  # refused, and the trigger went on


def test_in_ack_mode_two_watchers_of_one_asset_fire_once(client, topic_group):
    """Two triggers on one asset with other settings (two polls): the claim lets one fire."""

    async def scenario():
        async with AckModeWatch(make_trigger()) as one, AckModeWatch(make_trigger(poll_interval=0.2)) as two:
            # both copies started (loaded the watermarks) before the first claim: a copy that
            # starts after it starts from the confirmed watermark and fires the range again
            # (at least once, by design), which is not what this test is about
            await polls(client, 1, copies=2)
            await publish(client, 3)
            await until_total((one, two), 1)
            await publish(client, 2)
            await until_total((one, two), 2)
            await polls(client, 5, copies=2)  # both copies polled on: no third event
            return one.events + two.events

    assert sorted(e["ready"] for e in asyncio.run(scenario())) == [2, 3]
    assert stored(client)[1] == 2


def set_watermarks(client, claimed_sql: str, confirmed_sql: str) -> None:
    client.conn.execute(
        f"INSERT INTO asset_watermarks (asset_uri, watermark, confirmed) VALUES"
        f" ('redelivery://orders/billing', {claimed_sql}, {confirmed_sql})"
    )
    client.conn.commit()


def test_in_ack_mode_a_database_error_before_the_first_claim_keeps_the_repeat(
    client, topic_group, monkeypatch
):
    """3 deliveries claimed by an event Airflow never stored; the re-created trigger's first poll
    meets a dropped connection: the reconnect keeps its start (the confirmed watermark)."""
    from redelivery.airflow import triggers

    poll, failed = triggers.ReadyMessagesTrigger.poll, []

    async def poll_once_failing(self, conn):
        if not failed:
            failed.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await poll(self, conn)

    monkeypatch.setattr(triggers.ReadyMessagesTrigger, "poll", poll_once_failing)

    async def scenario():
        await publish(client, 3)
        set_watermarks(client, "now() + interval '1 second'", "now() - interval '1 hour'")
        async with AckModeWatch(make_trigger()) as watch:
            await watch.until(1)
        return watch.events

    assert [e["ready"] for e in asyncio.run(scenario())] == [3] and failed


def test_in_ack_mode_a_claim_whose_answer_was_lost_still_fires(client, topic_group, monkeypatch):
    """The claim commits, its answer is lost with the connection: the trigger reconnects and the
    next claim covers the range again."""
    from redelivery.store import statements as S

    lost = []

    async def lose_the_claims_answer(query):
        if query == S.ADVANCE_ASSET_WATERMARK and not lost:
            lost.append(True)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    tap_statements(monkeypatch, lose_the_claims_answer)

    async def scenario():
        await publish(client, 3)
        async with AckModeWatch(make_trigger()) as watch:
            await watch.until(1)
            await polls(client, 3)
        return watch.events

    events = asyncio.run(scenario())
    assert lost and [e["ready"] for e in events] == [3] and events[0]["since"] is None
    assert stored(client)[1] == 2  # two claims: the one whose answer was lost, and the event's


def test_a_claim_never_moves_the_watermark_back(client, topic_group, clean_db):
    """A trigger started from the confirmed watermark whose horizon is held back by an open
    transaction fires its repeat without moving the claimed watermark back."""

    async def scenario():
        await publish(client, 1)
        with psycopg.connect(clean_db) as slow:
            slow.execute("SELECT 1")  # holds the horizon at its start
            await asyncio.sleep(0.5)
            set_watermarks(client, "now()", "now() - interval '1 hour'")
            before = stored(client)[0]
            async with AckModeWatch(make_trigger(settle_timeout=5.0)) as watch:
                await watch.until(1)
            return before, stored(client)[0], watch.events

    before, after, events = asyncio.run(scenario())
    assert [e["ready"] for e in events] == [1] and after == before
