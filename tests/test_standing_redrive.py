"""Standing redrive policies (issue 41) on a real PostgreSQL: a tick brings matching dead letters
back when the policy is due, audited as a redrive run; a message comes back at most
``max_generations`` times, each generation after a longer wait; ``after: breaker_closed`` waits for
a breaker of its group to close and never runs while one is open; a policy stops itself when what
it brought back dies again; two ticks never run one policy at once; the config file's policies and
an operator's (the CLI); the metric."""

import json
import time

import pytest
from pydantic import ValidationError

from helpers import configured, run_cli, snapshot
from redelivery.config import RedeliveryConfig
from redelivery.errors import RedeliveryError, UnknownGroupError
from redelivery.rules.standing import StandingRedrive, generation_wait_seconds
from redelivery.standing import add, policies, set_state, tick

#: Every failure dead-letters at once: a message's life is receive, nack, dead letter.
POLICY = {"max_reconsume_times": 0}
DOWN = ConnectionError("payments API down")


def standing(client, **spec) -> StandingRedrive:
    """``client``'s config with the fast-dying policy and one standing redrive ``outage`` of group
    billing (``spec`` over a fast default: every 1 s, 1 s generation wait)."""
    policy = StandingRedrive(
        **{
            "name": "outage",
            "group": "billing",
            "after": "every",
            "every": "1s",
            "generation_wait": "1s",
            **spec,
        }
    )
    config = configured(client, POLICY)
    client.config = config.model_copy(update={"standing_redrives": [policy]})
    return policy


def die(client, n=None) -> list[int]:
    """Receive what is there (``n`` at most) and nack it: each becomes a dead letter."""
    got = client.receive("billing", "orders", n or 100, 60)
    if got:
        client.nack("billing", got, error=DOWN)
    return sorted(m.message_id for m in got)


def dead(client) -> dict[int, int]:
    """{message id: redrive count} of the group's dead letters."""
    return dict(client.conn.execute("SELECT message_id, redrive_count FROM dlq_messages").fetchall())


def run(client, database_url):
    return tick(database_url, client.config, sync_config=True, log=lambda *_: None)


def test_a_due_policy_brings_dead_letters_back_audited_as_a_redrive_run(client, topic_group, database_url):
    standing(client)
    client.publish("orders", [{"n": i} for i in range(3)])
    ids = die(client)
    assert run(client, database_url).runs == []  # dead for less than the first generation's wait (1 s)
    time.sleep(1.1)
    report = run(client, database_url)
    [record] = report.runs
    assert (record["moved"], record["triggered_by"], record["status"]) == (3, "standing:outage", "success")
    assert dead(client) == {}
    back = client.receive("billing", "orders", 10, 60)
    assert sorted(m.message_id for m in back) == ids  # READY again, retry budget restored
    [row] = policies(client.conn)
    assert (row["brought_back"], row["runs"], row["source"], row["more_left"]) == (3, 1, "config", False)
    generations = client.conn.execute(
        "SELECT m.generation, r.standing_id FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id"
    ).fetchall()
    assert generations == [(1, row["id"])] * 3
    assert run(client, database_url).runs == []  # not due again before `every`, and nothing is dead


def test_a_message_comes_back_at_most_max_generations_times_each_after_a_longer_wait(
    client, topic_group, database_url
):
    policy = standing(client, max_generations=2, stop_min=1000)
    assert [generation_wait_seconds(policy, g) for g in range(3)] == [1, 2, 4]
    [mid] = client.publish("orders", [{"n": 1}])
    returns, deadline = [], time.monotonic() + 12
    while time.monotonic() < deadline:
        die(client)
        if run(client, database_url).runs:
            returns.append(time.monotonic())
        time.sleep(0.2)
    assert len(returns) == 2 and dead(client) == {mid: 2}  # then it stays dead
    assert returns[1] - returns[0] >= 2  # the second generation waited 2 s after its death


def test_after_breaker_closed_waits_for_a_close_and_never_runs_while_open(client, topic_group, database_url):
    standing(client, after="breaker_closed")
    run(client, database_url)  # written: the outages it brings back begin now
    client.publish("orders", [{"n": i} for i in range(4)])
    die(client)
    time.sleep(1.1)
    assert run(client, database_url).runs == []  # no breaker of the group closed since it exists
    client.open_breaker("orders", "billing", by="test")
    assert run(client, database_url).runs == []  # open: nothing comes back
    client.close_breaker("orders", "billing", by="test")
    [record] = run(client, database_url).runs
    assert record["moved"] == 4 and dead(client) == {}
    assert run(client, database_url).runs == []  # that close is spent


def test_it_goes_on_after_a_close_while_dead_letters_wait_for_their_generation(
    client, topic_group, database_url
):
    standing(client, after="breaker_closed", generation_wait="2s")
    run(client, database_url)  # the config's policy written: it counts closes from now on
    client.publish("orders", [{"n": 1}])
    die(client)
    client.open_breaker("orders", "billing", by="test")
    client.close_breaker("orders", "billing", by="test")
    assert run(client, database_url).runs == []  # dead for less than 2 s
    assert policies(client.conn)[0]["more_left"]  # so the next ticks look again
    time.sleep(2.1)
    [record] = run(client, database_url).runs
    assert record["moved"] == 1 and not policies(client.conn)[0]["more_left"]


def test_it_stops_itself_when_what_it_brought_back_dies_again(client, topic_group, database_url):
    standing(client, stop_min=3, stop_ratio=0.5, max_generations=5)
    client.publish("orders", [{"n": i} for i in range(4)])
    die(client)
    time.sleep(1.1)
    assert run(client, database_url).runs[0]["moved"] == 4
    die(client)  # all 4 die again
    time.sleep(2.1)
    report = run(client, database_url)
    assert (
        report.runs == []
        and "4 of the last 4 messages it brought back that settled died again" in report.stopped["outage"]
    )
    [row] = policies(client.conn)
    assert (row["state"], row["changed_by"]) == ("stopped", "redelivery")
    assert run(client, database_url).runs == [] and len(dead(client)) == 4
    set_state(client.conn, "outage", "test", None)  # resumed: the ratio counts from now on
    time.sleep(1.1)  # `every`
    assert run(client, database_url).runs[0]["moved"] == 4


def test_a_full_backlog_cap_makes_no_run_until_there_is_room(client, topic_group, database_url):
    """A group at its ready-backlog cap: ticks bring nothing back and write no redrive run (one
    every 30 s would be 2,880 rows a day); once a consumer makes room, the next tick runs."""
    policy = standing(client)
    client.publish("orders", [{"n": i} for i in range(3)])
    ids = die(client)
    capped = configured(client, {**POLICY, "max_ready_backlog": 2})
    client.config = capped.model_copy(update={"standing_redrives": [policy]})
    client.publish("orders", [{"n": i} for i in range(3, 5)])  # the cap: 2 READY
    time.sleep(1.1)
    for _ in range(3):
        assert run(client, database_url).runs == []
    assert client.conn.execute("SELECT count(*) FROM redrive_runs").fetchone()[0] == 0
    [row] = policies(client.conn)
    assert (row["runs"], row["more_left"]) == (0, True)  # the next tick looks again, not `every` later
    client.ack("billing", client.receive("billing", "orders", 10, 60))  # room for 2
    [record] = run(client, database_url).runs
    assert (record["moved"], record["held_by_backlog_cap"]) == (2, 1)
    assert sorted(dead(client)) == ids[2:]  # oldest first


def test_a_full_cap_never_keeps_a_halted_head_from_coming_back(client, database_url):
    """An ordered subscription that halts: its head's dead letter holds the key, and the key's
    BLOCKED messages fill the cap (publish refused, nothing to receive). The standing redrive
    brings the head back whatever the cap, as a redrive does (issue 36); else the group stalls."""
    from redelivery.messaging.codec import Message

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    policy = standing(client, reasons=[])
    capped = configured(client, {**POLICY, "max_ready_backlog": 3})
    client.config = capped.model_copy(update={"standing_redrives": [policy]})
    client.publish("orders", [Message({"n": i}, key="a") for i in range(3)])
    [head] = client.receive("billing", "orders", 1, 60)
    client.reject("billing", head, error="bad")  # HALTED: its dead letter holds key a
    client.publish("orders", [Message({"n": 3}, key="a")])  # 3 BLOCKED: at the cap
    assert client.receive("billing", "orders", 10, 60) == []
    time.sleep(1.1)
    [record] = run(client, database_url).runs
    assert record["moved"] == 1 and dead(client) == {}
    assert [m.message_id for m in client.receive("billing", "orders", 10, 60)] == [head.message_id]


def test_a_policy_another_tick_holds_is_left_to_it(client, topic_group, database_url):
    standing(client)
    client.publish("orders", [{"n": 1}])
    die(client)
    time.sleep(1.1)
    run(client, database_url)  # written from the config, ran
    die(client)
    time.sleep(2.1)
    from redelivery.standing import STANDING_LOCK
    from redelivery.store import db

    [row] = policies(client.conn)
    with db.connect(database_url, autocommit=True) as other:  # another tick, running it
        other.execute("SELECT pg_advisory_lock(%s, %s)", (STANDING_LOCK, row["id"]))
        assert policies(client.conn)[0]["running"]
        assert run(client, database_url).runs == []
    # that tick's process died: its connection closed, the policy is free at once
    assert run(client, database_url).runs[0]["moved"] == 1


def test_config_policies_follow_the_file_and_an_operators_are_kept(client, topic_group, database_url):
    standing(client)
    run(client, database_url)
    add(client.conn, StandingRedrive(name="by-hand", group="billing"), "test")
    with pytest.raises(RedeliveryError, match="already called 'by-hand'"):
        add(client.conn, StandingRedrive(name="by-hand", group="billing"), "test")
    with pytest.raises(UnknownGroupError):
        add(client.conn, StandingRedrive(name="x", group="nobody"), "test")
    client.config = client.config.model_copy(update={"standing_redrives": []})
    run(client, database_url)
    assert [(p["name"], p["source"]) for p in policies(client.conn)] == [("by-hand", "operator")]


def test_a_run_that_fails_leaves_the_policy_to_the_next_tick(client, topic_group, database_url, monkeypatch):
    import psycopg

    import redelivery.standing

    standing(client, after="breaker_closed")
    run(client, database_url)
    client.publish("orders", [{"n": 1}])
    die(client)
    client.open_breaker("orders", "billing", by="test")
    client.close_breaker("orders", "billing", by="test")
    time.sleep(1.1)

    def cut(*args, **kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(redelivery.standing, "redrive", cut)
    report = run(client, database_url)
    assert report.runs == [] and "server closed the connection" in report.problems["outage"]
    assert policies(client.conn)[0]["more_left"]  # the close is not lost
    monkeypatch.undo()
    assert run(client, database_url).runs[0]["moved"] == 1


def test_a_run_stops_between_batches_when_a_breaker_of_its_group_opens(client, topic_group, database_url):
    standing(client, rate_limit=2)  # a batch of 2 a second
    client.publish("orders", [{"n": i} for i in range(10)])
    die(client)
    time.sleep(1.1)

    def wait(seconds):  # the pause before the second batch: the outage comes back meanwhile
        client.open_breaker("orders", "billing", by="test")
        time.sleep(seconds)

    [record] = tick(database_url, client.config, sync_config=True, wait=wait, log=lambda *_: None).runs
    assert record["status"] == "stopped" and record["moved"] == 2
    assert policies(client.conn)[0]["more_left"]
    client.close_breaker("orders", "billing", by="test")
    time.sleep(1.1)
    assert run(client, database_url).runs[0]["moved"] == 10 - record["moved"]  # the rest, next tick


def test_after_a_close_only_the_dead_letters_of_before_it_come_back(client, topic_group, database_url):
    standing(client, after="breaker_closed")
    run(client, database_url)
    client.publish("orders", [{"n": i} for i in range(4)])
    before = die(client, 2)
    client.open_breaker("orders", "billing", by="test")
    client.close_breaker("orders", "billing", by="test")
    after = die(client)  # dead after the close: not this outage's
    time.sleep(1.1)
    [record] = run(client, database_url).runs
    assert record["moved"] == 2 and sorted(dead(client)) == after and len(before) == 2


def test_a_tick_without_the_config_leaves_the_files_policies_alone(client, topic_group, database_url):
    standing(client)
    run(client, database_url)  # written from the file
    tick(database_url, RedeliveryConfig(), log=lambda *_: None)  # another process, no config file
    assert [p["name"] for p in policies(client.conn)] == ["outage"]


def test_a_dead_letter_redriven_many_times_does_not_overflow_the_wait(client, topic_group, database_url):
    standing(client, max_generations=100, generation_wait="7d")
    client.publish("orders", [{"n": 1}])
    die(client)
    client.conn.execute("UPDATE dlq_messages SET redrive_count = 90")  # 7 days x 2^90: past any timestamp
    report = run(client, database_url)
    assert report.runs == [] and report.problems == {}


def test_bad_policies_are_refused_in_one_line():
    with pytest.raises(ValidationError, match="every"):
        StandingRedrive(name="a", group="g", every="soon")
    with pytest.raises(ValidationError, match="used twice"):
        RedeliveryConfig.model_validate(
            {"standing_redrives": [{"name": "a", "group": "g"}, {"name": "a", "group": "h"}]}
        )
    with pytest.raises(ValidationError, match="max_generations"):
        StandingRedrive(name="a", group="g", max_generations=0)


def test_the_cli_adds_lists_stops_resumes_and_removes(client, topic_group, database_url):
    args = ("standing-redrive", "add", "--name", "nightly", "--group", "billing", "--after", "every")
    assert run_cli(*args, database_url=database_url).returncode == 0
    listed = run_cli("standing-redrive", "list", "--json", database_url=database_url)
    [row] = json.loads(listed.stdout)
    assert (row["name"], row["state"], row["changed_by"][:4]) == ("nightly", "active", "cli:")
    before = snapshot(client.conn)
    for bad in (
        ("standing-redrive", "add", "--name", "nightly", "--group", "billing"),  # taken
        ("standing-redrive", "add", "--name", "n2", "--group", "billing", "--generation-wait", "0s"),
        ("standing-redrive", "stop", "nobody", "--reason", "x"),
        ("standing-redrive", "stop", "nightly", "--reason", " "),
    ):
        done = run_cli(*bad, database_url=database_url)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (bad, done.stderr)
    assert snapshot(client.conn) == before
    stopped = run_cli("standing-redrive", "stop", "nightly", "--reason", "deploy", database_url=database_url)
    assert "active -> stopped" in stopped.stdout
    stats = run_cli("stats", database_url=database_url).stdout
    assert "standing redrives:" in stats and "stopped by cli:" in stats and "deploy" in stats
    assert run_cli("standing-redrive", "resume", "nightly", database_url=database_url).returncode == 0
    assert run_cli("standing-redrive", "remove", "nightly", database_url=database_url).returncode == 0
    assert "(no standing redrives)" in run_cli("standing-redrive", "list", database_url=database_url).stdout


def test_the_metric_counts_what_each_policy_brought_back(client, topic_group, database_url):
    from redelivery.metrics import render

    standing(client)
    client.publish("orders", [{"n": i} for i in range(2)])
    die(client)
    time.sleep(1.1)
    run(client, database_url)
    text = render(client.conn).decode()
    assert 'redelivery_auto_redriven_total{group="billing",policy="outage"} 2.0' in text
    assert 'redelivery_standing_redrive_stopped{group="billing",policy="outage"} 0.0' in text
