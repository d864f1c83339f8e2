"""The Prometheus metrics (redelivery.metrics): a scrape equals the state the Client and the tier
and redrive jobs made; counters go up by exactly each change, never for a dry run, a re-run or an
overlapping run, and survive retention; the gauges' statements can use their indexes; the CLI."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import at, docs_page, overlapping_tier_runs, run_cli
from redelivery.config import cached_config
from redelivery.metrics import CONTENT_TYPE, render
from redelivery.redrive import RedriveRequest, redrive
from redelivery.store import maintenance
from redelivery.store import statements as S
from redelivery.tiers.run import TierRunRequest, run_tier
from redelivery.tiers.window import LATENESS_BOUNDS


def parse(text: str) -> dict:
    """{(sample name, ((label, value), ...)): value} of an exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(conn, when=None) -> dict:
    return parse(render(conn, at=when).decode())


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def counters(samples: dict) -> dict:
    """Every counter sample of a group: {(name, group): value} (the breakers', labelled by their
    transition too, are checked apart)."""
    return {
        (name, dict(labels)["group"]): v
        for (name, labels), v in samples.items()
        if name.endswith("_total") and name.startswith("redelivery_") and "breaker" not in name
    }


def histogram(samples: dict, name: str, tier: str) -> dict:
    """{le: cumulative count} plus "count" and "sum" of one tier's histogram."""
    out = {
        dict(labels)["le"]: v
        for (sample, labels), v in samples.items()
        if sample == f"{name}_bucket" and dict(labels)["tier"] == tier
    }
    out["count"] = value(samples, f"{name}_count", tier=tier)
    out["sum"] = value(samples, f"{name}_sum", tier=tier)
    return out


LIVE = ("READY", "INFLIGHT", "WAITING_RETRY", "DLQ")


def assert_states_equal_the_stats(client, samples) -> None:
    for topic, groups in client.stats().items():
        for group, counts in groups.items():
            for state in LIVE:
                got = value(samples, "redelivery_messages", topic=topic, group=group, state=state)
                assert got == counts[state], (topic, group, state)
            assert value(samples, "redelivery_messages", topic=topic, group=group, state="COMMITTED") is None


@pytest.fixture()
def state(client, topic_group, database_url):
    """orders -> billing (default policy) and audit (max reconsume times 0), 10 messages at 0 s:
    billing acks 2 (and one of them again: stale), nacks 2 (due at 10 s), retries 1 after 60 s
    (level 3), rejects 1 (and nacks it after: stale), keeps 1 in flight (lease to 30 s); audit
    leases 3 for 5 s. Then the seconds tier's window ending at 12.5 s promotes billing's 2 (2.5 s
    late each) and dead-letters audit's 3 (LEASE_EXPIRED)."""
    client.create_group("audit", max_reconsume_times=0)
    client.subscribe("audit", "orders")
    client.publish("orders", [{"n": i} for i in range(10)], at=at(0))
    got = client.receive("billing", "orders", 7, 30, at=at(0))
    assert client.ack("billing", got[0:2]) == 2
    assert client.ack("billing", got[0]) == 0  # stale
    client.nack("billing", got[2:4], error="boom", at=at(0))
    client.reconsume_later("billing", got[4], delay=60, at=at(0))
    client.reject("billing", got[5], error="bad", at=at(0))
    assert client.nack("billing", got[5], at=at(1)) == 0  # stale
    client.receive("audit", "orders", 3, 5, at=at(0))
    summary = run_tier(TierRunRequest(tier="seconds", window_end=at(12.5), run_key="m-1"), url=database_url)
    assert (summary["promoted"], summary["dead_lettered"]) == (2, 3)
    return client, summary


def test_a_scrape_equals_the_state(state):
    client, summary = state
    samples = scrape(client.conn, at(100))
    assert_states_equal_the_stats(client, samples)
    expected = {"READY": 5, "INFLIGHT": 1, "WAITING_RETRY": 1, "DLQ": 1}
    for name, n in expected.items():
        assert value(samples, "redelivery_messages", topic="orders", group="billing", state=name) == n
    assert value(samples, "redelivery_messages", topic="orders", group="audit", state="DLQ") == 3
    waiting = {k: v for k, v in samples.items() if k[0] == "redelivery_retry_waiting_messages"}
    assert waiting == {
        (
            "redelivery_retry_waiting_messages",
            (("delay_level", "3"), ("group", "billing"), ("topic", "orders")),
        ): 1.0
    }
    oldest = client.conn.execute(  # READY: the READY rows by ready_at, the messages past the offset
        "SELECT g.name, extract(epoch FROM %s - least("
        " (SELECT min(d.ready_at) FROM deliveries d WHERE d.topic_id = s.topic_id AND d.group_id = s.group_id"
        "  AND d.state = 'READY'),"
        " (SELECT min(m.published_at) FROM messages m"
        "  WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset)"
        "))::float8 FROM subscriptions s JOIN consumer_groups g ON g.id = s.group_id",
        (at(100),),
    ).fetchall()
    assert dict(oldest) == {"billing": 100.0, "audit": 100.0}  # the never received ones, published at 0 s
    for group in ("billing", "audit"):
        age = value(samples, "redelivery_consumer_ready_oldest_age_seconds", topic="orders", group=group)
        assert age == 100.0
    assert (
        value(samples, "redelivery_dlq_messages", dlq="%DLQ%billing", group="billing", reason="REJECTED") == 1
    )
    assert (
        value(samples, "redelivery_dlq_messages", dlq="%DLQ%audit", group="audit", reason="LEASE_EXPIRED")
        == 3
    )
    assert counters(samples) == {
        ("redelivery_promoted_messages_total", "billing"): 2,
        ("redelivery_promoted_messages_total", "audit"): 0,
        ("redelivery_send_to_dlq_messages_total", "billing"): 1,
        ("redelivery_send_to_dlq_messages_total", "audit"): 3,
        ("redelivery_redriven_messages_total", "billing"): 0,
        ("redelivery_redriven_messages_total", "audit"): 0,
        ("redelivery_stale_receipts_total", "billing"): 2,
        ("redelivery_stale_receipts_total", "audit"): 0,
        ("redelivery_committed_messages_total", "billing"): 2,
        ("redelivery_committed_messages_total", "audit"): 0,
    }
    for group in ("billing", "audit"):  # no breaker was ever opened: closed, no transition
        assert value(samples, "redelivery_breaker_open", topic="orders", group=group, state="closed") == 0
        for to in ("open", "closed", "held"):
            name = "redelivery_breaker_transitions_total"
            assert value(samples, name, topic="orders", group=group, to=to) == 0
    lateness = histogram(samples, "redelivery_retry_lateness_seconds", "seconds")
    # 2.5 s late is in the bucket whose bound is 2.5 (le: less than or equal), not above it
    assert (lateness["1.0"], lateness["2.5"], lateness["+Inf"]) == (0, 2, 2)
    assert (lateness["count"], lateness["sum"]) == (2, 5.0)
    assert len(lateness) == len(LATENESS_BOUNDS) + 1 + 2
    duration = histogram(samples, "redelivery_tier_run_duration_seconds", "seconds")
    assert duration["count"] == 1 and duration["sum"] == pytest.approx(summary["duration_seconds"], abs=1e-3)
    assert value(samples, "redelivery_metrics_scrape_duration_seconds") > 0


def test_counters_go_up_by_exactly_each_change_and_never_for_a_rerun_or_a_dry_run(state, database_url):
    client, _ = state
    before = scrape(client.conn)
    # nothing new: a re-run of the window (same key), another key, a dry run, a dry-run redrive
    again = run_tier(TierRunRequest(tier="seconds", window_end=at(12.5), run_key="m-1"), url=database_url)
    other = run_tier(TierRunRequest(tier="seconds", window_end=at(12.5), run_key="m-2"), url=database_url)
    dry = run_tier(
        TierRunRequest(tier="minutes", window_end=at(70), run_key="m-dry", dry_run=True), url=database_url
    )
    assert (again["promoted"], other["promoted"], dry["promoted"]) == (0, 0, 1)
    assert (
        redrive(RedriveRequest(group="billing"), run_key="r-dry", url=database_url, log=lambda *_: None)[
            "matched"
        ]
        == 1
    )
    unchanged = scrape(client.conn)
    assert counters(unchanged) == counters(before)
    assert histogram(unchanged, "redelivery_retry_lateness_seconds", "seconds") == histogram(
        before, "redelivery_retry_lateness_seconds", "seconds"
    )
    assert histogram(unchanged, "redelivery_retry_lateness_seconds", "minutes")["count"] is None
    # two more runs of the seconds tier were timed (re-runs are runs); the dry run was not
    assert histogram(unchanged, "redelivery_tier_run_duration_seconds", "seconds")["count"] == 3
    assert histogram(unchanged, "redelivery_tier_run_duration_seconds", "minutes")["count"] is None

    # the changes: the level-3 retry promoted 10 s late, 2 rejects, a redrive of 2 dead letters
    minutes = run_tier(TierRunRequest(tier="minutes", window_end=at(70), run_key="m-3"), url=database_url)
    assert minutes["promoted"] == 1
    client.reject("billing", client.receive("billing", "orders", 2, 30, at=at(100)), at=at(100))
    moved = redrive(
        RedriveRequest(group="billing", max_messages=2, dry_run=False),
        run_key="r-1",
        url=database_url,
        log=lambda *_: None,
    )
    assert moved["moved"] == 2
    # retention deletes the tier and redrive records: the totals stay
    client.conn.execute("UPDATE tier_runs SET finished_at = now() - interval '400 days'")
    client.conn.execute("UPDATE redrive_runs SET finished_at = now() - interval '400 days'")
    deleted = maintenance.cleanup(client.conn, cached_config())
    assert deleted["tier_runs"] == 4 and deleted["redrive_runs"] == 2  # m-1 (run twice), m-2, m-dry, m-3
    after = scrape(client.conn)
    change = {key: after_value - counters(unchanged)[key] for key, after_value in counters(after).items()}
    assert change == {
        ("redelivery_promoted_messages_total", "billing"): 1,
        ("redelivery_promoted_messages_total", "audit"): 0,
        ("redelivery_send_to_dlq_messages_total", "billing"): 2,
        ("redelivery_send_to_dlq_messages_total", "audit"): 0,
        ("redelivery_redriven_messages_total", "billing"): 2,
        ("redelivery_redriven_messages_total", "audit"): 0,
        ("redelivery_stale_receipts_total", "billing"): 0,
        ("redelivery_stale_receipts_total", "audit"): 0,
        ("redelivery_committed_messages_total", "billing"): 0,
        ("redelivery_committed_messages_total", "audit"): 0,
    }
    lateness = histogram(after, "redelivery_retry_lateness_seconds", "minutes")
    assert (lateness["5.0"], lateness["10.0"], lateness["count"], lateness["sum"]) == (0, 1, 1, 10.0)
    assert histogram(after, "redelivery_tier_run_duration_seconds", "minutes")["count"] == 1
    assert_states_equal_the_stats(client, after)
    assert (
        value(after, "redelivery_dlq_messages", dlq="%DLQ%billing", group="billing", reason="REJECTED") == 1
    )


def test_overlapping_runs_count_each_move_once(client, topic_group, database_url):
    client.create_group("strict", max_reconsume_times=0)
    client.subscribe("strict", "orders")
    client.publish("orders", [{"n": i} for i in range(600)], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 600, 30, at=at(0)), at=at(0))  # due at 10 s
    client.receive("strict", "orders", 600, 5, at=at(0))  # leases end at 5 s
    overlapping_tier_runs(database_url, at(11))
    samples = scrape(client.conn)
    assert value(samples, "redelivery_promoted_messages_total", group="billing") == 600
    assert value(samples, "redelivery_send_to_dlq_messages_total", group="strict") == 600
    lateness = histogram(samples, "redelivery_retry_lateness_seconds", "seconds")
    assert (lateness["0.5"], lateness["1.0"], lateness["count"], lateness["sum"]) == (0, 600, 600, 600.0)
    assert histogram(samples, "redelivery_tier_run_duration_seconds", "seconds")["count"] == 3


def test_a_subscription_without_deliveries_shows_zeros_and_no_histograms(client, topic_group):
    samples = scrape(client.conn)
    for state in LIVE:
        assert value(samples, "redelivery_messages", topic="orders", group="billing", state=state) == 0
    assert (
        value(samples, "redelivery_consumer_ready_oldest_age_seconds", topic="orders", group="billing") == 0
    )
    assert not [k for k in samples if "lateness" in k[0] or "run_duration" in k[0]]


def test_the_scrape_reads_one_snapshot_and_leaves_the_connection_as_it_was(client, topic_group, database_url):
    from redelivery.store import db

    with db.connect(database_url) as conn:  # not autocommit: the hook's connections
        before = (conn.isolation_level, conn.read_only)
        assert "redelivery_messages" in render(conn).decode()
        assert (conn.isolation_level, conn.read_only) == before
        conn.execute(S.DB_NOW)  # inside a transaction of the caller's: read in a savepoint of it
        render(conn)
        conn.rollback()
    assert CONTENT_TYPE.startswith("text/plain")


@pytest.mark.parametrize(
    "name,index",
    [
        ("METRICS_READY", "deliveries_ready"),
        ("METRICS_READY", "_pkey on messages_"),
        ("METRICS_INFLIGHT", "deliveries_inflight"),
        ("METRICS_WAITING", "deliveries_waiting"),
        ("METRICS_DEAD_LETTERS", "dlq_id_group_id_topic_id_reason_idx"),
    ],
)
def test_the_gauges_can_count_from_an_index_alone(state, name, index):
    """Each gauge's statement can be answered by an index-only scan (a live state's partial index,
    the dead letters' narrow one): its cost follows the rows it counts, not every delivery ever
    made, and needs no heap page once VACUUM has marked them all-visible."""
    client, _ = state
    client.conn.execute("BEGIN")
    client.conn.execute("SET LOCAL enable_seqscan = off")
    client.conn.execute("SET LOCAL enable_bitmapscan = off")
    params = {"at": None} if "%(at)s" in S.ALL[name] else None
    plan = "\n".join(r[0] for r in client.conn.execute("EXPLAIN " + S.ALL[name], params))
    client.conn.execute("ROLLBACK")
    assert "Seq Scan on deliveries" not in plan and "Seq Scan on dlq_messages" not in plan, plan
    scans = [line for line in plan.splitlines() if index in line]
    assert scans and all("Index Only Scan" in line for line in scans), plan


def test_cli_prints_the_metrics_and_writes_a_textfile(state, database_url, tmp_path):
    printed = run_cli("metrics", database_url=database_url)
    assert printed.returncode == 0, printed.stderr
    assert value(parse(printed.stdout), "redelivery_promoted_messages_total", group="billing") == 2
    target = tmp_path / "redelivery.prom"
    written = run_cli("metrics", "--textfile", str(target), database_url=database_url)
    assert written.returncode == 0 and written.stdout == ""
    assert value(parse(target.read_text()), "redelivery_send_to_dlq_messages_total", group="audit") == 3
    assert [p.name for p in tmp_path.iterdir()] == ["redelivery.prom"]
    refused = run_cli("metrics", "--textfile", str(tmp_path / "metrics.txt"), database_url=database_url)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and ".prom" in refused.stderr
    missing = run_cli("metrics", "--textfile", str(tmp_path / "no" / "r.prom"), database_url=database_url)
    assert missing.returncode == 2 and missing.stderr.startswith("error: cannot write")


def test_the_tier_paused_gauge_is_one_per_tier_airflow_has_paused(client, topic_group):
    """``redelivery_tier_paused{tier}`` from the pause states the caller read in Airflow's
    metadata database (the api-server's route does: tests/test_operator_ui.py); without them (the
    CLI, which has no Airflow database) the gauge is left out rather than guessed."""
    samples = parse(render(client.conn, tier_paused={"seconds": True, "minutes": False}).decode())
    assert value(samples, "redelivery_tier_paused", tier="seconds") == 1
    assert value(samples, "redelivery_tier_paused", tier="minutes") == 0
    assert not [k for k in scrape(client.conn) if k[0] == "redelivery_tier_paused"]
    assert "`redelivery_tier_paused`" in docs_page("operating.md")  # the metrics table


def test_up_is_one_when_the_state_store_answers(client, topic_group):
    text = render(client.conn).decode()
    assert "# HELP redelivery_up " in text and "# TYPE redelivery_up gauge" in text
    assert value(scrape(client.conn), "redelivery_up") == 1


def refusal(url: str) -> str | None:
    """What ``unavailable`` says of connecting to ``url`` (it must fail)."""
    import psycopg

    from redelivery.metrics import unavailable
    from redelivery.store import db

    with pytest.raises(psycopg.OperationalError) as failed:
        db.connect(url, connect_timeout=5)
    return unavailable(failed.value)


def test_why_the_state_store_cannot_serve_is_one_line_without_the_password(database_url):
    """Issue 28.2: unreachable, login refused, no such database, never migrated; any other error is
    not the state store's absence (None: it goes on as an error)."""
    from psycopg.conninfo import conninfo_to_dict

    from redelivery.errors import SchemaNotMigratedError
    from redelivery.metrics import unavailable

    info = conninfo_to_dict(database_url)
    where = f"{info['host']}:{info['port']}"
    unreachable = refusal("postgresql://u:secret-pw@127.0.0.1:9/redelivery")
    assert (
        unreachable.startswith("cannot reach the state store at 127.0.0.1:9: ") and "refused" in unreachable
    )
    wrong = refusal(f"postgresql://{info['user']}:secret-pw@{where}/{info['dbname']}")
    assert wrong.startswith(f"authentication failed for user '{info['user']}' at {where}: ")
    nobody = refusal(f"postgresql://nobody_at_all:secret-pw@{where}/{info['dbname']}")
    assert nobody.startswith(f"authentication failed for user 'nobody_at_all' at {where}: ")
    password = info.get("password") or "secret-pw"
    no_database = refusal(f"postgresql://{info['user']}:{password}@{where}/no_such_database")
    assert no_database == f"database 'no_such_database' does not exist at {where}"
    for line in (unreachable, wrong, nobody, no_database):
        assert "\n" not in line and "secret-pw" not in line and password not in line
    never = SchemaNotMigratedError(
        "database 'x' on h:1 has no redelivery schema (it was never migrated): run it"
    )
    assert unavailable(never) == str(never)
    assert unavailable(ValueError("a bug")) is None


def test_metrics_of_a_state_store_that_cannot_serve_say_up_zero():
    """As Prometheus exporters answer when their target is down: 200, ``redelivery_up 0`` with its
    HELP, the reason as a comment; what Airflow knows (the paused tiers) still shown."""
    from redelivery.metrics import render_unavailable

    text = render_unavailable("cannot reach the state store at h:9: refused", {"seconds": True}).decode()
    samples = parse(text)
    assert value(samples, "redelivery_up") == 0
    assert value(samples, "redelivery_tier_paused", tier="seconds") == 1
    assert [name for name, _ in samples] == ["redelivery_up", "redelivery_tier_paused"]
    assert "# HELP redelivery_up " in text and "\n# the state store cannot serve: cannot reach" in "\n" + text
    assert parse(render_unavailable("x\ny").decode()) == {("redelivery_up", ()): 0}  # one comment line


def test_cli_metrics_of_an_unreachable_state_store(tmp_path):
    target = tmp_path / "redelivery.prom"
    done = run_cli("metrics", "--textfile", str(target), database_url="postgresql://u:p@127.0.0.1:9/r")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("redelivery: cannot reach the state store at 127.0.0.1:9: ")
    assert value(parse(target.read_text()), "redelivery_up") == 0  # node-exporter sees it down
