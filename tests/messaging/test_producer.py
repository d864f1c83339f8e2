"""The producer: send retry backoff (RocketMQ cloud, "Send retry and flow control"), retries of a
killed connection, flow control (530)."""

import pytest

from helpers import at, configured


def test_send_backoff_follows_seed_002():
    from redelivery.messaging.producer import SendBackoff

    exact = SendBackoff(1.0, 1.6, 0.0, 120.0)
    assert [round(exact.wait(k), 4) for k in range(1, 6)] == [1.0, 1.6, 2.56, 4.096, 6.5536]
    assert exact.wait(20) == 120.0
    jittered = SendBackoff(1.0, 1.6, 0.2, 120.0)
    assert jittered.wait(1) == 1.0  # the first wait is INITIAL_BACKOFF
    assert all(0.8 * 2.56 <= jittered.wait(3) <= 1.2 * 2.56 for _ in range(100))


def test_publish_survives_a_killed_connection_and_publishes_once(client, topic_group, clean_db):
    import psycopg

    configured(client)
    pid = client.conn.info.backend_pid
    with psycopg.connect(clean_db, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    ids = client.publish("orders", [{"n": i} for i in range(10)])
    assert len(ids) == 10 and client.publish_waits == [0.01]
    assert client.conn.info.backend_pid != pid
    assert client.stats()["orders"]["billing"]["READY"] == 10


def test_publish_gives_up_after_the_configured_attempts(client, topic_group, clean_db):
    import psycopg

    configured(client)
    with psycopg.connect(clean_db, autocommit=True) as locker:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE redelivery.messages IN ACCESS EXCLUSIVE MODE")
        client.conn.execute("SET lock_timeout = '50ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            client.publish("orders", [{"n": 1}])
        assert len(client.publish_waits) == 2  # 3 attempts, 2 waits
        locker.execute("ROLLBACK")
    assert client.stats()["orders"]["billing"]["READY"] == 0


def test_flow_control_on_publish_and_promotion(client, topic_group, database_url):
    from redelivery.errors import TooManyRequestsError
    from redelivery.tiers.run import TierRunRequest, run_tier

    config = configured(client, {"topic": "orders", "max_ready_backlog": 10})
    client.publish("orders", [{"n": i} for i in range(8)], at=at(0))
    with pytest.raises(TooManyRequestsError, match="530") as caught:
        client.publish("orders", [{"n": i} for i in range(5)], at=at(0))
    assert caught.value.code == 530 and len(client.publish_waits) == 2
    assert client.stats()["orders"]["billing"]["READY"] == 8
    # all 8 fail and wait; meanwhile 6 more are published: promotion may fill only 4 places
    client.nack("billing", client.receive("billing", "orders", 8, 30, at=at(0)), at=at(0))
    client.publish("orders", [{"n": i} for i in range(6)], at=at(1))
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="cap-1"), url=database_url, config=config
    )
    assert summary["promoted"] == 4 and summary["held_back_by_backlog_cap"] == 4
    stats = client.stats()["orders"]["billing"]
    assert (stats["READY"], stats["WAITING_RETRY"]) == (10, 4)
    client.ack("billing", client.receive("billing", "orders", 10, 30, at=at(10)))
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="cap-2"), url=database_url, config=config
    )
    assert summary["promoted"] == 4 and summary["held_back_by_backlog_cap"] == 0
    assert summary["lateness_seconds"]["max"] == 10.0  # held back one window, promoted late but never early
