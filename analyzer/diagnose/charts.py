"""Inline SVG charts for the HTML report: no script, no external file, opens offline."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 44
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#7f7f7f")


@dataclass(frozen=True)
class Series:
    """A line (``points``) and, drawn as markers, a few measured points (``markers``)."""

    name: str
    points: list[tuple[float, float]]
    markers: list[tuple[float, float]] = field(default_factory=list)
    marker_name: str = ""
    dashed: bool = False
    color: str | None = None  # None: the next of COLORS


def line_chart(
    series: list[Series], x_label: str, y_label: str, vertical: float | None = None
) -> str:
    """Lines over a logarithmic x axis and a 0-100% y axis; ``vertical`` marks one x value."""
    xs = [x for s in series for x, _ in s.points + s.markers if x > 0]
    if not xs:
        return ""
    low, high = math.log10(min(xs)), math.log10(max(xs) * 1.05)
    high = max(high, low + 1e-9)

    def px(x: float) -> float:
        return LEFT + (math.log10(max(x, min(xs))) - low) / (high - low) * (WIDTH - LEFT - RIGHT)

    parts = _frame(x_label, y_label)
    for decade in range(math.floor(low), math.ceil(high) + 1):
        x = 10.0**decade
        if min(xs) <= x <= max(xs) * 1.05:
            parts.append(_x_tick(px(x), _short(x)))
    if vertical is not None and vertical > 0:
        parts.append(
            f'<line x1="{px(vertical):.1f}" y1="{TOP}" x2="{px(vertical):.1f}" '
            f'y2="{HEIGHT - BOTTOM}" stroke="#888" stroke-dasharray="4 3"/>'
        )
    colors = [s.color or COLORS[i % len(COLORS)] for i, s in enumerate(series)]
    for s, color in zip(series, colors, strict=True):
        path = " ".join(f"{px(x):.1f},{_py(y):.1f}" for x, y in s.points if x > 0)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{path}"/>'
        )
        for x, y in s.markers:
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{_py(y):.1f}" r="4" fill="white" '
                f'stroke="{color}" stroke-width="2"><title>{escape(s.marker_name)} '
                f"{_short(x)}: {y:.1%}</title></circle>"
            )
    parts.append(_legend([(s.name, c, s.dashed) for s, c in zip(series, colors, strict=True)]))
    return _svg(parts)


def bar_chart(categories: list[str], groups: dict[str, list[float | None]], y_label: str) -> str:
    """Grouped vertical bars: one group per category, one bar per named series (0-100%)."""
    n_series = max(1, len(groups))
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    width = slot * 0.8 / n_series
    parts = _frame("", y_label)
    for c, category in enumerate(categories):
        x0 = LEFT + c * slot + slot * 0.1
        parts.append(_x_tick(x0 + slot * 0.4, category))
        for s, values in enumerate(groups.values()):
            value = values[c]
            if value is None:
                continue
            x = x0 + s * width
            parts.append(
                f'<rect x="{x:.1f}" y="{_py(value):.1f}" width="{width - 2:.1f}" '
                f'height="{_py(0) - _py(value):.1f}" fill="{COLORS[s % len(COLORS)]}">'
                f"<title>{escape(category)}: {value:.1%}</title></rect>"
            )
    parts.append(_legend([(name, COLORS[i % len(COLORS)], False) for i, name in enumerate(groups)]))
    return _svg(parts)


def stacked_bars(
    rows: dict[str, list[tuple[str, float]]], colors: dict[str, str] | None = None
) -> str:
    """One horizontal bar per row, split into named shares of the whole (0-1); ``colors`` gives
    a segment's colour by name (else the next of COLORS), so that no two share one."""
    colors = colors or {}
    height = 28 * len(rows) + 48
    parts = []
    names: list[str] = []
    for r, (label, segments) in enumerate(rows.items()):
        y = 8 + r * 28
        parts.append(f'<text x="4" y="{y + 15}" font-size="12">{escape(label)}</text>')
        x = 110.0
        for name, share in segments:
            if name not in names:
                names.append(name)
            width = share * (WIDTH - 130)
            color = colors.get(name) or COLORS[names.index(name) % len(COLORS)]
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{max(width, 0):.1f}" height="20" '
                f'fill="{color}"><title>{escape(name)}: {share:.1%}</title></rect>'
            )
            x += width
    legend = [
        (name, colors.get(name) or COLORS[i % len(COLORS)], False) for i, name in enumerate(names)
    ]
    parts.append(_legend(legend, y=height - 30, x=110))
    return _svg(parts, height)


def _frame(x_label: str, y_label: str) -> list[str]:
    parts = [
        f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" '
        'stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>',
    ]
    for share in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = _py(share)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
            f"{share:.0%}</text>"
        )
    parts.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" font-size="12" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(y_label)}</text>'
    )
    return parts


def _x_tick(x: float, label: str) -> str:
    return (
        f'<line x1="{x:.1f}" y1="{HEIGHT - BOTTOM}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM + 4}" '
        f'stroke="#333"/><text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" '
        f'text-anchor="middle">{escape(label)}</text>'
    )


def _legend(items: list[tuple[str, str, bool]], y: int = TOP + 4, x: int = LEFT + 10) -> str:
    """Swatches (a dashed line for a dashed series) and names left to right, wrapping to a new
    line at the right edge."""
    parts = []
    start = x
    for name, color, dashed in items:
        width = 24 + 7 * len(name)
        if x + width > WIDTH and x > start:
            x, y = start, y + 16
        if dashed:
            parts.append(
                f'<line x1="{x}" y1="{y + 6}" x2="{x + 12}" y2="{y + 6}" stroke="{color}" '
                'stroke-width="2" stroke-dasharray="4 2"/>'
            )
        else:
            parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 10}" font-size="12">{escape(name)}</text>')
        x += width
    return "".join(parts)


def _py(share: float) -> float:
    return HEIGHT - BOTTOM - max(0.0, min(1.0, share)) * (HEIGHT - BOTTOM - TOP)


def _short(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def _svg(parts: list[str], height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" font-family="sans-serif">' + "".join(parts) + "</svg>"
    )
