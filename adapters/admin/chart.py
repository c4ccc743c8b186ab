"""The overview's 14-day chart as inline SVG: messages as bars, cost as a line."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from mnemo.adapters.admin.ports import DayActivity

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 56, 16, 36


def activity_svg(days: Sequence[DayActivity]) -> str:
    if not days:
        return '<p class="muted">No activity recorded.</p>'
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = inner_w / len(days)
    max_msgs = max(1, max(d.messages for d in days))
    max_cost = max(d.cost_usd for d in days) or 1.0
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="Messages and cost, last {len(days)} days" xmlns="http://www.w3.org/2000/svg">',
        f'<line class="axis" x1="{LEFT}" y1="{TOP + inner_h}" x2="{LEFT + inner_w}" y2="{TOP + inner_h}"/>',
        f'<text class="label" x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end">{max_msgs}</text>',
        f'<text class="label" x="{LEFT - 6}" y="{TOP + inner_h}" text-anchor="end">0</text>',
        f'<text class="label cost" x="{LEFT + inner_w + 6}" y="{TOP + 10}">${max_cost:.2f}</text>',
    ]
    points = []
    for i, d in enumerate(days):
        x = LEFT + i * slot
        h = inner_h * d.messages / max_msgs
        title = escape(f"{d.day.isoformat()}: {d.messages} messages, ${d.cost_usd:.4f}")
        parts.append(
            f'<rect class="bar" x="{x + slot * 0.15:.1f}" y="{TOP + inner_h - h:.1f}" '
            f'width="{slot * 0.7:.1f}" height="{h:.1f}"><title>{title}</title></rect>'
        )
        cx, cy = x + slot / 2, TOP + inner_h - inner_h * d.cost_usd / max_cost
        points.append(f"{cx:.1f},{cy:.1f}")
        if i % 2 == 0 or i == len(days) - 1:
            parts.append(
                f'<text class="label" x="{cx:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                f"{d.day.strftime('%m-%d')}</text>"
            )
    parts.append(f'<polyline class="cost-line" points="{" ".join(points)}"/>')
    parts.extend(
        f'<circle class="cost-dot" cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="3"/>' for p in points
    )
    parts.append("</svg>")
    legend = '<p class="legend"><span class="key bar"></span> messages <span class="key cost"></span> cost (USD)</p>'
    return "".join(parts) + legend
