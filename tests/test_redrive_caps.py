"""A redrive keeps the ready-backlog caps (issue 16.2), as publish and tier runs do: what fits
moves, oldest first, the rest stays in the DLQ and is reported, under the topic's backlog lock."""

import threading

from helpers import at, configured, wait_for_session
from redelivery.dead_letters import DlqFilter, count
from redelivery.redrive import RedriveRequest, redrive


def test_redrive_keeps_a_ready_backlog_cap(dead, database_url):
    """Issue 16.2: 30 dead letters of orders into group billing capped at 5 READY (2 already READY):
    3 move, oldest first, the rest stay in the DLQ and are reported; uncapped refunds all move."""
    config = configured(dead, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    dead.publish("orders", [{"late": i} for i in range(2)], at=at(200))
    result = redrive(
        RedriveRequest(group="billing", rate_limit=None, dry_run=False),
        run_key="capped", url=database_url, log=lambda *_: None, config=config,
    )  # fmt: skip
    assert dead.stats()["orders"]["billing"]["READY"] == 5
    assert dead.stats()["refunds"]["billing"]["READY"] == 10
    assert (result["moved"], result["held_by_backlog_cap"], result["status"]) == (13, 27, "success")
    moved = [r[0] for r in dead.conn.execute("SELECT message_id FROM redrive_moves ORDER BY message_id")]
    assert moved[:3] == [1, 2, 3]  # oldest first
    assert count(dead.conn, DlqFilter(group="billing", topic="orders")) == 27


def test_redrive_to_another_topic_keeps_its_groups_caps(dead, database_url):
    """A copy fans out to every group of the destination: a capped one there is kept at its cap."""
    dead.create_topic("archive")
    dead.create_group("auditors")
    dead.subscribe("auditors", "archive")
    dead.create_group("free")
    dead.subscribe("free", "archive")
    config = configured(dead, {"topic": "archive", "group": "auditors", "max_ready_backlog": 4})
    result = redrive(
        RedriveRequest(group="billing", topic="orders", destination_topic="archive", rate_limit=None,
                       dry_run=False),
        run_key="to-archive", url=database_url, log=lambda *_: None, config=config,
    )  # fmt: skip
    assert (result["moved"], result["held_by_backlog_cap"]) == (4, 26)
    assert dead.stats()["archive"]["auditors"]["READY"] == 4
    assert dead.stats()["archive"]["free"]["READY"] == 4


def test_a_capped_redrive_and_a_publish_at_once_never_pass_the_cap(dead, database_url):
    """The cap is checked under the topic's backlog lock, as publish and tier runs do: a redrive
    that starts while a publish holds the lock waits for it, then counts its messages."""
    config = configured(dead, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    request = RedriveRequest(group="billing", topic="orders", rate_limit=None, dry_run=False)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            redrive(request, run_key="race", url=database_url, log=lambda *_: None, config=config)
        )
    )
    with dead.conn.transaction():  # the publish's transaction, held open with the backlog lock
        dead.publish("orders", [{"racing": 1}], retry=False)
        worker.start()
        wait_for_session(
            database_url, "wait_event_type = 'Lock' AND query LIKE '%ADVISORY_XACT_LOCK%'",
            "the redrive waiting for the publish's backlog lock",
        )  # fmt: skip
    worker.join(30)
    assert results and (results[0]["moved"], results[0]["held_by_backlog_cap"]) == (4, 26)
    assert dead.stats()["orders"]["billing"]["READY"] == 5
