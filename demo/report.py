"""The demo's end checks, summary table and chart."""

from __future__ import annotations

import math
from datetime import datetime
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


#: Stacking order of the states, bottom to top, with their colours (the operator page's; COMMITTED
#: grey, on top: the few messages that retry or end dead-lettered sit on the axis, to scale).
STACK = {
    "DLQ": "#e53e3e",
    "BLOCKED": "#805ad5",
    "WAITING_RETRY": "#dd6b20",
    "INFLIGHT": "#3182ce",
    "READY": "#38a169",
    "COMMITTED": "#a0aec0",
}
#: One colour per tier (shortest window first), apart from the states' colours.
TIER_COLOURS = ("#805ad5", "#319795", "#b7791f", "#1a202c", "#d53f8c", "#2c7a7b")


def _time_unit(span_seconds: float) -> tuple[str, float]:
    """The unit the time axis is drawn in: seconds up to 10 minutes, minutes up to 3 hours, hours."""
    if span_seconds <= 600:
        return "s", 1.0
    if span_seconds <= 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def _tier_points(runs, start) -> dict[str, dict]:
    """Per tier: its window (seconds, from a run's window start and end; None if no run had a start),
    and per run its window end (seconds since ``start``) and lateness p50, p99 and max (seconds)."""
    tiers: dict[str, dict] = {}
    for summary in runs:
        lateness = summary.get("lateness_seconds") or {}
        if lateness.get("p99") is None:  # nothing promoted: no lateness to show
            continue
        end = datetime.fromisoformat(str(summary["window_end"]))
        tier = tiers.setdefault(summary["tier"], {"window": None, "at": [], "p50": [], "p99": [], "max": []})
        if summary.get("window_start"):
            tier["window"] = (end - datetime.fromisoformat(str(summary["window_start"]))).total_seconds()
        tier["at"].append((end - start).total_seconds())
        for q in ("p50", "p99", "max"):
            tier[q].append(lateness[q])
    return dict(sorted(tiers.items(), key=lambda item: (item[1]["window"] or 0, item[0])))


def _open_peak(seconds: list[float], timeline, group: str) -> int:
    """The most messages of a group not COMMITTED at once, over the samples that last (a sample
    lasts until the next one; ``seconds`` has one more entry, the axis' end)."""
    lasting = [snapshot[group] for i, (_, snapshot) in enumerate(timeline) if seconds[i + 1] > seconds[i]]
    return max(sum(n for state, n in counts.items() if state != "COMMITTED") for counts in lasting)


def _cut_above(seconds: list[float], timeline, group: str) -> int | None:
    """Where a group's panel cuts its y axis: when 1.4 times the most messages not COMMITTED at once
    stays under a quarter of the total, that rounded up to two digits, so that their bands stay
    readable below COMMITTED's; else None (the whole stack is shown)."""
    peak, total = _open_peak(seconds, timeline, group), sum(timeline[-1][1][group].values())
    if not 0 < peak * 1.4 < total / 4:
        return None
    step = 10 ** max(0, math.floor(math.log10(peak * 1.4)) - 1)
    return math.ceil(peak * 1.4 / step) * step


def _plot_states(axis, seconds: list[float], timeline, group: str, scale: float) -> None:
    """One group's messages per state as stacked steps (each sample holds until the next one)."""
    x = [s / scale for s in seconds]
    below = [0] * len(x)
    for state, colour in STACK.items():
        values = [snapshot[group].get(state, 0) for _, snapshot in timeline[: len(x) - 1]]
        values.append(values[-1])  # the last state holds to the axis' end
        above = [b + v for b, v in zip(below, values, strict=True)]
        label = f"{state:<13} {values[-1]:>9,} at end"
        if max(values) > values[-1]:
            label += f", peak {max(values):,}"
        axis.fill_between(x, below, above, step="post", color=colour, alpha=0.85, linewidth=0, label=label)
        below = above
    cut = _cut_above(seconds, timeline, group)
    axis.set_ylim(0, cut or max(below) * 1.04 or 1)
    if cut:
        axis.text(0.5, 0.9, f"axis cut at {cut:,}: COMMITTED continues up to {max(below):,} messages",
                  transform=axis.transAxes, ha="center", va="center", fontsize=9,
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})  # fmt: skip
        for side in (0, 1):  # a broken-axis mark at both ends of the top
            axis.plot([side - 0.008, side + 0.008], [0.985, 1.015], color="black", linewidth=1,
                      transform=axis.transAxes, clip_on=False)  # fmt: skip
    axis.set_ylabel("messages")
    axis.set_title(f"group {group}: messages per state, stacked", loc="left", fontsize=11)
    handles, labels = axis.get_legend_handles_labels()
    axis.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.01, 0.5),
                prop={"family": "monospace", "size": 8.5}, frameon=False)  # fmt: skip


def _plot_lateness(axis, tiers: dict[str, dict], scale: float) -> None:
    """Each tier's lateness per run (marker: p99, bar: p50 to max) and its window (dashed line)."""
    for (name, tier), colour in zip(tiers.items(), TIER_COLOURS * 4, strict=False):
        x = [a / scale for a in tier["at"]]
        window = tier["window"]
        label = f"{name} p99" + (f" (window {window:,.0f} s, dashed)" if window else "")
        axis.vlines(x, tier["p50"], tier["max"], color=colour, linewidth=1, alpha=0.6)
        axis.plot(x, tier["p99"], "o", color=colour, markersize=4, label=label, clip_on=False)
        if window:
            axis.axhline(window, color=colour, linestyle="--", linewidth=1.2)
    axis.set_yscale("symlog", linthresh=1)
    axis.set_ylim(bottom=0, top=max([1] + [t["window"] or 0 for t in tiers.values()]
                                    + [m for t in tiers.values() for m in t["max"]]) * 2.5)  # fmt: skip
    axis.set_ylabel("lateness (s)")
    axis.set_title(
        "lateness of each tier run's promotions: window end - due time (dot: p99, bar: p50 to max)",
        loc="left",
        fontsize=11,
    )
    if tiers:
        axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8.5, frameon=False)
    else:
        axis.text(0.5, 0.5, "no tier run promoted anything", transform=axis.transAxes, ha="center")


def write_chart(path: Path, timeline, runs, groups: list[str]) -> Path:
    """One figure: per group, its messages per state over simulated time, stacked (one panel per
    group, all on the same time axis), and below them each tier run's lateness against its window.

    ``timeline``: ``[(time, {group: {state: n}})]`` samples, each holding until the next;
    ``runs``: the tier runs' summaries (``tier``, ``window_start``, ``window_end``,
    ``lateness_seconds``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    start = timeline[0][0]
    seconds = [(t - start).total_seconds() for t, _ in timeline]
    tiers = _tier_points(runs, start)
    last = max(seconds + [a for t in tiers.values() for a in t["at"]])
    unit, scale = _time_unit(last)
    seconds.append(last + max(last * 0.03, 1))  # room for the final state
    # a group whose every message ended at once (a flat stack) gets a lower panel
    heights = [3 if _open_peak(seconds, timeline, group) else 1.6 for group in groups] + [2]
    fig, axes = plt.subplots(
        len(heights),
        1,
        sharex=True,
        figsize=(13, 1.1 * sum(heights) + 1),
        gridspec_kw={"height_ratios": heights},
        layout="constrained",
    )
    for axis, group in zip(axes, groups, strict=False):
        _plot_states(axis, seconds, timeline, group, scale)
        counts = matplotlib.ticker.MaxNLocator("auto", integer=True, steps=[1, 2, 2.5, 5, 10])
        axis.yaxis.set_major_locator(counts)  # messages: no 0.2 ticks
    _plot_lateness(axes[-1], tiers, scale)
    thousands = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v == int(v) else f"{v:,g}")
    for axis in axes:
        axis.yaxis.set_major_formatter(thousands)
        axis.xaxis.set_major_formatter(thousands)
        axis.grid(axis="both", color="#e2e8f0", linewidth=0.6)
        axis.set_axisbelow(True)
        axis.margins(x=0)
    axes[-1].set_xlabel(f"simulated time since publish ({unit})")
    total = sum(timeline[0][1][groups[0]].values())
    fig.suptitle(
        f"redelivery demo: {total:,} messages, {len(groups)} consumer groups, {len(runs):,} tier runs "
        f"over {f'{last / scale:,.1f}'.removesuffix('.0')} {unit} of simulated time",
        fontsize=13,
        fontweight="bold",
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["check", "summary_table", "write_chart"]
