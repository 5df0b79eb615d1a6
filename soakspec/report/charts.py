"""Inline SVG charts, generated in Python: no script, no fonts, no external reference.

`line_chart` draws series of (x, y) points (None breaks the line), `bar_chart` stacked bars,
`empty_chart` a framed message ("no GPU telemetry"). x is seconds since the backend's first
bucket; `bands` shade the levels; `Threshold` lines show a rule's threshold
(`<line class="threshold">`), `Mark` rects a failing bucket (`<rect class="failing-bucket">`). Every string is escaped here; callers pass plain text.
Each chart is `<svg class="chart" data-backend=… data-metric=…>` so a test can count them.
"""

from __future__ import annotations

import dataclasses
import html
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from soakspec.report.common import clean_text

W, H = 400, 230
ML, MR, MT, MB = 54, 12, 46, 34  # margins: left, right, top (title, legend, level labels), bottom
TITLE_Y, LEGEND_Y = 15, 30


def esc(value: object) -> str:
    return html.escape(clean_text(value), quote=True)


@dataclasses.dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float | None], ...]
    color: str
    dash: str | None = None


@dataclasses.dataclass(frozen=True)
class Band:
    x0: float
    x1: float
    label: str


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A rule's threshold, drawn as a dashed horizontal line (`y` in the chart's units)."""

    y: float
    label: str  # the rule as written


@dataclasses.dataclass(frozen=True)
class Mark:
    """A bucket (or level) where a rule failed: shaded red over its x range (`kind`
    `failing-bucket`); where a warn rule did not pass: an amber outline (`warn-bucket`)."""

    x0: float
    x1: float
    label: str
    kind: str = "failing-bucket"


def broken_at(points: Sequence[tuple[float, float | None]], keys: Sequence[Any]) -> tuple[tuple[float, float | None], ...]:
    """The points with a gap (None) wherever the level changes: no line joins two levels."""
    out: list[tuple[float, float | None]] = []
    for i, (p, k) in enumerate(zip(points, keys)):
        if i and keys[i - 1] != k:
            out.append((p[0], None))
        out.append(p)
    return tuple(out)


def nice_step(span: float, ticks: int = 4) -> float:
    """A 1/2/2.5/5 x 10^k step giving about `ticks` intervals over `span`."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / ticks
    mag = 10.0 ** math.floor(math.log10(raw))  # a float: the axis is drawn in floats
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _tick_text(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


def _open(backend: str, metric: str, title: str) -> list[str]:
    label = f"{title} — backend {backend}"
    return [
        f'<svg class="chart" data-backend="{esc(backend)}" data-metric="{esc(metric)}" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}" role="img" aria-label="{esc(label)}">',
        f"<title>{esc(label)}</title>",
        f'<rect x="0.5" y="0.5" width="{W - 1}" height="{H - 1}" class="frame"/>',
        f'<text x="{ML}" y="{TITLE_Y}" class="ctitle">{esc(title)}</text>',
    ]


def _wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap; a word longer than `width` is cut."""
    lines: list[str] = []
    cur = ""
    for word in text.split():
        word = word if len(word) <= width else word[: width - 1] + "…"
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return lines or [""]


def empty_chart(backend: str, metric: str, title: str, message: str) -> str:
    parts = _open(backend, metric, title)
    parts.append(f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" class="band0"/>')
    for i, line in enumerate(_wrap(message, 46)[:4]):
        parts.append(f'<text x="{(ML + W - MR) / 2:.1f}" y="{MT + 40 + 17 * i:.1f}" class="empty" text-anchor="middle">{esc(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


class _Frame:
    def __init__(self, x_max: float, y_max: float):
        self.x_max = x_max if x_max > 0 else 1.0
        top = y_max if y_max > 0 and math.isfinite(y_max) else 1.0
        step = nice_step(top)
        self.y_step = step
        self.y_max = step * max(1, math.ceil(top / step - 1e-9))
        if not math.isfinite(self.y_max):  # rounded up past the largest float: the axis ends at the top value
            self.y_max = top
        self.pw, self.ph = W - ML - MR, H - MT - MB

    def x(self, v: float) -> float:
        return ML + self.pw * v / self.x_max

    def y(self, v: float) -> float:
        return MT + self.ph * (1 - v / self.y_max)

    def axes(self, bands: Sequence[Band], y_label: str) -> list[str]:
        out = []
        for i, b in enumerate(bands):
            x0, x1 = self.x(max(0.0, b.x0)), self.x(min(self.x_max, b.x1))
            out.append(f'<rect x="{x0:.1f}" y="{MT}" width="{max(0.0, x1 - x0):.1f}" height="{self.ph}" class="band{i % 2}">'
                       f"<title>{esc(b.label)}</title></rect>")
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{MT - 4}" class="blabel" text-anchor="middle">{esc(b.label)}</text>')
        v = 0.0
        while v <= self.y_max + 1e-9:
            y = self.y(v)
            out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
            out.append(f'<text x="{ML - 5}" y="{y + 3.5:.1f}" class="tick" text-anchor="end">{_tick_text(v)}</text>')
            v += self.y_step
        xs = nice_step(self.x_max, 5)
        v = 0.0
        while v <= self.x_max + 1e-9:
            x = self.x(v)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT + self.ph}" y2="{MT + self.ph + 4}" class="axis"/>')
            out.append(f'<text x="{x:.1f}" y="{MT + self.ph + 15}" class="tick" text-anchor="middle">{_tick_text(v)}</text>')
            v += xs
        out.append(f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{MT + self.ph}" class="axis"/>')
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{MT + self.ph}" y2="{MT + self.ph}" class="axis"/>')
        out.append(f'<text x="{W - MR}" y="{H - 4}" class="tick" text-anchor="end">seconds since the first bucket</text>')
        out.append(f'<text x="12" y="{MT + self.ph / 2:.1f}" class="tick" text-anchor="middle" '
                   f'transform="rotate(-90 12 {MT + self.ph / 2:.1f})">{esc(y_label)}</text>')
        return out


def _legend(items: Sequence[tuple[str, str]], title: str) -> list[str]:
    """Right-aligned beside the title when it fits, else on its own line under it."""
    widths = [13 + 6.2 * len(label) + 10 for label, _ in items]
    total = sum(widths)
    beside = ML + 7.2 * len(title) + 16 + total <= W - MR
    y = TITLE_Y if beside else LEGEND_Y
    x = W - MR - total if beside else ML
    out = []
    for (label, color), w in zip(items, widths):
        out.append(f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{x + 13:.1f}" y="{y}" class="legend">{esc(label)}</text>')
        x += w
    return out


def _marks(f: "_Frame", marks: Sequence[Mark]) -> list[str]:
    out = []
    for m in sorted(marks, key=lambda m: m.kind != "warn-bucket"):  # warnings first: a failure is drawn over them
        x0, x1 = f.x(max(0.0, m.x0)), f.x(min(f.x_max, m.x1))
        kind = "warn-bucket" if m.kind == "warn-bucket" else "failing-bucket"
        out.append(f'<rect x="{x0:.1f}" y="{MT}" width="{max(2.0, x1 - x0):.1f}" height="{f.ph}" class="{kind}">'
                   f"<title>{esc(m.label)}</title></rect>")
    return out


def _thresholds(f: "_Frame", thresholds: Sequence[Threshold]) -> list[str]:
    out = []
    for t in thresholds:
        y = f.y(t.y)
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="threshold"><title>{esc(t.label)}</title></line>')
        out.append(f'<text x="{W - MR - 2}" y="{y - 3:.1f}" class="tlabel" text-anchor="end">{esc(t.label)}</text>')
    return out


def line_chart(backend: str, metric: str, title: str, y_label: str, series: Sequence[Series], bands: Sequence[Band],
               x_max: float, fmt: Callable[[float], str], empty: str = "no data", *,
               thresholds: Sequence[Threshold] = (), marks: Sequence[Mark] = ()) -> str:
    """Lines with a marker per point; each marker's <title> gives the exact value. A None point
    breaks the line (callers put one between levels: no line joins two levels). `thresholds`
    are dashed lines (the y range grows to show them), `marks` shade failing buckets."""
    ys = [y for s in series for _, y in s.points if y is not None and math.isfinite(y)]
    if not ys:
        return empty_chart(backend, metric, title, empty)
    tys = [t.y for t in thresholds if math.isfinite(t.y)]
    f = _Frame(x_max, max(ys + [min(y * 1.08, sys.float_info.max) for y in tys]))  # room above a threshold
    parts = _open(backend, metric, title) + f.axes(bands, y_label) + _marks(f, marks) + _thresholds(f, thresholds)
    for s in series:
        seg: list[str] = []
        segs: list[list[str]] = []
        for x, y in s.points:
            if y is None or not math.isfinite(y):
                if seg:
                    segs.append(seg)
                seg = []
                continue
            seg.append(f"{f.x(x):.1f},{f.y(y):.1f}")
        if seg:
            segs.append(seg)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        for sg in segs:
            parts.append(f'<polyline points="{" ".join(sg)}" fill="none" stroke="{s.color}" stroke-width="2"{dash}/>')
        for x, y in s.points:
            if y is None or not math.isfinite(y):
                continue
            parts.append(f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="3" fill="{s.color}">'
                         f"<title>{esc(s.label)} at {x:.1f}s: {esc(fmt(y))}</title></circle>")
    parts += _legend([(s.label, s.color) for s in series], title)
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(backend: str, metric: str, title: str, y_label: str, bars: Sequence[tuple[float, float, Sequence[float]]],
              kinds: Sequence[tuple[str, str]], bands: Sequence[Band], x_max: float, note: str | None = None, *,
              marks: Sequence[Mark] = ()) -> str:
    """Stacked bars: `bars` = (x0, x1, values per kind); `kinds` = (label, color)."""
    totals = [sum(v) for _, _, v in bars]
    f = _Frame(x_max, max(totals, default=0.0))
    parts = _open(backend, metric, title) + f.axes(bands, y_label) + _marks(f, marks)
    for (x0, x1, values), total in zip(bars, totals):
        pad = (x1 - x0) * 0.1
        bx0, bx1 = f.x(x0 + pad), f.x(x1 - pad)
        base = 0.0
        for (label, color), v in zip(kinds, values):
            if v <= 0:
                continue
            ytop, ybot = f.y(base + v), f.y(base)
            parts.append(f'<rect x="{bx0:.1f}" y="{ytop:.1f}" width="{max(1.0, bx1 - bx0):.1f}" height="{ybot - ytop:.1f}" '
                         f'fill="{color}"><title>{esc(label)}: {v:g}</title></rect>')
            base += v
    if note:
        parts.append(f'<text x="{ML + f.pw / 2:.1f}" y="{MT + f.ph / 2 + 14:.1f}" class="empty" text-anchor="middle">{esc(note)}</text>')
    parts += _legend(list(kinds), title)
    parts.append("</svg>")
    return "\n".join(parts)
