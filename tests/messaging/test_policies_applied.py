"""Policies acting on a real PostgreSQL: backoff, naming, lease expiry, levels, attempt history."""

import json

import pytest

from helpers import at, configured, run_cli
from redelivery.errors import InvalidLevelError


def due_and_level(client, mid):
    return client.conn.execute(
        "SELECT due_at, delay_level FROM deliveries WHERE message_id = %s", (mid,)
    ).fetchone()


def test_artemis_backoff_and_naming_on_nack(client, topic_group, database_url):
    from redelivery.tiers.run import TierRunRequest, run_tier

    config = configured(
        client,
        {
            "backoff": {
                "kind": "exponential",
                "redelivery_delay_ms": 5000,
                "redelivery_delay_multiplier": 2,
                "max_redelivery_delay_ms": 15000,
            },
            "max_delivery_attempts": 3,
            "dead_letter": {"style": "artemis"},
            "retry_naming": {"style": "artemis"},
        },
    )
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    clock = 0
    for expected in (5, 10):
        [got] = client.receive("billing", "orders", 1, 30, at=at(clock))
        client.nack("billing", got, error="nope", at=at(clock))
        due, level = due_and_level(client, mid)
        assert due == at(clock + expected) and level == 1
        run_tier(
            TierRunRequest(tier="seconds", window_end=due, run_key=f"a{expected}"),
            url=database_url,
            config=config,
        )
        clock += expected
    [third] = client.receive("billing", "orders", 1, 30, at=at(clock))
    assert third.delivery_count == 3 and third.properties["RETRY_TOPIC"] == "orders"
    client.nack("billing", third, error="third", at=at(clock))  # max-delivery-attempts 3: dead
    [dead] = client.dlq_list("billing")
    assert dead["dead_letter_queue"] == "DLQ.orders" and dead["delivery_count"] == 3
    assert client.conn.execute('SELECT count(*) FROM redelivery_dlq."DLQ.orders"').fetchone()[0] == 1


def test_lease_expiry_follows_the_policy(client, topic_group, database_url):
    from redelivery.tiers.run import TierRunRequest, run_tier

    config = configured(
        client, {"backoff": {"kind": "fixed", "interval": "3s"}, "dead_letter": {"style": "pulsar"}}
    )
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    client.receive("billing", "orders", 1, 20, at=at(0))
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="lease-policy"),
        url=database_url,
        config=config,
    )
    assert summary["retried_after_lease_expiry"] == 1
    assert due_and_level(client, mid) == (at(23), 1)


def test_a_jittered_wait_in_sql_is_at_most_864000_seconds(client, topic_group, database_url):
    """The nack's wait is computed in SQL (statements.NEXT_DELAY, collision avoidance included), as
    is a lease expiry's: both hold the bound of one wait at most 864,000 s (docs/configuration.md)
    for the longest policy the config takes (delay 864,000,000 ms, collision avoidance factor 1.0)."""
    from redelivery.tiers.run import TierRunRequest, run_tier

    config = configured(
        client,
        {
            "backoff": {
                "kind": "exponential",
                "redelivery_delay_ms": 864_000_000,
                "redelivery_delay_multiplier": 1.0,
                "redelivery_collision_avoidance_factor": 1.0,
            }
        },
        broker="artemis",
    )
    ids = client.publish("orders", [{"n": i} for i in range(200)], at=at(0))
    got = client.receive("billing", "orders", 200, 30, at=at(0))
    client.nack("billing", got[:100], error="nope", at=at(0))  # 100 waits computed by the nack
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(30), run_key="jitter"), url=database_url, config=config
    )
    assert summary["retried_after_lease_expiry"] == 100  # 100 by the lease expiry, from at(30)
    waits = client.conn.execute(
        """SELECT extract(epoch FROM due_at - CASE WHEN message_id = ANY(%s) THEN %s ELSE %s END)::float8
           FROM deliveries WHERE state = 'WAITING_RETRY'""",
        ([m.message_id for m in got[:100]], at(0), at(30)),
    ).fetchall()
    assert len(waits) == len(ids)
    assert max(w for (w,) in waits) == 864_000  # P(no wait drawn above it) = 2**-200
    assert min(w for (w,) in waits) > 0


def test_negative_level_dead_letters_and_explicit_levels_follow_the_policy(client, topic_group):
    configured(client, {"explicit_levels": "1s 5s 10s", "dead_letter": {"style": "pulsar"}}, broker="pulsar")
    client.publish("orders", [{"n": 1}, {"n": 2}], at=at(0))
    a, b = client.receive("billing", "orders", 2, 30, at=at(0))
    with pytest.raises(InvalidLevelError, match="levels 1..3"):  # Pulsar: no level above the table
        client.reconsume_later("billing", a, level=4)
    client.reconsume_later("billing", a, level=3, at=at(0))
    assert due_and_level(client, a.message_id) == (at(10), 1)
    assert client.reconsume_later("billing", b, level=-1, error="poison", at=at(0)) == 1
    [dead] = client.dlq_list("billing")
    assert (dead["reason"], dead["dead_letter_queue"], dead["last_error"]) == (
        "NEGATIVE_LEVEL",
        "orders-billing-DLQ",
        "poison",
    )
    assert dead["attempts"][-1]["outcome"] == "negative_level"


def test_attempt_history_is_bounded(client, topic_group):
    client.create_group("billing", max_reconsume_times=-1)
    [mid] = client.publish("orders", [{"n": 1}])
    for n in range(1, 26):
        [got] = client.receive("billing", "orders", 1, 30)
        client.nack("billing", got, error=f"fail {n}")
        client.conn.execute("UPDATE deliveries SET state = 'READY' WHERE message_id = %s", (mid,))
    history = client.conn.execute("SELECT attempts FROM deliveries WHERE message_id = %s", (mid,)).fetchone()[
        0
    ]
    assert len(history) == 20 and history[0]["error"] == "fail 6" and history[-1]["error"] == "fail 25"
    assert history[-1]["delivery"] == 25 and history[-1]["outcome"] == "nack"


def test_policy_show_cli(clean_db):
    done = run_cli(
        "policy", "show", "--topic", "orders", "--group", "billing", "--json", database_url=clean_db
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["waits_seconds"][:3] == [10, 30, 60] and data["waits_seconds"][16:] == [7200] * 4
    assert len(data["waits_seconds"]) == 20 and data["dead_letters_after_delivery"] == 17
    assert data["dead_letter_queue"] == "%DLQ%billing"
