"""Tier windows (without Spark: the same ranges applied in-process), re-runs and overlapping runs,
lease expiry, and a consumer process that really crashes."""

import subprocess
import sys
from datetime import UTC

import pytest

from helpers import T0, at, overlapping_tier_runs
from redelivery.config import cached_config
from redelivery.errors import InvalidWindowError
from redelivery.store.catalog import effective_policies, policy_table
from redelivery.tiers.run import TierRunRequest, run_tier
from redelivery.tiers.window import apply_window_range, plan_window


def states(client, group="billing"):
    return client.stats()["orders"][group]


def fail_all(client, n, clock=0, group="billing", **kwargs):
    got = client.receive(group, "orders", n, 30, at=at(clock))
    client.nack(group, got, error="boom", at=at(clock), **kwargs) if not kwargs else client.reconsume_later(
        group, got, error="boom", at=at(clock), **kwargs
    )
    return got


def test_promotes_what_is_due_by_window_end_and_nothing_early(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(10)], at=at(0))
    fail_all(client, 4, clock=0)  # due at 10 s
    fail_all(client, 6, clock=5)  # due at 15 s
    summary = run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="w1"), url=database_url)
    assert summary["promoted"] == 4
    assert summary["by_group"]["billing"]["promoted"] == {"1": 4}
    assert summary["lateness_seconds"] == {"p50": 0.0, "p99": 0.0, "max": 0.0}
    assert states(client)["READY"] == 4 and states(client)["WAITING_RETRY"] == 6
    summary = run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="w2"), url=database_url)
    assert summary["promoted"] == 6 and summary["lateness_seconds"]["max"] == 5.0


def test_a_tier_promotes_only_its_own_levels(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(2)], at=at(0))
    a, b = client.receive("billing", "orders", 2, 30, at=at(0))
    client.reconsume_later("billing", a, delay=10, at=at(0))  # level 1: seconds tier
    client.reconsume_later("billing", b, delay=60, at=at(0))  # level 3: minutes tier
    assert (
        run_tier(TierRunRequest(tier="seconds", window_end=at(3600), run_key="s"), url=database_url)[
            "promoted"
        ]
        == 1
    )
    assert (
        run_tier(TierRunRequest(tier="minutes", window_end=at(3600), run_key="m"), url=database_url)[
            "promoted"
        ]
        == 1
    )


def test_levels_subset(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(2)], at=at(0))
    a, b = client.receive("billing", "orders", 2, 30, at=at(0))
    client.reconsume_later("billing", a, delay=10, at=at(0))  # level 1
    client.reconsume_later("billing", b, delay=30, at=at(0))  # level 2
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(60), run_key="sub", levels=[2]), url=database_url
    )
    assert summary["promoted"] == 1 and summary["by_group"]["billing"]["promoted"] == {"2": 1}
    from redelivery.errors import InvalidLevelError

    with pytest.raises(InvalidLevelError, match="not in tier"):
        run_tier(
            TierRunRequest(tier="seconds", window_end=at(60), run_key="bad", levels=[3]), url=database_url
        )


def test_rerunning_a_window_moves_nothing_twice(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(50)], at=at(0))
    fail_all(client, 50)
    first = run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="again"), url=database_url)
    client.receive("billing", "orders", 20, 30, at=at(10))  # some move on again
    second = run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="again"), url=database_url)
    assert (first["promoted"], second["promoted"]) == (50, 0)
    assert states(client)["READY"] == 30 and states(client)["INFLIGHT"] == 20
    runs = client.conn.execute(
        "SELECT status, summary->>'promoted' FROM tier_runs WHERE run_key = 'again'"
    ).fetchall()
    assert runs == [("success", "0")]  # a re-used run key records the latest run


def test_overlapping_runs_promote_and_dead_letter_each_message_once(client, topic_group, database_url):
    client.create_group("strict", max_reconsume_times=0)
    client.subscribe("strict", "orders")
    client.publish("orders", [{"n": i} for i in range(3000)], at=at(0))
    fail_all(client, 3000)  # billing: due at 10 s
    client.receive("strict", "orders", 3000, 5, at=at(0))  # strict: leases end at 5 s
    results = overlapping_tier_runs(database_url, at(10))
    assert sum(r["promoted"] for r in results) == 3000
    assert sum(r["dead_lettered"] for r in results) == 3000
    dlq = client.conn.execute("SELECT count(*), count(DISTINCT message_id) FROM dlq_messages").fetchone()
    assert dlq == (3000, 3000)
    assert states(client)["READY"] == 3000 and states(client, "strict")["DLQ"] == 3000


def test_ranges_split_candidates_evenly_and_cover_them(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(1000)], at=at(0))
    fail_all(client, 1000)
    ranges = plan_window(client.conn, [1, 2], at(10), 4)
    assert len(ranges) == 4 and ranges[0][0] == 1 and ranges[-1][1] == 1001
    assert all(lo < hi for lo, hi in ranges) and all(
        a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)
    )
    config = cached_config()
    policies = policy_table(client.conn, config, effective_policies(client.conn, config))
    moved = [
        apply_window_range(
            client.conn, tier="seconds", levels=[1, 2], policies=policies, window_end=at(10), low=lo, high=hi
        )
        for lo, hi in ranges
    ]
    sizes = [sum(m.promoted.values()) for m in moved]
    assert sum(sizes) == 1000 and all(abs(n - 250) <= 1 for n in sizes)
    assert plan_window(client.conn, [1, 2], at(10), 4) == []


def test_dry_run_changes_nothing(client, topic_group, database_url):
    from helpers import snapshot

    client.create_group("strict", max_reconsume_times=0)
    client.subscribe("strict", "orders")
    client.publish("orders", [{"n": i} for i in range(5)], at=at(0))
    fail_all(client, 5)
    client.receive("strict", "orders", 5, 5, at=at(0))
    # a dry run changes nothing but its own record in tier_runs (by design: checked below)
    before = snapshot(client.conn, leave_out=("redelivery.tier_runs",))
    assert client.conn.execute("SELECT count(*) FROM tier_runs").fetchone() == (0,)
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="dry", dry_run=True), url=database_url
    )
    assert summary["dry_run"] and summary["promoted"] == 5 and summary["dead_lettered"] == 5
    assert snapshot(client.conn, leave_out=("redelivery.tier_runs",)) == before
    assert client.conn.execute("SELECT run_key, dry_run FROM tier_runs").fetchall() == [("dry", True)]
    assert (
        client.conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'redelivery_dlq'").fetchone()[
            0
        ]
        == 0
    )


def test_window_end_in_the_future_is_refused(client, topic_group, database_url):
    from datetime import datetime, timedelta

    with pytest.raises(InvalidWindowError, match="after the database's clock"):
        run_tier(
            TierRunRequest(tier="seconds", window_end=datetime.now(UTC) + timedelta(hours=1), run_key="f"),
            url=database_url,
        )


def test_lease_expiry_is_a_failed_delivery_until_the_dlq(client, database_url):
    """A consumer that keeps crashing: leases expire, the delivery count is never reset, and the
    message dead-letters with reason LEASE_EXPIRED after max reconsume times + 1 deliveries."""
    client.create_topic("orders")
    client.create_group("crashy", max_reconsume_times=3)
    client.subscribe("crashy", "orders")
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    clock = 0.0
    for attempt in range(1, 5):
        [got] = client.receive("crashy", "orders", 1, 20, at=at(clock))  # then the consumer "dies"
        assert got.delivery_count == attempt
        lease_end = got.invisible_until
        summary = run_tier(
            TierRunRequest(tier="seconds", window_end=lease_end, run_key=f"c{attempt}"), url=database_url
        )
        if attempt < 4:
            assert summary["retried_after_lease_expiry"] == 1
            due = client.conn.execute(
                "SELECT due_at FROM deliveries WHERE message_id = %s", (mid,)
            ).fetchone()[0]
            assert due == lease_end + __import__("datetime").timedelta(seconds=[10, 30, 60][attempt - 1])
            tier = "seconds" if attempt < 3 else "minutes"
            run_tier(TierRunRequest(tier=tier, window_end=due, run_key=f"p{attempt}"), url=database_url)
            clock = (due - T0).total_seconds()
        else:
            assert summary["dead_lettered"] == 1
            assert summary["by_group"]["crashy"]["dead_lettered"] == {"LEASE_EXPIRED": 1}
    [dead] = client.dlq_list("crashy")
    assert (dead["reason"], dead["delivery_count"], dead["reconsume_times"]) == ("LEASE_EXPIRED", 4, 3)
    assert dead["last_error"].startswith("lease expired")


def test_lowered_max_dead_letters_waiting_messages_at_promotion(client, topic_group, database_url):
    client.publish("orders", [{"n": 1}], at=at(0))
    fail_all(client, 1)
    client.create_group("billing", max_reconsume_times=0)  # lowered while the message waits
    summary = run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="lowered"), url=database_url)
    assert summary["promoted"] == 0
    assert summary["by_group"]["billing"]["dead_lettered"] == {"MAX_DELIVERIES_EXCEEDED": 1}


CRASHING_CONSUMER = """
import os, sys
from datetime import datetime
from redelivery.client import Client
c = Client(sys.argv[1])
got = c.receive("billing", "orders", 10, 30, at=datetime.fromisoformat(sys.argv[2]))
print(len(got), flush=True)
os.kill(os.getpid(), 9)  # crash before acking anything
"""


def test_a_killed_consumer_never_under_counts_deliveries(client, topic_group, database_url):
    ids = client.publish("orders", [{"n": i} for i in range(10)], at=at(0))
    clock = 0.0
    for attempt in range(1, 4):
        done = subprocess.run(
            [sys.executable, "-c", CRASHING_CONSUMER, database_url, at(clock).isoformat()],
            capture_output=True,
            text=True,
        )
        assert done.returncode == -9 and done.stdout.strip() == "10"
        counts = client.conn.execute(
            "SELECT DISTINCT delivery_count FROM deliveries WHERE message_id = ANY(%s)", (ids,)
        ).fetchall()
        assert counts == [(attempt,)]
        run_tier(
            TierRunRequest(tier="seconds", window_end=at(clock + 30), run_key=f"k{attempt}a"),
            url=database_url,
        )
        due = client.conn.execute("SELECT max(due_at) FROM deliveries").fetchone()[0]
        tier = "seconds" if attempt < 3 else "minutes"
        run_tier(TierRunRequest(tier=tier, window_end=due, run_key=f"k{attempt}b"), url=database_url)
        clock = (due - T0).total_seconds()
    assert states(client)["READY"] == 10
    assert client.conn.execute("SELECT DISTINCT reconsume_times FROM deliveries").fetchall() == [(3,)]


def test_a_small_window_makes_no_spark_session(client, topic_group, database_url):
    client.publish("orders", [{"n": i} for i in range(5)], at=at(0))
    fail_all(client, 5)

    def no_session():
        raise AssertionError("a window under the threshold must not start Spark")

    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="small"),
        url=database_url,
        spark=no_session,
        spark_threshold=6,
    )
    assert (summary["engine"], summary["promoted"]) == ("in-process", 5)


def test_the_old_wrapper_still_applies_a_window_with_a_hint(client, topic_group, database_url):
    """``run_tier_window`` stays for one release (issue 39.3): it applies the window as ``run_tier``
    does, and warns which call replaces it."""
    from redelivery.tiers.run import run_tier_window

    client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    fail_all(client, 3, clock=0)  # due at 10 s
    with pytest.warns(DeprecationWarning, match=r"call run_tier\(TierRunRequest"):
        summary = run_tier_window(tier="seconds", window_end=at(10), run_key="old", url=database_url)
    assert summary["promoted"] == 3 and states(client)["READY"] == 3
