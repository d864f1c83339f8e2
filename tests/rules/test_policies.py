"""Policies: every formula against the source documents' own numbers, wildcard precedence, naming,
presets and config errors. Pure: no database, Spark or Airflow."""

import pytest
from pydantic import ValidationError

from redelivery.config import RedeliveryConfig
from redelivery.rules.levels import LevelTable
from redelivery.rules.policies import PolicyConfig, compare_specificity, matches, resolve

ROUTING = LevelTable.parse("10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")


def policy(broker="rocketmq", topic="orders", group="billing", *entries):
    return resolve([PolicyConfig.model_validate(e) for e in entries], broker, topic, group)


def waits(p, n):
    return [p.base_delay(k) for k in range(1, n + 1)]


# ---- formulas ---------------------------------------------------------------------------------


def test_rocketmq_default_table_then_2h_and_16_reconsume_times():
    p = policy()
    assert waits(p, 18) == [
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        360,
        420,
        480,
        540,
        600,
        1200,
        1800,
        3600,
        7200,
        7200,
        7200,
    ]
    assert p.max_reconsume_times == 16 and p.dead_letters_after() == 17


def test_artemis_seed_example_5000ms_x2_max_15000():
    p = policy(
        "rocketmq",
        "orders",
        "billing",
        {
            "backoff": {
                "kind": "exponential",
                "redelivery_delay_ms": 5000,
                "redelivery_delay_multiplier": 2,
                "max_redelivery_delay_ms": 15000,
            }
        },
    )
    assert waits(p, 4) == [5.0, 10.0, 15.0, 15.0]


def test_artemis_max_redelivery_delay_defaults_to_ten_times_the_delay():
    p = policy(
        "rocketmq",
        "orders",
        "billing",
        {"backoff": {"kind": "exponential", "redelivery_delay_ms": 1000, "redelivery_delay_multiplier": 2}},
    )
    assert waits(p, 6) == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


class Draws:
    """Stands in for java.util.Random in the seed's example: the values it says were drawn."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def test_artemis_collision_avoidance_reproduces_the_seed_example():
    p = policy(
        "rocketmq",
        "orders",
        "billing",
        {
            "backoff": {
                "kind": "exponential",
                "redelivery_delay_ms": 1000,
                "redelivery_delay_multiplier": 1,
                "max_redelivery_delay_ms": 15000,
                "redelivery_collision_avoidance_factor": 0.5,
            }
        },
    )
    # collision avoidance (Artemis, "Message redelivery and undelivered messages"):
    # 875 = 1000 + 1000 * ((0.5 * -1) * .25); 1375 = 1000 + 1000 * ((0.5 * 1) * .75); 975
    assert round(p.delay(1, Draws(0.1, 0.25)) * 1000) == 875
    assert round(p.delay(2, Draws(0.9, 0.75)) * 1000) == 1375
    assert round(p.delay(3, Draws(0.1, 0.05)) * 1000) == 975
    import random

    samples = [p.delay(1, random.Random(i)) for i in range(200)]
    assert min(samples) >= 0.5 and max(samples) <= 1.5 and len(set(samples)) > 100


#: The longest wait the config accepts, with the largest collision avoidance
#: (Artemis, "Message redelivery and undelivered messages").
LONGEST_JITTERED = {
    "backoff": {
        "kind": "exponential",
        "redelivery_delay_ms": 864_000_000,
        "redelivery_delay_multiplier": 1.0,
        "redelivery_collision_avoidance_factor": 1.0,
    }
}


def test_collision_avoidance_never_waits_longer_than_864000_seconds():
    """docs/configuration.md: one wait at most 864,000 s. The config takes this policy, whose waits
    moved up by collision avoidance would reach ~1,727,000 s: they are cut to 864,000 s."""
    import random

    p = policy("artemis", "orders", "billing", LONGEST_JITTERED)
    assert p.base_delay(1) == 864_000
    assert p.delay(1, Draws(0.9, 0.999)) == 864_000  # up: cut
    assert p.delay(1, Draws(0.1, 0.5)) == 432_000  # down: as Artemis computes it
    samples = [p.delay(n, random.Random(n)) for n in range(1, 400)]
    assert max(samples) == 864_000 and min(samples) > 0
    assert len({s for s in samples if s < 864_000}) > 100  # below the bound the jitter is kept
    from redelivery.rules.levels import MAX_DELAY_SECONDS
    from redelivery.store import statements as S

    assert MAX_DELAY_SECONDS == 864_000 and S.NEXT_DELAY.rstrip().endswith(", 864000)")  # SQL's bound


def test_rocketmq_broker_rule_delay_level_is_3_plus_reconsume_times():
    p = policy("rocketmq", "orders", "billing", {"backoff": {"kind": "rocketmq_broker"}})
    # 18-level string 1s 5s 10s 30s 1m ...: retry 1 (reconsume times 0) is level 3 = 10s; level 18 = 2h
    assert waits(p, 3) == [10, 30, 60]
    assert p.base_delay(16) == 7200 and p.base_delay(30) == 7200


def test_rocketmq_exponential_and_fixed():
    exp = policy(
        "rocketmq",
        "o",
        "g",
        {"backoff": {"kind": "rocketmq_exponential", "initial": "1s", "multiplier": 2, "max": "1m"}},
    )
    assert waits(exp, 8) == [1, 2, 4, 8, 16, 32, 60, 60]
    fixed = policy("rocketmq", "o", "g", {"backoff": {"kind": "fixed", "interval": "3s"}})
    assert waits(fixed, 3) == [3, 3, 3]


def test_custom_level_string_replaces_the_table():
    p = policy("rocketmq", "o", "g", {"backoff": {"kind": "levels", "levels": "1s 5s 10s 30s 1m 2m"}})
    assert waits(p, 8) == [1, 5, 10, 30, 60, 120, 120, 120]
    # an explicit level still indexes the broker's 18 levels, RocketMQ's delayLevelWhenNextConsume
    # (RocketMQ broker, "RocketMQ message retry")
    assert p.explicit_delay(3, ROUTING) == 10 and p.explicit_delay(40, ROUTING) == 7200


def test_schedule_lists_retries_until_the_wait_stops_changing():
    p = policy(
        "rocketmq",
        "o",
        "g",
        {"backoff": {"kind": "rocketmq_exponential", "initial": "10s", "multiplier": 2, "max": "2m"}},
    )
    delays, levels = p.schedule(ROUTING)
    assert delays == [10, 20, 40, 80, 120]
    assert levels == [1, 2, 3, 4, 4]  # routed to the first level at least as long


@pytest.mark.parametrize(
    "entry,max_times",
    [
        ({"max_delivery_attempts": 3}, 2),  # Artemis counts deliveries: 3 deliveries = 2 retries
        ({"max_delivery_attempts": -1}, -1),
        ({"max_reconsume_times": 3}, 3),  # RocketMQ: max retries 3 means at most 4 deliveries
        ({"max_reconsume_times": -1}, -1),
    ],
)
def test_attempt_limits(entry, max_times):
    assert policy("rocketmq", "o", "g", entry).max_reconsume_times == max_times


def test_presets():
    rocket, pulsar, artemis = (policy(b) for b in ("rocketmq", "pulsar", "artemis"))
    assert (rocket.dlq_name, rocket.retry_name) == ("%DLQ%billing", "%RETRY%billing")
    assert (pulsar.dlq_name, pulsar.retry_name) == ("orders-billing-DLQ", "orders-billing-RETRY")
    assert pulsar.max_reconsume_times == 16 and waits(pulsar, 3) == [1, 5, 10]
    assert (artemis.dlq_name, artemis.retry_name) == ("DLQ.orders", "orders")
    assert artemis.max_reconsume_times == 9 and artemis.dead_letters_after() == 10  # max-delivery-attempts 10
    assert waits(artemis, 2) == [0.0, 0.0]  # redelivery-delay 0


def test_naming_styles():
    assert (
        policy(
            "rocketmq", "o", "g", {"dead_letter": {"style": "artemis", "prefix": "", "suffix": ".DLQ"}}
        ).dlq_name
        == "o.DLQ"
    )
    assert (
        policy("rocketmq", "o", "g", {"dead_letter": {"style": "explicit", "name": "poison"}}).dlq_name
        == "poison"
    )
    with pytest.raises(ValueError, match="63 bytes"):
        policy("pulsar", "t" * 40, "g" * 30)


# ---- wildcards --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern,name,expected",
    [
        ("news.europe.#", "news.europe", True),
        ("news.europe.#", "news.europe.sport", True),
        ("news.europe.#", "news.europe.politics.regional", True),
        ("news.europe.#", "news.usa", False),
        ("news.*", "news.europe", True),
        ("news.*", "news.europe.sport", False),
        ("news.*.sport", "news.usa.sport", True),
        ("news.*.sport", "news.europe.politics", False),
        ("#", "anything.at.all", True),
        ("orders", "orders", True),
        ("orders", "orders2", False),
    ],
)
def test_artemis_wildcards(pattern, name, expected):
    assert matches(pattern, name) is expected


def test_artemis_specificity_order():
    ordered = sorted(
        ["#", "news.#", "news.europe.#", "news.*", "news.*.sport", "news.europe.sport"],
        key=__import__("functools").cmp_to_key(compare_specificity),
    )
    assert ordered == ["news.europe.sport", "news.*.sport", "news.*", "news.europe.#", "news.#", "#"]


def test_most_specific_wins_and_less_specific_fills_the_rest():
    entries = [
        {"topic": "#", "max_reconsume_times": 5, "dead_letter": {"style": "pulsar"}},
        {"topic": "orders.#", "backoff": {"kind": "fixed", "interval": "7s"}, "max_reconsume_times": 4},
        {"topic": "orders.eu", "group": "billing", "max_reconsume_times": 2},
        {"topic": "orders.eu", "group": "*", "max_reconsume_times": 3},
    ]
    p = policy("rocketmq", "orders.eu", "billing", *entries)
    assert p.max_reconsume_times == 2 and waits(p, 1) == [7] and p.dlq_name == "orders.eu-billing-DLQ"
    assert policy("rocketmq", "orders.eu", "audit", *entries).max_reconsume_times == 3
    assert policy("rocketmq", "orders.us", "audit", *entries).max_reconsume_times == 4
    other = policy("rocketmq", "invoices", "audit", *entries)
    assert other.max_reconsume_times == 5 and waits(other, 1) == [10]


def test_a_more_specific_attempt_limit_replaces_the_other_kind():
    p = policy("artemis", "orders", "billing", {"topic": "orders", "max_reconsume_times": 4})
    assert p.max_reconsume_times == 4  # not the preset's max-delivery-attempts 10


def test_group_own_limit_wins_over_policies():
    p = resolve([PolicyConfig(max_reconsume_times=3)], "rocketmq", "o", "g", group_max_reconsume_times=7)
    assert p.max_reconsume_times == 7


@pytest.mark.parametrize(
    "entry,needle",
    [
        ({"max_reconsume_times": 3, "max_delivery_attempts": 3}, "not both"),
        ({"max_delivery_attempts": 0}, "at least 1"),
        ({"topic": "orders.#x"}, "wildcard"),
        ({"backoff": {"kind": "sometimes"}}, "kind"),
        ({"backoff": {"kind": "exponential", "redelivery_collision_avoidance_factor": 1.5}}, "collision"),
        ({"backoff": {"kind": "exponential", "redelivery_delay_multiplier": 0.5}}, "multiplier"),
        ({"backoff": {"kind": "fixed", "interval": "soon"}}, "duration"),
        ({"backoff": {"kind": "levels", "levels": "1s 1x"}}, "duration"),
        ({"dead_letter": {"style": "explicit"}}, "explicit name"),
        ({"dead_letter": {"style": "explicit", "name": "bad name"}}, "explicit name"),
        ({"max_ready_backlog": 0}, "max_ready_backlog"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_policy_is_a_clear_error(entry, needle):
    with pytest.raises(ValidationError) as caught:
        RedeliveryConfig.model_validate(
            {"tiers": [{"name": "all", "levels": list(range(1, 17)), "window": "10s"}], "policies": [entry]}
        )
    assert needle in str(caught.value)
