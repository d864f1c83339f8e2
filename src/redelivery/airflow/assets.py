"""Airflow Assets of redelivery: each subscription (topic, consumer group) is the Asset
``redelivery://<topic>/<group>``, so that a consumer DAG can be scheduled on the messages of its
group.

Events for an asset come from the event trigger
``redelivery.airflow.triggers.ReadyMessagesTrigger``, in an ``AssetWatcher`` of the consumer DAG,
when messages of the group are new since its last event: published, promoted by a tier window or
redriven alike. Tier runs emit no events of their own (until issue 38 they did, through the alias
``redelivery_promotions``, and a promotion then started two consumer runs: the event and the
watcher's), so a DAG scheduled on the asset needs the watcher declared once, by any DAG
(``asset_for(topic, group, watchers=[...])``, as ``http_consumer_dag`` does).

A publish does not emit an event itself (a producer is not an Airflow task); the watcher sees it.
"""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import Asset

from redelivery.rules.names import check_name

SCHEME = "redelivery"


def asset_uri(topic: str, group: str) -> str:
    """``redelivery://<topic>/<group>``. Raises ``InvalidNameError`` for a name outside the naming
    rule (``redelivery.rules.names``)."""
    check_name("topic", topic)
    check_name("group", group)
    # Valid names are URI-safe already (letters, digits, '_', '.', '-'); quoting keeps that true
    # should the naming rule ever allow more.
    return f"{SCHEME}://{quote(topic, safe='')}/{quote(group, safe='')}"


def asset_for(topic: str, group: str, watchers: list | None = None) -> Asset:
    """The Asset of subscription (``topic``, ``group``): name and URI both
    ``redelivery://<topic>/<group>`` (Airflow identifies an asset by the two together, so every
    producer and consumer must build it here). Raises ``InvalidNameError``.

    :param topic: the subscription's topic.
    :param group: the subscription's consumer group.
    :param watchers: ``AssetWatcher`` objects, for a DAG scheduled on it.
    """
    uri = asset_uri(topic, group)
    return Asset(name=uri, uri=uri, watchers=watchers or [])
