"""Airflow Assets of redelivery: each subscription (topic, consumer group) is the Asset
``redelivery://<topic>/<group>``, so that a consumer DAG can be scheduled on the messages of its
group.

Events for an asset come from two places:

- a tier DAG run that promoted retries of the group's topic to READY (``emit_promotions``: the
  ``TierWindowOperator`` adds one event per subscription through the alias
  ``redelivery_promotions``; dry runs emit nothing);
- the event trigger ``redelivery.airflow.triggers.ReadyMessagesTrigger``, in an ``AssetWatcher``
  of the consumer DAG, when READY messages are new since its last event (publishes, promotions and
  redrives alike).

A publish does not emit an event itself (a producer is not an Airflow task); the watcher sees it.
"""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias

from redelivery.rules.names import check_name

SCHEME = "redelivery"
#: The alias every tier DAG's task emits its promotions through (one event per subscription).
PROMOTIONS_ALIAS = "redelivery_promotions"


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
    producer and consumer must build it here). ``watchers``: ``AssetWatcher`` objects, for a DAG
    scheduled on it. Raises ``InvalidNameError``."""
    uri = asset_uri(topic, group)
    return Asset(name=uri, uri=uri, watchers=watchers or [])


def promotions_alias() -> AssetAlias:
    """The ``AssetAlias`` a tier DAG's task declares as its outlet."""
    return AssetAlias(name=PROMOTIONS_ALIAS)


def promoted_subscriptions(summary: dict) -> list[tuple[str, str, int]]:
    """``[(topic, group, promoted)]`` of a tier window summary (``run_tier_window``), for every
    subscription that got at least one promotion; empty for a dry run."""
    if summary.get("dry_run"):
        return []
    found = []
    for group, moved in sorted(summary.get("by_group", {}).items()):
        for topic, n in sorted(moved.get("promoted_by_topic", {}).items()):
            if n:
                found.append((topic, group, n))
    return found


def emit_promotions(context, summary: dict) -> list[tuple[str, str, int]]:
    """Add one asset event per subscription with promotions to the task's outlet events, through
    ``redelivery_promotions`` (the task must declare ``promotions_alias()`` as an outlet); its extra
    says ``{"promoted": n, "tier", "window_end"}``. Returns what was emitted."""
    emitted = promoted_subscriptions(summary)
    events = context["outlet_events"][promotions_alias()]
    for topic, group, n in emitted:
        events.add(
            asset_for(topic, group),
            extra={"promoted": n, "tier": summary["tier"], "window_end": summary["window_end"]},
        )
    return emitted
