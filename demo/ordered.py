"""The demo's ordered group (issue 31): the same flights keyed by aircraft (tail number) on a topic
of their own, in the order of their scheduled departures, consumed by a group subscribed ordered.
The receiver's ``/aircraft`` endpoint answers a share of requests 429/503; the failed flights wait
for their retry, and each aircraft's later flights wait behind them. At the end every aircraft's
flights must have arrived in publish order, each once (flights without a tail number have no key:
unordered)."""

from __future__ import annotations

import requests

ORDERED_TOPIC, ORDERED_GROUP = "flights-by-aircraft", "flights-aircraft"
#: Flights per request to the receiver.
CHUNK = 500


def by_aircraft(df):
    """The flights (``key``, ``body``) keyed by their tail number, in scheduled-departure order
    (a sorted DataFrame: ``publish_dataframe`` publishes it partition by partition, each in order,
    so the ids follow that order)."""
    from redelivery.spark.session import functions_for

    F = functions_for(df)  # noqa: N806

    def field(name: str):
        return F.get_json_object("body", f"$.{name}").cast("int")

    keyed = df.select(F.get_json_object("body", "$.tailnum").alias("key"), "body")
    return keyed.orderBy(field("year"), field("month"), field("day"), field("sched_dep_time"), "body")


def subscribe(client) -> int:
    """The topic and the ordered group, made again for every demo run; the topic's id. The group
    retries without limit (each retry at its level's wait): the receiver's failures are transient,
    and every flight must arrive."""
    if client.conn.execute("SELECT 1 FROM topics WHERE name = %s", (ORDERED_TOPIC,)).fetchone():
        client.delete_topic(ORDERED_TOPIC)
    topic_id = client.create_topic(ORDERED_TOPIC)
    client.create_group(ORDERED_GROUP, max_reconsume_times=-1)
    client.subscribe(ORDERED_GROUP, ORDERED_TOPIC, ordered=True)
    return topic_id


def deliver_in_order(client, receiver_url: str, clock, batch: int = 5_000) -> dict:
    """The ordered group at ``clock``: receive (one flight per aircraft per receive), post to the
    receiver ``CHUNK`` flights a request, ack what it took, nack a request it refused (the retry
    holds the aircraft's later flights back); again until nothing is handed out."""
    url = receiver_url.rsplit("/", 1)[0] + "/aircraft"
    counts = {"received": 0, "acked": 0, "retried": 0, "rejected": 0}
    with requests.Session() as session:
        while got := client.receive(ORDERED_GROUP, ORDERED_TOPIC, batch, 600, at=clock):
            counts["received"] += len(got)
            for start in range(0, len(got), CHUNK):
                part = got[start : start + CHUNK]
                items = [{"id": m.message_id, "tail": m.key, "flight": m.body} for m in part]
                reply = session.post(url, json=items, timeout=60)
                if reply.status_code == 200:
                    counts["acked"] += client.ack(ORDERED_GROUP, part)
                else:
                    error = f"HTTP {reply.status_code} {reply.reason}"
                    counts["retried"] += client.nack(ORDERED_GROUP, part, error=error, at=clock)
    return counts


def check(client, stats: dict, receiver, total: int) -> list[str]:
    """Every flight committed once, and each aircraft's flights arrived at the receiver in publish
    order (ids ascending), each once. Returns failures."""
    failures = []
    counts = stats[ORDERED_GROUP]
    if counts["COMMITTED"] != total or sum(counts.values()) != total:
        failures.append(f"{ORDERED_GROUP}: expected {total:,} COMMITTED and nothing else, got {counts}")
    arrived = sum(len(ids) for ids in receiver.arrivals.values())
    if arrived != total or receiver.aircraft_duplicates:
        failures.append(
            f"{ORDERED_GROUP}: the receiver took {arrived:,} flights ({receiver.aircraft_duplicates} twice), "
            f"expected {total:,} once each"
        )
    out_of_order = [tail for tail, ids in receiver.arrivals.items() if tail and ids != sorted(ids)]
    if out_of_order:
        failures.append(f"{ORDERED_GROUP}: aircraft whose flights arrived out of order: {out_of_order[:10]}")
    return failures


def report(receiver) -> str:
    """One line: aircraft, their flights in order, the requests that failed and were retried."""
    tails = [t for t in receiver.arrivals if t]
    return (
        f"{ORDERED_GROUP}: {len(tails):,} aircraft, each one's flights in publish order "
        f"({sum(len(receiver.arrivals[t]) for t in tails):,} flights; "
        f"{len(receiver.arrivals.get(None, [])):,} without a tail number, unordered); "
        f"{receiver.aircraft_transient} requests refused 429/503 and retried"
    )
