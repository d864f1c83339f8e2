"""Every number of the source documents (shared/seeds, digest in their README) against the code.
Pure: no server. Each test names its seed."""

import random

import pytest

from redelivery.client import MAX_INVISIBLE_SECONDS
from redelivery.config import RedeliveryConfig
from redelivery.errors import InvalidDelayError, InvalidLevelError, TooManyRequestsError
from redelivery.messaging import codec
from redelivery.messaging.producer import MIN_CONNECT_TIMEOUT, SendBackoff
from redelivery.rules.levels import (
    MAX_DELAY_SECONDS,
    MIN_DELAY_SECONDS,
    ROCKETMQ_BROKER_LEVELS,
    ROCKETMQ_RETRY_LEVELS,
    LevelTable,
    check_delay,
)
from redelivery.rules.policies import PRESETS, PolicyConfig, resolve

ROUTING = LevelTable.parse(ROCKETMQ_RETRY_LEVELS)


def policy(broker: str, *entries, topic="orders", group="billing"):
    return resolve([PolicyConfig.model_validate(e) for e in entries], broker, topic, group)


# ---- 000: TDMQ Pulsar -------------------------------------------------------------------------


def test_000_reconsume_later_delay_range_is_1_to_864000_seconds():
    assert (MIN_DELAY_SECONDS, MAX_DELAY_SECONDS) == (1, 864_000)
    assert check_delay(1) == 1 and check_delay(864_000) == 864_000
    for bad in (0, 864_001):
        with pytest.raises(InvalidDelayError):
            check_delay(bad)


def test_000_message_delay_level_1_is_1s_and_3_is_10s():
    table = LevelTable.parse(ROCKETMQ_BROKER_LEVELS)
    assert len(table) == 18 and table.delay(1) == 1 and table.delay(3) == 10 and table.delay(18) == 7200
    pulsar = policy("pulsar")
    assert pulsar.explicit_delay(1, ROUTING) == 1 and pulsar.explicit_delay(3, ROUTING) == 10
    with pytest.raises(InvalidLevelError):
        pulsar.explicit_delay(19, ROUTING)


def test_000_level_increment_waits_1s_then_5s():
    assert [policy("pulsar").base_delay(n) for n in (1, 2, 3)] == [1, 5, 10]


def test_000_retry_and_dead_letter_topic_names_and_retry_properties():
    pulsar = policy("pulsar")
    assert (pulsar.retry_name, pulsar.dlq_name) == ("orders-billing-RETRY", "orders-billing-DLQ")
    assert codec.RETRY_PROPERTIES == ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUMETIMES")
    props = codec.retry_properties(
        {}, topic="orders", origin_message_id=7, retry_topic="x", reconsume_times=16
    )
    assert props["RECONSUMETIMES"] == "16"


# ---- 001: RocketMQ 5 --------------------------------------------------------------------------


def test_001_retry_intervals_for_retries_1_to_16_then_2h():
    expected = [10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
    rocketmq = policy("rocketmq")
    assert [rocketmq.base_delay(n) for n in range(1, 17)] == expected
    assert rocketmq.base_delay(17) == rocketmq.base_delay(100) == 7200


def test_001_max_reconsume_times_16_and_max_3_means_4_deliveries():
    assert policy("rocketmq").max_reconsume_times == 16
    assert policy("rocketmq").dead_letters_after() == 17
    assert policy("rocketmq", {"max_reconsume_times": 3}).dead_letters_after() == 4


def test_001_the_default_config_routes_the_16_levels():
    assert RedeliveryConfig().level_table == ROUTING and len(ROUTING) == 16


def test_001_invisible_duration_has_an_upper_bound():
    assert MAX_INVISIBLE_SECONDS == 43_200  # 12 h (ours; the seed only says it is set per receive)


# ---- 002: producer send retry -----------------------------------------------------------------


def test_002_send_backoff_constants():
    cfg = RedeliveryConfig().producer
    assert (cfg.initial_backoff, cfg.multiplier, cfg.jitter, cfg.max_backoff) == (1.0, 1.6, 0.2, 120.0)
    assert MIN_CONNECT_TIMEOUT == 20
    backoff = SendBackoff(1.0, 1.6, 0.0, 120.0)
    assert [round(backoff.wait(k), 3) for k in (1, 2, 3)] == [1.0, 1.6, 2.56] and backoff.wait(30) == 120.0
    jittered = SendBackoff(1.0, 1.6, 0.2, 120.0, rng=random.Random(1))
    assert all(1.6 * 0.8 <= jittered.wait(2) <= 1.6 * 1.2 for _ in range(200))


def test_002_flow_control_is_code_530():
    assert TooManyRequestsError.code == 530


# ---- 003: RocketMQ retry internals ------------------------------------------------------------


def test_003_delay_level_is_3_plus_reconsume_times_on_the_18_level_string():
    broker = policy("rocketmq", {"backoff": {"kind": "rocketmq_broker"}})
    # retry n has reconsumeTimes n-1 before it: level 3 + (n - 1)
    assert [broker.base_delay(n) for n in (1, 2, 3)] == [10, 30, 60]
    assert broker.base_delay(16) == 7200 and broker.base_delay(40) == 7200  # past level 18: level 18


def test_003_an_explicit_level_indexes_the_broker_string_and_is_clamped():
    rocketmq = policy("rocketmq")
    assert rocketmq.explicit_delay(1, ROUTING) == 1 and rocketmq.explicit_delay(3, ROUTING) == 10
    assert rocketmq.explicit_delay(99, ROUTING) == 7200  # above the table: its last level


def test_003_retry_and_dead_letter_queue_names():
    rocketmq = policy("rocketmq")
    assert (rocketmq.retry_name, rocketmq.dlq_name) == ("%RETRY%billing", "%DLQ%billing")


# ---- 004: ActiveMQ Artemis --------------------------------------------------------------------


def test_004_defaults():
    defaults = PRESETS["artemis"]["backoff"]
    assert (defaults.redelivery_delay_ms, defaults.redelivery_delay_multiplier) == (0, 1.0)
    assert defaults.redelivery_collision_avoidance_factor == 0.0
    assert PRESETS["artemis"]["max_delivery_attempts"] == 10
    artemis = policy("artemis")
    assert artemis.max_reconsume_times == 9  # 10 deliveries
    assert artemis.dlq_name == "DLQ.orders"  # dead-letter-queue-prefix "DLQ.", suffix ""


def test_004_example_5000ms_times_2_max_15000ms():
    example = policy(
        "artemis",
        {
            "backoff": {
                "kind": "exponential",
                "redelivery_delay_ms": 5000,
                "redelivery_delay_multiplier": 2,
                "max_redelivery_delay_ms": 15000,
            }
        },
    )
    assert [example.base_delay(n) for n in (1, 2, 3, 4)] == [5, 10, 15, 15]


def test_004_max_redelivery_delay_defaults_to_ten_times_the_delay():
    tenfold = policy(
        "artemis",
        {"backoff": {"kind": "exponential", "redelivery_delay_ms": 1000, "redelivery_delay_multiplier": 3}},
    )
    assert tenfold.base_delay(10) == 10.0


def test_004_unlimited_delivery_attempts_and_collision_factor_range():
    assert policy("artemis", {"max_delivery_attempts": -1}).max_reconsume_times == -1
    for factor in (-0.1, 1.1):
        with pytest.raises(ValueError):
            PolicyConfig.model_validate(
                {"backoff": {"kind": "exponential", "redelivery_collision_avoidance_factor": factor}}
            )
