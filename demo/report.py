"""The demo's end checks, summary table and chart."""

from __future__ import annotations

from pathlib import Path

from redelivery.messaging.codec import STATES


def summary_table(stats: dict) -> str:
    """A text table: one row per group, one column per state."""
    lines = [f"{'group':<16}" + "".join(f"{s:>15}" for s in STATES)]
    for group, counts in stats.items():
        lines.append(f"{group:<16}" + "".join(f"{counts[s]:>15,}" for s in STATES))
    return "\n".join(lines)


def check(
    client, stats, *, total, cancelled_keys, receiver, http_group, stats_group, max_reconsume_times
) -> list[str]:
    """The demo's promise, checked against the database and the receiver. Returns failures.

    Every flight ends exactly once per group. In ``http_group`` every cancelled flight (its key in
    ``cancelled_keys``) is dead-lettered after ``max_reconsume_times`` retries, every dead letter
    carries the receiver's last answer for it as its last error, and the committed flights are
    exactly those the receiver accepted, each once. (A flight whose every delivery met a 429/503 is
    dead-lettered too: rare at the default share, and still checked against the receiver.)"""
    failures = []
    conn = client.conn

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: expected {want}, got {got}")

    for group in (http_group, stats_group):
        counts = stats[group]
        expect(
            f"{group}: messages in READY/INFLIGHT/WAITING_RETRY",
            counts["READY"] + counts["INFLIGHT"] + counts["WAITING_RETRY"],
            0,
        )
        expect(f"{group}: deliveries (one per flight)", sum(counts.values()), total)
    expect(f"{stats_group}: COMMITTED", stats[stats_group]["COMMITTED"], total)
    dead = conn.execute(
        """SELECT q.message_id, q.key, q.reason::text, q.reconsume_times, q.delivery_count, q.last_error
           FROM dlq_messages q JOIN consumer_groups g ON g.id = q.group_id
           WHERE g.name = %s""",
        (http_group,),
    ).fetchall()
    expect(f"{http_group}: DLQ table rows = DLQ state", len(dead), stats[http_group]["DLQ"])
    expect(
        f"{http_group}: cancelled flights missing from the DLQ",
        len(set(cancelled_keys) - {r[1] for r in dead}),
        0,
    )
    wrong = [
        r
        for r in dead
        if (r[2], r[3], r[4]) != ("MAX_DELIVERIES_EXCEEDED", max_reconsume_times, max_reconsume_times + 1)
    ]
    expect(
        f"{http_group}: dead letters without {max_reconsume_times} reconsume times and one more delivery",
        len(wrong),
        0,
    )
    mismatched = [r for r in dead if receiver.last_answer.get(r[0]) != r[5]]
    expect(
        f"{http_group}: dead letters whose last error is not the receiver's last answer", len(mismatched), 0
    )
    committed = {  # the log layout: at or below the group's offset, no delivery row, no dead letter
        r[0]
        for r in conn.execute(
            """SELECT m.id FROM messages m JOIN subscriptions s ON s.topic_id = m.topic_id
           JOIN consumer_groups g ON g.id = s.group_id
           WHERE g.name = %s AND m.id <= s.consume_offset
             AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.topic_id = m.topic_id
                             AND d.group_id = s.group_id AND d.message_id = m.id)
             AND NOT EXISTS (SELECT 1 FROM dlq_messages q
                             WHERE q.group_id = s.group_id AND q.message_id = m.id)""",
            (http_group,),
        )
    }
    expect(
        "flights the receiver accepted that are not COMMITTED (or the reverse)",
        len(committed ^ receiver.accepted),
        0,
    )
    expect("flights the receiver accepted twice", receiver.duplicates, 0)
    return failures


def storage(conn) -> dict[str, int]:
    """The database's size and its largest parts, bytes: the log (every partition of ``messages``),
    the delivery rows, the dead letters (every DLQ table), the database as a whole."""
    sizes = dict(
        conn.execute("""
        SELECT coalesce(parent.relname, c.relname), sum(pg_total_relation_size(c.oid))::bigint
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class parent ON parent.oid = i.inhparent
        WHERE n.nspname LIKE 'redelivery%%' AND c.relkind = 'r'
        GROUP BY 1""").fetchall()
    )
    database = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return {
        "log": sizes.get("messages", 0),
        "deliveries": sizes.get("deliveries", 0),
        "dead_letters": sizes.get("dlq_messages", 0),
        "database": database,
    }


def write_chart(path: Path, timeline, runs, groups: list[str]) -> Path:
    """Messages per state over simulated time, one small panel per state and group, each on its
    own linear scale (so that 8,000 dead letters stay readable beside 300,000 commits), and the
    lateness of every tier run's promotions (window end minus due time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig = plt.figure(figsize=(12, 13))
    grid = fig.add_gridspec(len(STATES) + 1, len(groups), height_ratios=[1] * len(STATES) + [1.6])
    start = timeline[0][0]
    minutes = [(t - start).total_seconds() / 60 for t, _ in timeline]
    for column, group in enumerate(groups):
        for row, state in enumerate(STATES):
            axis = fig.add_subplot(grid[row, column])
            values = [snapshot[group][state] for _, snapshot in timeline]
            axis.step(minutes, values, where="post", color=f"C{row}")
            axis.fill_between(minutes, values, step="post", alpha=0.2, color=f"C{row}")
            axis.set_ylim(bottom=0, top=max(1, max(values)) * 1.1)
            axis.set_ylabel(state, fontsize=8)
            axis.tick_params(labelsize=7)
            axis.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
            axis.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # counts: no 0.2 ticks
            if row == 0:
                axis.set_title(f"group {group}: messages per state", fontsize=10)
            if row == len(STATES) - 1:
                axis.set_xlabel("simulated minutes since publish", fontsize=8)
    bottom = fig.add_subplot(grid[len(STATES), :])
    histogram: dict[int, int] = {}
    for summary in runs:
        for start_ms, n in summary.get("lateness_histogram", {}).get("counts", {}).items():
            histogram[int(start_ms)] = histogram.get(int(start_ms), 0) + n
    if histogram:
        starts = sorted(histogram)
        bottom.hist([s / 1000 for s in starts], weights=[histogram[s] for s in starts], bins=60)
    bottom.set_xlabel("lateness: window end - due time (s)")
    bottom.set_ylabel("promoted messages")
    bottom.set_title("lateness of promotions, all tier runs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["check", "summary_table", "write_chart"]
