"""Charts for the operator's page as inline SVG: rendered on the server, no JavaScript and no
external resources (the page works offline and inside the Airflow UI's iframe).

Axes are linear and start at 0; ticks are round numbers (1, 2 or 5 times a power of ten). Every
bar and point carries its exact value in a ``<title>`` (the browser's tooltip, and what a test or a
screen reader reads) and in ``data-label`` / ``data-value`` attributes; bars are also labelled with
their counts. Every text that reaches the SVG is escaped here, whatever its origin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

FONT = "font-family:system-ui,sans-serif;font-size:12px;fill:#1a202c"
GRID = "#e2e8f0"
AXIS = "#a0aec0"


@dataclass(frozen=True)
class Bar:
    """One bar: its label, value (a count, >= 0) and fill colour. Columns are drawn with ``tick``
    (default: the label) and ``note`` (e.g. a delay level's duration) underneath."""

    label: str
    value: int
    color: str
    note: str = ""
    tick: str = ""


@dataclass(frozen=True)
class Series:
    """One line: its name, colour, and one value per x position (``None``: no point there)."""

    name: str
    color: str
    values: list[float | None]


def ticks(top: float, most: int = 5, whole: bool = False) -> list[float]:
    """0 and evenly spaced round ticks up to the first one >= ``top`` (at most about ``most``
    steps); ``whole``: steps of at least 1 (counts). ``top`` <= 0 gives ``[0, 1]``."""
    if top <= 0 or not math.isfinite(top):
        return [0, 1]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(1, round(step))
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def number(value: float) -> str:
    """A count with thousands separators, or a float with up to 3 decimals (``2.5``, ``0.1``)."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, content: str, anchor: str = "start", extra: str = "") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" style="{FONT}{extra}">{escape(content)}</text>'
    )


def _svg(chart_id: str, attrs: dict[str, str], width: int, height: int, title: str, body: list[str]) -> str:
    data = "".join(f' data-{k}="{escape(v)}"' for k, v in attrs.items())
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}"{data} role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"<title>{escape(title)}</title>"
        + _text(0, 14, title, extra=";font-weight:600")
        + "".join(body)
        + "</svg>"
    )


def horizontal_bars(
    chart_id: str,
    title: str,
    bars: list[Bar],
    unit: str,
    attrs: dict[str, str] | None = None,
    width: int = 440,
) -> str:
    """One row per bar, a linear count axis from 0 at the bottom, each bar labelled with its
    count; ``unit`` (e.g. ``"messages"``) goes in each bar's title."""
    left, right, top, row = 112, 56, 26, 24
    height = top + row * len(bars) + 24
    scale = ticks(max([b.value for b in bars] + [0]), whole=True)
    plot = width - left - right
    x = lambda v: left + plot * v / scale[-1]  # noqa: E731
    body = []
    for t in scale:
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{height - 20}" stroke="{GRID}"/>')
        body.append(_text(x(t), height - 6, number(t), "middle"))
    for i, b in enumerate(bars):
        y = top + i * row
        label = f"{b.label}: {number(b.value)} {unit}"
        body.append(
            f'<g data-label="{escape(b.label)}" data-value="{b.value}"><title>{escape(label)}</title>'
            f'<rect x="{left}" y="{y + 4}" width="{max(x(b.value) - left, 0):.1f}" height="{row - 8}" '
            f'fill="{escape(b.color)}"/>'
            + _text(left - 6, y + row / 2 + 4, b.label, "end")
            + _text(x(b.value) + 4, y + row / 2 + 4, number(b.value), extra=";font-weight:600")
            + "</g>"
        )
    body.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{height - 20}" stroke="{AXIS}"/>')
    return _svg(chart_id, attrs or {}, width, height, title, body)


def columns(
    chart_id: str,
    title: str,
    bars: list[Bar],
    unit: str,
    attrs: dict[str, str] | None = None,
    width: int = 560,
    height: int = 210,
) -> str:
    """One column per bar, left to right, on a linear count axis from 0; a column above 0 is
    labelled with its count, each with its label and note underneath."""
    left, right, top, bottom = 44, 8, 30, 40
    scale = ticks(max([b.value for b in bars] + [0]), whole=True)
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(len(bars), 1)
    y = lambda v: top + plot_h - plot_h * v / scale[-1]  # noqa: E731
    body = []
    for t in scale:
        body.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="{GRID}"/>'
        )
        body.append(_text(left - 6, y(t) + 4, number(t), "end"))
    for i, b in enumerate(bars):
        cx = left + step * (i + 0.5)
        label = (
            f"{b.label} ({b.note}): {number(b.value)} {unit}"
            if b.note
            else f"{b.label}: {number(b.value)} {unit}"
        )
        parts = [
            f'<g data-label="{escape(b.label)}" data-value="{b.value}"><title>{escape(label)}</title>',
            f'<rect x="{cx - step * 0.35:.1f}" y="{y(b.value):.1f}" width="{step * 0.7:.1f}" '
            f'height="{y(0) - y(b.value):.1f}" fill="{escape(b.color)}"/>',
            _text(cx, height - bottom + 14, b.tick or b.label, "middle"),
            _text(cx, height - bottom + 28, b.note, "middle", ";fill:#718096;font-size:10px"),
        ]
        if b.value:
            parts.append(_text(cx, y(b.value) - 4, number(b.value), "middle", ";font-weight:600"))
        body.append("".join(parts) + "</g>")
    body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="{AXIS}"/>')
    return _svg(chart_id, attrs or {}, width, height, title, body)


def lines(
    chart_id: str,
    title: str,
    xlabels: list[str],
    series: list[Series],
    unit: str,
    attrs: dict[str, str] | None = None,
    width: int = 440,
    height: int = 190,
) -> str:
    """Values at evenly spaced x positions (``xlabels``, e.g. each run's window end; the first and
    the last are written under the axis) on a linear y axis from 0 in ``unit``; consecutive points
    of a series are joined, a ``None`` leaves a gap. Each point's title names its x label."""
    left, right, top, bottom = 52, 12, 44, 24
    values = [v for s in series for v in s.values if v is not None]
    scale = ticks(max(values + [0]))
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(xlabels), 1)
    x = lambda i: left + (plot_w * (i + 0.5) / n)  # noqa: E731
    y = lambda v: top + plot_h - plot_h * v / scale[-1]  # noqa: E731
    body = []
    for t in scale:
        body.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="{GRID}"/>'
        )
        body.append(_text(left - 6, y(t) + 4, f"{number(t)} {unit}", "end"))
    body.append(f'<line x1="{left}" x2="{width - right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="{AXIS}"/>')
    if xlabels:
        body.append(_text(left, height - 6, xlabels[0], "start", ";fill:#718096"))
        if len(xlabels) > 1:
            body.append(_text(width - right, height - 6, xlabels[-1], "end", ";fill:#718096"))
    for k, s in enumerate(series):
        legend_x = left + 90 * k
        body.append(f'<rect x="{legend_x}" y="24" width="12" height="4" fill="{escape(s.color)}"/>')
        body.append(_text(legend_x + 16, 30, s.name))
        radius = max(4.5 - 1.5 * k, 2)  # a later series' points smaller: equal values stay visible
        run: list[str] = []
        for i, v in enumerate(s.values + [None]):
            if v is not None:
                run.append(f"{x(i):.1f},{y(v):.1f}")
                continue
            if len(run) > 1:
                body.append(
                    f'<polyline points="{" ".join(run)}" fill="none" stroke="{escape(s.color)}" '
                    'stroke-width="2"/>'
                )
            run = []
        for i, v in enumerate(s.values):
            if v is None:
                continue
            label = f"{xlabels[i]}: {s.name} {number(v)} {unit}"
            body.append(
                f'<g data-label="{escape(s.name)} {escape(xlabels[i])}" data-value="{v}">'
                f"<title>{escape(label)}</title>"
                f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="{radius}" fill="{escape(s.color)}"/></g>'
            )
    return _svg(chart_id, attrs or {}, width, height, title, body)


def sparkline(
    chart_id: str, label: str, counts: list[int], start: str, end: str, color: str = "#c53030"
) -> str:
    """A small bar chart of ``counts`` over equal spans of time from ``start`` to ``end`` (their
    texts, for the title), one bar each, scaled to the largest; no axes. Every bar carries its
    count in a ``<title>`` and ``data-value``: the dead letters of one failure over time."""
    width, height, top = 3 * len(counts), 20, max(counts, default=0) or 1
    bars = [
        f'<rect x="{3 * i}" y="{height - max(1.0, 18 * n / top) if n else height:.1f}" width="2" '
        f'height="{max(1.0, 18 * n / top) if n else 0:.1f}" fill="{color}" data-value="{n}">'
        f"<title>{n:,}</title></rect>"
        for i, n in enumerate(counts)
    ]
    title = f"{label}: dead letters from {start} to {end}, {len(counts)} equal spans"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="sparkline" role="img" '
        f'width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
        + "".join(bars)
        + "</svg>"
    )
