"""Delay levels and the configuration file (unit tests: no database)."""

import pytest

from redelivery.config import load_config
from redelivery.errors import ConfigError, InvalidDelayError, InvalidLevelError
from redelivery.rules.levels import (
    ROCKETMQ_BROKER_LEVELS,
    ROCKETMQ_RETRY_LEVELS,
    LevelTable,
    check_delay,
    parse_duration,
)


def test_rocketmq_retry_table_matches_seed_001():
    table = LevelTable.parse(ROCKETMQ_RETRY_LEVELS)
    minutes = [table.delay(table.level_for_retry(n)) for n in range(1, 21)]
    assert minutes == [
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
        7200,
        7200,
    ]  # after 16 retries every retry waits 2h


def test_broker_level_string_has_18_levels_level_3_is_10s():
    table = LevelTable.parse(ROCKETMQ_BROKER_LEVELS)
    assert len(table) == 18
    assert table.delay(1) == 1 and table.delay(3) == 10 and table.delay(18) == 7200


@pytest.mark.parametrize("text,seconds", [("1s", 1), ("30s", 30), ("2m", 120), ("1h", 3600), ("1d", 86400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "0s", "-1s", "1w", "1.5m", "s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_level_for_delay_routes_to_first_level_at_least_as_long():
    table = LevelTable.parse(ROCKETMQ_RETRY_LEVELS)
    assert table.level_for_delay(1) == 1
    assert table.level_for_delay(10) == 1
    assert table.level_for_delay(11) == 2
    assert table.level_for_delay(45) == 3
    assert table.level_for_delay(864000) == 16


@pytest.mark.parametrize("level", [0, -1, 17, 1.5, True, "3"])
def test_level_out_of_range(level):
    with pytest.raises(InvalidLevelError, match="out of range"):
        LevelTable.parse(ROCKETMQ_RETRY_LEVELS).delay(level)


@pytest.mark.parametrize("delay", [0, -5, 864001, 2.5, True])
def test_delay_out_of_range(delay):
    with pytest.raises(InvalidDelayError, match="1 to 864000"):
        check_delay(delay)


def test_delay_bounds_accepted():
    assert check_delay(1) == 1 and check_delay(864000) == 864000


def test_shipped_config_is_valid_and_covers_every_level():
    config = load_config()
    covered = sorted(level for tier in config.tiers for level in tier.levels)
    assert covered == list(range(1, 17))
    assert config.broker == "rocketmq" and config.policy_for("orders", "billing").max_reconsume_times == 16


def write(tmp_path, text):
    path = tmp_path / "redelivery.yaml"
    path.write_text(text)
    return path


GOOD_TIERS = """
tiers:
  - {name: fast, levels: [1, 2], window: 10s}
  - {name: slow, levels: [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], window: 1m}
"""


@pytest.mark.parametrize(
    "text,needle",
    [
        ("tiers: [", "not valid YAML"),
        ("- just a list", "must be a mapping"),
        ("tiers: []", "tiers"),
        (GOOD_TIERS + "colour: blue\n", "colour"),
        (GOOD_TIERS.replace("10s", "ten seconds"), "tiers.0.window"),
        (GOOD_TIERS.replace("[1, 2]", "[1, 2, 3]"), "level 3 is in both tier 'fast' and tier 'slow'"),
        (GOOD_TIERS.replace("[1, 2]", "[1]"), "levels [2] belong to no tier"),
        (GOOD_TIERS.replace("[1, 2]", "[1, 2, 17]"), "lists level 17"),
        (GOOD_TIERS.replace("name: fast", "name: Fast Tier"), "tiers.0.name"),
        ("policies: [{max_reconsume_times: -2}]\n" + GOOD_TIERS, "policies.0.max_reconsume_times"),
        ("broker: kafka\n" + GOOD_TIERS, "broker"),
        ("delay_levels: '10s banana'\n" + GOOD_TIERS, "delay_levels"),
        # every computed wait fits: one wait at most 864000 s, multipliers bounded
        (
            "delay_levels: '10s 11d'\n"
            + GOOD_TIERS.replace(", 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16", ""),
            "longer than 864000",
        ),
        (
            "policies: [{backoff: {kind: exponential, redelivery_delay_multiplier: 1e9}}]\n" + GOOD_TIERS,
            "policies.0.backoff.exponential.redelivery_delay_multiplier",
        ),
        (
            "policies: [{backoff: {kind: exponential, redelivery_delay_ms: 900000001}}]\n" + GOOD_TIERS,
            "redelivery_delay_ms",
        ),
        ("policies: [{backoff: {kind: fixed, interval: 20d}}]\n" + GOOD_TIERS, "longer than 864000"),
        ("policies: [{max_reconsume_times: 2147483648}]\n" + GOOD_TIERS, "policies.0.max_reconsume_times"),
        ("policies: [{max_ready_backlog: 2147483648}]\n" + GOOD_TIERS, "policies.0.max_ready_backlog"),
        ("policies: [{explicit_levels: '1s x'}]\n" + GOOD_TIERS, "policies.0.explicit_levels"),
        ("retention: {publish_batches: 11y}\n" + GOOD_TIERS, "retention.publish_batches"),
        ("producer: {multiplier: 1000}\n" + GOOD_TIERS, "producer.multiplier"),
    ],
)
def test_broken_config_names_the_bad_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert needle in str(caught.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_custom_config_loads(tmp_path):
    config = load_config(write(tmp_path, "policies: [{max_reconsume_times: 3}]\n" + GOOD_TIERS))
    assert config.policy_for("any", "group").max_reconsume_times == 3
    assert config.tier("fast").window_seconds == 10
    with pytest.raises(ConfigError, match="unknown tier"):
        config.tier("medium")


def test_waits_never_overflow_for_any_retry_number():
    from redelivery.rules.policies import PolicyConfig, resolve

    for backoff in (
        {"kind": "exponential", "redelivery_delay_ms": 864_000_000, "redelivery_delay_multiplier": 1000},
        {"kind": "rocketmq_exponential", "initial": "10d", "multiplier": 1000, "max": "10d"},
        {
            "kind": "exponential",
            "redelivery_delay_ms": 1,
            "redelivery_delay_multiplier": 1000,
            "max_redelivery_delay_ms": 864_000_000,
        },
    ):
        policy = resolve([PolicyConfig.model_validate({"backoff": backoff})], "artemis", "t", "g")
        for retry in (1, 2, 50, 10**6, 10**18):
            assert 0 <= policy.base_delay(retry) <= 864_000
        assert (
            policy.describe(LevelTable.parse(ROCKETMQ_RETRY_LEVELS), retries=1000)["waits_seconds"][-1]
            <= 864_000
        )
