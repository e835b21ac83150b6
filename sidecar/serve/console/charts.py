"""Line charts as inline SVG, drawn on the server (nothing fetched or run in the browser):
`line_chart(title, minutes, series, unit)`. Presentation attributes only (the console's
Content-Security-Policy allows no inline style); each chart is an `img` with a text
alternative and its numbers in a table under a `<details>` for screen readers and copying.

Imports nothing of ours. Exports `line_chart`, `PALETTE`, `WIDTH` and `HEIGHT`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 1100, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 16, 14, 28
PALETTE = ("#1f5fbf", "#b3261e", "#11712f", "#8a5a00", "#6a3fb5", "#00687a", "#a8326e",
           "#4a5563")
"""Colours with at least 4.5:1 contrast on white (they also colour the legend's text)."""

Series = tuple[str, Sequence[float | None]]


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def _ticks(top: float) -> list[float]:
    """About four round values from 0 to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    step = 10 ** len(str(int(top / 4))) / 10 if top >= 4 else top / 4
    for factor in (1, 2, 2.5, 5, 10):
        if top / (step * factor) <= 4:
            step *= factor
            break
    return [i * step for i in range(0, int(top / step) + 2)]


def line_chart(title: str, minutes: Sequence[int], series: Sequence[Series], unit: str,
               chart_id: str) -> str:
    """`minutes`: epoch seconds of each point; `series`: (label, one value or None per
    minute). An empty chart says so."""
    e = escape
    values = [v for _, points in series for v in points if v is not None]
    if not values:
        return (f'<figure class=chart id="{e(chart_id)}"><figcaption><strong>{e(title)}'
                f'</strong></figcaption><p class=muted>Nothing yet in the last hour.</p>'
                "</figure>")
    ticks = _ticks(max(values))
    top = ticks[-1] or 1.0
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    count = max(len(minutes) - 1, 1)

    def x(i: int) -> float:
        return _LEFT + plot_w * i / count

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    grid = "".join(
        f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
        f'stroke="#e3e6ea"/><text x="{_LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end" '
        f'font-size="11" fill="#4a5563">{e(_number(t))}</text>'
        for t in ticks)
    labels = "".join(
        f'<text x="{x(i):.1f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="11" '
        f'fill="#4a5563">{time.strftime("%H:%M", time.gmtime(minutes[i]))}</text>'
        for i in range(0, len(minutes), 10))
    lines = []
    for n, (_label, points) in enumerate(series):
        colour = PALETTE[n % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for i, v in enumerate(points):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                lines.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colour}"/>')
            elif run:
                lines.append(f'<polyline points="{" ".join(run)}" fill="none" '
                             f'stroke="{colour}" stroke-width="2"/>')
    legend = "".join(
        f'<span class=key><svg width="14" height="4" aria-hidden="true"><rect width="14" '
        f'height="4" fill="{PALETTE[n % len(PALETTE)]}"/></svg> {e(label)}</span>'
        for n, (label, _) in enumerate(series))
    latest = "; ".join(
        f"{label}: {_number(last)} {unit}" for label, points in series
        for last in [next((v for v in reversed(points) if v is not None), None)]
        if last is not None)
    summary = f"{title}, the last hour by minute. Latest: {latest}."
    svg = (f'<svg class=plot viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'aria-label="{e(summary)}">'
           f'<title>{e(summary)}</title>{grid}{labels}{"".join(lines)}</svg>')
    head = "".join(f"<th>{e(label)}</th>" for label, _ in series)
    rows = "".join(
        f"<tr><td>{time.strftime('%H:%M', time.gmtime(m))}</td>" + "".join(
            f"<td>{'' if points[i] is None else e(_number(points[i] or 0.0))}</td>"
            for _, points in series) + "</tr>"
        for i, m in enumerate(minutes)
        if any(points[i] is not None for _, points in series))
    return (f'<figure class=chart id="{e(chart_id)}"><figcaption><strong>{e(title)}</strong> '
            f'<span class=muted>({e(unit)}, UTC)</span> {legend}</figcaption>{svg}'
            f'<details><summary>the numbers</summary><table><thead><tr><th>minute</th>{head}'
            f'</tr></thead><tbody>{rows}</tbody></table></details></figure>')
