"""A receive that waits for a message (issue 42): ``wait_seconds`` returns as soon as a publish, a
tier run's promotion or a redrive makes a message receivable, woken by a notification that is sent
only while somebody waits; a missed wake-up costs at most the re-check; a refused wait changes
nothing; a client that closes leaves nothing behind."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from helpers import at, snapshot
from redelivery.client import Client
from redelivery.messaging import waiting
from redelivery.redrive import RedriveRequest, redrive
from redelivery.tiers.run import TierRunRequest, run_tier

#: The waits below end long before the re-check would (patched to this): whatever returns early was
#: woken by a notification.
NO_RECHECK = 60.0


class Waiter(threading.Thread):
    """``call(client)`` on a client of its own, in a thread: ``got`` its result, ``seconds`` its time."""

    def __init__(self, url: str, call):
        super().__init__(daemon=True)
        self.url, self.call, self.got, self.seconds, self.error = url, call, None, None, None
        self.started_waiting = threading.Event()

    def run(self) -> None:
        with Client(self.url) as client:
            self.pid = client.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            self.started_waiting.set()
            start = time.monotonic()
            try:
                self.got = self.call(client)
            except Exception as exc:  # noqa: BLE001  (reported by the test)
                self.error = exc
            self.seconds = time.monotonic() - start


def present(conn: psycopg.Connection) -> int:
    """How many backends hold a subscription's waiter lock (migration 0023: classid 2^32 - topic
    id, objid the group id; 0 is the topic's lock, which each of them holds too)."""
    return conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
        " AND classid::text::bigint >= 2147483648 AND objid <> 0"
    ).fetchone()[0]


def wait_on(conn: psycopg.Connection, topic_id: int, group_id: int) -> None:
    """``conn``'s backend says it waits on the subscription, as ``WAITER_PRESENT`` does."""
    conn.execute(
        "SELECT pg_advisory_lock_shared(%s, 0), pg_advisory_lock_shared(%s, %s)",
        (-topic_id,) * 2 + (group_id,),
    )


def wait_no_more(conn: psycopg.Connection, topic_id: int, group_id: int) -> None:
    conn.execute(
        "SELECT pg_advisory_unlock_shared(%s, %s), pg_advisory_unlock_shared(%s, 0)",
        (-topic_id, group_id, -topic_id),
    )


def until_present(conn: psycopg.Connection, n: int = 1) -> None:
    deadline = time.monotonic() + 20
    while present(conn) < n:
        assert time.monotonic() < deadline, "the waiter never said it waits"
        time.sleep(0.02)


@pytest.fixture()
def no_recheck(monkeypatch):
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", NO_RECHECK)


@pytest.mark.parametrize("round_trips", [2, 1])
def test_a_waiting_receive_returns_when_a_message_is_published(
    client, topic_group, database_url, no_recheck, round_trips
):
    """Either way of a small publish wakes the waiter: its wake after the commit (two round trips),
    or the wake in its pipeline (one: the publisher's partition known from a publish before)."""
    if round_trips == 1:
        client.create_topic("elsewhere")
        client.publish("elsewhere", [{"n": 0}])
        assert client.publisher._partition is not None
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    [mid] = client.publish("orders", [{"n": 1}])
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [mid]
    assert waiter.seconds < 10  # woken, not the wait's end (nor a re-check: patched away)


def test_a_publish_that_knows_consumers_wait_wakes_them_in_its_own_round_trip(
    client, topic_group, database_url, no_recheck, monkeypatch
):
    """A consumer waited on the topic at the last publish: the next one-round-trip publish sends
    the wake in its pipeline, after its commit, not in a round trip of its own."""
    from redelivery.messaging import publishing

    for n in range(2):
        waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
        waiter.start()
        until_present(client.conn)
        if n == 1:  # the publish before saw a waiter: no wake after this one's round trip
            monkeypatch.setattr(publishing, "wake", lambda *a: pytest.fail("a round trip of its own"))
        [mid] = client.publish("orders", [{"n": n}])
        waiter.join(20)
        assert waiter.error is None and [m.message_id for m in waiter.got] == [mid]
        assert waiter.seconds < 10  # woken, not the wait's end (nor a re-check: patched away)
        assert client.publisher._waited == {client.context.topic_id("orders"): True}


def test_a_promotion_and_a_redrive_wake_the_waiting_consumer(client, topic_group, database_url, no_recheck):
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 1, 30, at=at(0)), at=at(0))  # due at 10 s
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    window = TierRunRequest(tier="seconds", window_end=at(20), run_key="w")
    assert run_tier(window, url=database_url)["promoted"] == 1
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [mid] and waiter.seconds < 10
    client.reject("billing", waiter.got)
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="back", url=database_url)
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [mid] and waiter.seconds < 10


def test_nobody_waiting_means_no_notification(client, topic_group, database_url):
    """A publish notifies only while a consumer holds its waiter lock: a commit that notifies takes a
    lock of the whole cluster."""
    topic_id = client.conn.execute("SELECT id FROM topics WHERE name = 'orders'").fetchone()[0]
    group_id = client.conn.execute("SELECT id FROM consumer_groups WHERE name = 'billing'").fetchone()[0]
    with psycopg.connect(database_url, autocommit=True) as listener:
        pid = listener.info.backend_pid
        listener.execute(f"LISTEN redelivery_wait_{pid}")
        client.publish("orders", [{"n": 1}])
        assert list(listener.notifies(timeout=0.5)) == []  # nobody waits: nothing sent
        wait_on(listener, topic_id, group_id)
        client.publish("orders", [{"n": 2}])
        [note] = listener.notifies(timeout=5, stop_after=1)
        assert note.channel == f"redelivery_wait_{pid}"
        wait_no_more(listener, topic_id, group_id)
        client.publish("orders", [{"n": 3}])
        assert list(listener.notifies(timeout=0.5)) == []  # its wait returned: nobody


def test_a_message_wakes_one_waiter_of_each_group_not_the_herd(client, topic_group, database_url):
    """Three consumers of billing and one of audit wait: a publish of one message notifies one of
    billing's (at random) and audit's; a publish of three notifies each of them once."""
    client.create_group("audit")
    client.subscribe("audit", "orders")
    ids = dict(client.conn.execute("SELECT name, id FROM consumer_groups").fetchall())
    topic_id = client.conn.execute("SELECT id FROM topics WHERE name = 'orders'").fetchone()[0]
    listeners = [psycopg.connect(database_url, autocommit=True) for _ in range(4)]
    try:
        for conn, group in zip(listeners, ["billing", "billing", "billing", "audit"], strict=True):
            conn.execute(f"LISTEN redelivery_wait_{conn.info.backend_pid}")
            wait_on(conn, topic_id, ids[group])

        def woken() -> list[int]:
            time.sleep(0.3)
            return [len(list(conn.notifies(timeout=0.2))) for conn in listeners]

        client.publish("orders", [{"n": 1}])
        notified = woken()
        assert sum(notified[:3]) == 1 and notified[3] == 1
        client.publish("orders", [{"n": 2}, {"n": 3}, {"n": 4}])
        assert woken() == [1, 1, 1, 1]
    finally:
        for conn in listeners:
            conn.close()


def test_a_missed_wake_up_costs_at_most_the_recheck(client, topic_group, database_url, monkeypatch):
    """The publisher's notification lost (as with a connection that broke after the commit): the
    waiter receives the message at its next re-check anyway."""
    from redelivery.messaging import publishing

    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 0.5)
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    monkeypatch.setattr(publishing, "wake", lambda conn, wanted: None)
    [mid] = client.publish("orders", [{"n": 1}])
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [mid] and waiter.seconds < 10


def test_an_empty_wait_returns_nothing_after_the_wait_and_a_closed_client_leaves_nothing(
    client, topic_group, database_url
):
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=1.5))
    waiter.start()
    waiter.join(20)
    assert waiter.error is None and waiter.got == [] and waiter.seconds >= 1.5
    assert present(client.conn) == 0  # the wait returned: its lock went
    deadline = time.monotonic() + 10  # its session, and with it its LISTEN, ends with the client
    while client.conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (waiter.pid,)
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the waiter's session outlived its client"
        time.sleep(0.05)


def test_a_consumer_whose_wait_returned_is_not_woken(client, topic_group, database_url, no_recheck):
    """Once a wait returns, its lock is released (the next message wakes one that waits),
    and its session listens no more (a listening session in a long transaction would hold every
    notification of the database in PostgreSQL's queue)."""
    with Client(database_url) as other:
        threading.Timer(0.5, lambda: client.publish("orders", [{"n": 1}])).start()
        [got] = other.receive("billing", "orders", 10, 30, wait_seconds=15)
        assert present(client.conn) == 0  # the wait returned: not a waiter any more
        assert other.conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0] == 0
        other.ack("billing", got)


def test_a_tier_run_wakes_only_the_groups_it_promoted_for(client, topic_group, database_url):
    client.create_group("audit")
    client.subscribe("audit", "orders")
    client.publish("orders", [{"n": 1}], at=at(0))
    client.receive("audit", "orders", 1, 3600, at=at(0))  # audit's stays in flight: nothing for it
    client.nack("billing", client.receive("billing", "orders", 1, 30, at=at(0)), at=at(0))
    ids = dict(client.conn.execute("SELECT name, id FROM consumer_groups").fetchall())
    topic_id = client.conn.execute("SELECT id FROM topics WHERE name = 'orders'").fetchone()[0]
    listeners = {group: psycopg.connect(database_url, autocommit=True) for group in ("billing", "audit")}
    try:
        for group, conn in listeners.items():
            conn.execute(f"LISTEN redelivery_wait_{conn.info.backend_pid}")
            wait_on(conn, topic_id, ids[group])
        run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="w"), url=database_url)
        time.sleep(0.3)
        woken = {group: len(list(conn.notifies(timeout=0.2))) for group, conn in listeners.items()}
        assert woken == {"billing": 1, "audit": 0}
    finally:
        for conn in listeners.values():
            conn.close()


def test_an_empty_receive_does_not_wait_for_a_busy_one(client, topic_group, database_url):
    """Nothing past the offset: a receive takes no lock on the subscription, so a transaction that
    holds it (a receive taking messages, say) keeps nobody with nothing to take waiting."""
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM redelivery.subscriptions FOR UPDATE")
        started = time.monotonic()
        assert client.receive("billing", "orders", 10, 30) == []
        assert time.monotonic() - started < 5  # not blocked behind the holder
        holder.rollback()


def test_a_wait_inside_a_transaction_is_refused_before_anything(client, topic_group):
    client.publish("orders", [{"n": 1}])
    before = snapshot(client.conn)
    client.conn.execute("BEGIN")
    with pytest.raises(ValueError, match="cannot wait inside a transaction"):
        client.receive("billing", "orders", 10, 30, wait_seconds=1)
    client.conn.execute("ROLLBACK")
    assert snapshot(client.conn) == before


def test_a_lease_and_an_ordered_receive_wait_too(client, topic_group, database_url, no_recheck):
    client.create_topic("keyed")
    client.subscribe("billing", "keyed", ordered=True)
    waiter = Waiter(database_url, lambda c: c.receive("billing", "keyed", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    client.publish("keyed", [{"n": 1}])
    waiter.join(20)
    assert waiter.error is None and len(waiter.got) == 1 and waiter.seconds < 10
    leaser = Waiter(database_url, lambda c: c.lease_rows("billing", "orders", 10, 30, wait_seconds=15))
    leaser.start()
    until_present(client.conn)
    [mid] = client.publish("orders", [{"n": 2}])
    leaser.join(20)
    assert leaser.error is None and [r["message_id"] for r in leaser.got] == [mid] and leaser.seconds < 10


@pytest.mark.parametrize("answer", ["ack", "reject"])
def test_a_key_whose_head_ends_wakes_a_waiting_consumer_of_the_ordered_group(
    client, topic_group, database_url, no_recheck, answer
):
    """A key's next message becomes receivable when its head ends: the delete that ends it wakes a
    waiter of the group (migration 0018's trigger, sent at the answer's commit), not its re-check."""
    from redelivery.client import Message

    client.create_topic("keyed")
    client.subscribe("billing", "keyed", ordered=True)
    first, second = client.publish("keyed", [Message({"n": 1}, key="k"), Message({"n": 2}, key="k")])
    [head] = client.receive("billing", "keyed", 10, 30)  # the second waits behind it (BLOCKED)
    assert head.message_id == first
    waiter = Waiter(database_url, lambda c: c.receive("billing", "keyed", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    getattr(client, answer)("billing", [head])
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [second]
    assert waiter.seconds < 10  # woken, not the wait's end (nor a re-check: patched away)


@pytest.mark.parametrize("wait", [-1, 20.5, True, "5", None])
def test_a_bad_wait_is_refused_and_changes_nothing(client, topic_group, wait):
    client.publish("orders", [{"n": 1}])
    before = snapshot(client.conn)
    with pytest.raises(ValueError, match=r"wait_seconds must be 0\.\.20 seconds"):
        client.receive("billing", "orders", 10, 30, wait_seconds=wait)
    with pytest.raises(ValueError, match=r"wait_seconds must be 0\.\.20 seconds"):
        client.lease_rows("billing", "orders", 10, 30, wait_seconds=wait)
    assert snapshot(client.conn) == before


def test_the_consumer_dags_drain_waits_for_the_next_message(client, topic_group, database_url, no_recheck):
    """``drain`` (the consumer DAG's task) with ``wait_seconds``: nothing READY at first, a message
    published meanwhile is delivered in the same run, which ends once a wait finds nothing."""
    from redelivery.airflow.http_delivery import drain
    from redelivery.client import Outcome

    delivered = []

    def deliver(batch):
        delivered.extend(m.message_id for m in batch)
        return [Outcome(m, "ack") for m in batch]

    waiter = Waiter(database_url, lambda c: drain(c, "orders", "billing", deliver, wait_seconds=3))
    waiter.start()
    until_present(client.conn)
    [mid] = client.publish("orders", [{"n": 1}])
    waiter.join(20)
    assert waiter.error is None and delivered == [mid] and waiter.got["acked"] == 1
    assert 3 <= waiter.seconds < 10  # the wait after it found nothing, then the end


def locks_held(conn: psycopg.Connection) -> list:
    return conn.execute(
        "SELECT classid, objid FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
    ).fetchall()


def test_a_wait_holds_one_share_of_its_lock_however_often_it_began(client, topic_group):
    """A wait cut short before its release (the round trip lost) and a later wait on the same
    session: the later release frees the subscription, not one share of two."""
    from redelivery.store import statements as S

    [ids] = client.conn.execute(
        "SELECT t.id, g.id FROM topics t, consumer_groups g WHERE t.name = 'orders' AND g.name = 'billing'"
    ).fetchall()
    ids = dict(zip(("topic_id", "group_id"), ids, strict=True))
    client.conn.execute(S.WAITER_PRESENT, ids)
    client.conn.execute(S.WAITER_PRESENT_AGAIN, ids)  # what the next wait sends after a cut-short one
    assert present(client.conn) == 1
    assert client.conn.execute(S.WAITER_DONE, ids).fetchone() == (True, True)
    assert present(client.conn) == 0 and not locks_held(client.conn)


def test_a_woken_receive_asks_nothing_more_of_its_topic(client, topic_group, database_url, no_recheck):
    """An empty receive asks whether its topic was made again elsewhere (a statement); one that
    waits asks at its re-checks only: not before its wait, nor when a notification (sent for this
    topic) woke it."""
    asked = []

    def receive(c):
        real = c.context.topic_renamed
        c.context.topic_renamed = lambda name: asked.append(name) or real(name)
        return c.receive("billing", "orders", 10, 30, wait_seconds=15)

    waiter = Waiter(database_url, receive)
    waiter.start()
    until_present(client.conn)
    client.publish("orders", [{"n": 0}, {"n": 1}])
    waiter.join(20)
    assert waiter.error is None and len(waiter.got) == 2 and waiter.seconds < 10
    assert asked == []  # no re-check came: patched away


def test_a_wait_on_a_topic_made_again_elsewhere_finds_it_at_a_recheck(
    client, topic_group, database_url, monkeypatch
):
    """The topic deleted and made again by another process while a consumer waits on its old id: no
    notification reaches it (the publish wakes the new topic's waiters), and its next re-check asks
    for the topic again and receives the new topic's message."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 0.3)
    waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=15))
    waiter.start()
    until_present(client.conn)
    with Client(database_url) as admin:
        admin.delete_topic("orders")
        admin.create_topic("orders")
        admin.subscribe("billing", "orders")
        [mid] = admin.publish("orders", [{"n": 1}])
    waiter.join(20)
    assert waiter.error is None and [m.message_id for m in waiter.got] == [mid] and waiter.seconds < 10


def test_a_publish_in_a_long_transaction_keeps_no_consumer_from_waiting(client, topic_group, database_url):
    """A publish inside the caller's open transaction learns whether anybody waits on the topic
    without holding the topic's waiter lock to its commit: a consumer that begins to wait meanwhile
    waits its own wait_seconds, then returns (it did wait for that commit: a wait past its bound)."""
    client.conn.execute("BEGIN")
    client.publish("orders", [{"n": 1}], retry=False)  # the COPY's way, in a savepoint of the caller's
    try:
        waiter = Waiter(database_url, lambda c: c.receive("billing", "orders", 10, 30, wait_seconds=1.5))
        waiter.start()
        waiter.join(20)
        assert waiter.error is None and waiter.got == [] and waiter.seconds < 6
    finally:
        client.conn.execute("ROLLBACK")


def statements_of(monkeypatch, conn: psycopg.Connection) -> list[str]:
    """The names of the statements ``conn`` sends from now on (``/* redelivery:NAME */``; LISTEN and
    UNLISTEN by their verb)."""
    sent: list[str] = []
    real = psycopg.Cursor.execute

    def execute(self, query, *args, **kwargs):
        if self.connection is conn:
            text = query if isinstance(query, str) else query.as_string(conn)
            sent.append(text.split(":", 1)[1].split(" ", 1)[0] if "redelivery:" in text else text.split()[0])
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    return sent


def test_a_consumer_whose_last_wait_found_nothing_says_it_waits_before_it_receives(
    client, topic_group, database_url, monkeypatch
):
    """A receive that may wait, of a subscription whose last such receive found nothing at once,
    LISTENs and says it waits first, then receives once (not a receive, the LISTEN, and the
    receive again); one that then finds a message at once makes the next receive the plain one."""
    with Client(database_url) as consumer:
        assert consumer.receive("billing", "orders", 10, 30, wait_seconds=0.2) == []
        [mid] = client.publish("orders", [{"n": 1}])
        sent = statements_of(monkeypatch, consumer.conn)
        assert [m.message_id for m in consumer.receive("billing", "orders", 10, 30, wait_seconds=5)] == [mid]
        # (the ordering asked again: the empty wait's last receive came after a re-check)
        assert sent == [
            "LISTEN",
            "WAITER_PRESENT",
            "SUBSCRIPTION_ORDERING",
            "RECEIVE",
            "WAITER_DONE",
            "UNLISTEN",
        ]
        [mid] = client.publish("orders", [{"n": 2}])
        sent.clear()
        assert [m.message_id for m in consumer.receive("billing", "orders", 10, 30, wait_seconds=5)] == [mid]
        assert sent == ["RECEIVE"]  # found one at once the last time: no LISTEN
        assert present(client.conn) == 0


def test_a_wait_whose_release_was_cut_short_leaves_no_waiter_behind(client, topic_group, database_url):
    """A wait whose release round trip is cut short (an interrupt) leaves its backend holding the
    waiter lock while it waits no more: a notifier could pick it in a waiting consumer's stead.
    The client's next wait, on another subscription, releases it first; on the same one, it says
    it waits again without a second share, and its release frees the subscription."""
    from redelivery.store import statements as S

    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    with Client(database_url) as consumer:
        real = consumer.conn.execute

        def cut_short(query, *args, **kwargs):
            if query is S.WAITER_DONE:
                raise KeyboardInterrupt
            return real(query, *args, **kwargs)

        for then in ("refunds", "orders"):
            consumer.conn.execute = cut_short
            with pytest.raises(KeyboardInterrupt):
                consumer.receive("billing", "orders", 10, 30, wait_seconds=0.2)
            assert present(client.conn) == 1  # left behind: it waits no more
            del consumer.conn.execute
            assert consumer.receive("billing", then, 10, 30, wait_seconds=0.2) == []
            assert present(client.conn) == 0
            assert not locks_held(consumer.conn)


def test_a_client_whose_connection_was_swapped_and_back_takes_no_second_share(
    client, topic_group, database_url
):
    """What a client knows of a session's waiter locks belongs to that connection: a release cut
    short on one connection, a wait on another set in its place, then the first set back: the
    next receive there releases what was left, and no share piles up."""
    from redelivery.store import db
    from redelivery.store import statements as S

    with Client(database_url) as consumer, db.connect(database_url, autocommit=True) as other:
        first, real = consumer.conn, consumer.conn.execute

        def cut_short(query, *args, **kwargs):
            if query is S.WAITER_DONE:
                raise KeyboardInterrupt
            return real(query, *args, **kwargs)

        first.execute = cut_short
        with pytest.raises(KeyboardInterrupt):
            consumer.receive("billing", "orders", 10, 30, wait_seconds=0.2)
        del first.execute
        consumer.conn = other
        assert consumer.receive("billing", "orders", 10, 30, wait_seconds=0.2) == []
        assert not locks_held(other)
        consumer.conn = first
        assert consumer.receive("billing", "orders", 10, 30, wait_seconds=0.2) == []
        assert present(client.conn) == 0 and not locks_held(first)
