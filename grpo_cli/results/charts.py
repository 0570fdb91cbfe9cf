"""The report's charts as SVG, drawn at write time in plain Python: no plotting library, no
script, a few kilobytes a chart; a browser's native tooltip (an SVG ``<title>``) is the hover.

Three kinds, each the kind its axis calls for, every value axis from zero:

- :func:`ordered_chart`: shares stacked as areas over an ordered axis (steps: whole-number
  ticks; markers only over a few points), a separate line of the mean reward below;
- :func:`ranked_chart`: shares stacked as horizontal bars, one row per category in the order
  given (the caller ranks them), beside dots of the mean reward;
- :func:`bar_chart`: a count per label, as vertical bars.

Each takes the ``width`` it is drawn at, in CSS pixels (its ``viewBox``): the report draws each
chart twice, for a laptop and a phone, and shows one by the window's width.

>>> svg = bar_chart(labels=["4", "8"], counts=[3, 12], color="#72B7B2", x_title="rollouts",
...                 y_title="groups", width=400)
>>> svg.startswith('<svg class="chart-svg"') and svg.count("<rect") >= 2
True
>>> nice_ticks(0.37, percent=True)
[0.0, 0.1, 0.2, 0.3, 0.4]
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"
AXIS = "#444"
GRID = "#e6e6e6"
CHAR_WIDTH = 0.58  # an average character's width, in ems of the font size (for layout only)


@dataclass(frozen=True)
class Series:
    """One stacked part: its name, colour, value at each point (a share in [0, 1]) and what
    its hover says at each point."""

    name: str
    color: str
    values: Sequence[float]
    hovers: Sequence[str]


def _nice_step(rough: float, multiples: tuple[float, ...]) -> float:
    """The least of ``multiples`` times a power of ten that is at least ``rough`` (> 0).

    >>> _nice_step(2.4, (1, 2, 5)), _nice_step(2.4, (1, 2, 2.5, 5)), _nice_step(0.7, (1, 2, 5))
    (5.0, 2.5, 1.0)
    """
    power = 10.0 ** math.floor(math.log10(rough))
    return next(m * power for m in (*multiples, 10) if m * power >= rough)


def nice_ticks(high: float, *, percent: bool = False, integer: bool = False, count: int = 5) -> list[float]:
    """Ticks from 0 to at least ``high`` on a 1, 2, 2.5 or 5 times a power of ten step
    (``integer``: whole-number steps only; ``percent``: no finer than 1%).

    >>> nice_ticks(12, integer=True)
    [0.0, 5.0, 10.0, 15.0]
    >>> nice_ticks(0)
    [0.0, 1.0]
    """
    if not high > 0 or not math.isfinite(high):
        return [0.0, 1.0]
    step = _nice_step(high / count, (1, 2, 5) if integer else (1, 2, 2.5, 5))
    if integer:
        step = max(1.0, step)
    if percent:
        step = max(step, 0.01)
    ticks = [0.0]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def ordered_ticks(low: float, high: float, *, integer: bool, count: int) -> list[float]:
    """At most about ``count`` ticks over ``[low, high]`` (an ordered axis, not from zero), at
    the multiples of a 1, 2 or 5 times a power of ten step: whole numbers for integer values.

    >>> ordered_ticks(1, 300, integer=True, count=10)[:3]
    [50, 100, 150]
    >>> ordered_ticks(1, 3, integer=True, count=10)
    [1, 2, 3]
    >>> ordered_ticks(0.5, 0.5, integer=False, count=10)
    [0.5]
    """
    if high <= low:
        return [low]
    step = _nice_step((high - low) / count, (1, 2, 5))
    if integer:
        step = max(1, round(step))
        return list(range(-(-int(low) // step) * step, int(high) + 1, step))
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 12) for i in range(first, math.floor(high / step + 1e-9) + 1)]


def _label(value: float, *, percent: bool = False) -> str:
    if percent:
        return f"{value * 100:.0f}%"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def _escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def _text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR_WIDTH


def _fit(text: str, room: float, size: float) -> str:
    """``text`` cut (with an ellipsis) to about ``room`` pixels."""
    most = max(1, int(room / (size * CHAR_WIDTH)))
    return text if len(text) <= most else text[: max(1, most - 1)] + "…"


class _Canvas:
    """SVG elements appended in drawing order."""

    def __init__(self, width: float, font_size: float) -> None:
        self.width = width
        self.size = font_size
        self.parts: list[str] = []

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        anchor: str = "start",
        size: float | None = None,
        weight: str = "normal",
        fill: str = AXIS,
        rotate: float = 0,
    ) -> None:
        turn = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size or self.size:g}" '
            f'font-weight="{weight}" fill="{fill}"{turn}>{_escape(text)}</text>'
        )

    def line(
        self, x1: float, y1: float, x2: float, y2: float, *, color: str = GRID, width: float = 1
    ) -> None:
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
            f'stroke-width="{width:g}"/>'
        )

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        *,
        fill: str,
        hover: str | None = None,
        opacity: float = 1,
    ) -> None:
        title = f"<title>{_escape(hover)}</title>" if hover else ""
        shade = f' fill-opacity="{opacity:g}"' if opacity != 1 else ""
        self.parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" '
            f'fill="{fill}"{shade}>{title}</rect>'
        )

    def polygon(self, points: Sequence[tuple[float, float]], *, fill: str, opacity: float) -> None:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(
            f'<polygon points="{path}" fill="{fill}" fill-opacity="{opacity:g}" stroke="none"/>'
        )

    def polyline(self, points: Sequence[tuple[float, float]], *, color: str, width: float = 1.5) -> None:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width:g}" '
            'stroke-linejoin="round"/>'
        )

    def circle(self, x: float, y: float, r: float, *, color: str, hover: str | None = None) -> None:
        title = f"<title>{_escape(hover)}</title>" if hover else ""
        self.parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{color}">{title}</circle>')

    def value_axis(
        self,
        ticks: Sequence[float],
        *,
        left: float,
        right: float,
        y_of: Callable[[float], float],
        percent: bool,
    ) -> None:
        """Horizontal grid lines at ``ticks`` with their labels at the left."""
        for tick in ticks:
            y = y_of(tick)
            self.line(left, y, right, y)
            self.text(left - 6, y + self.size * 0.35, _label(tick, percent=percent), anchor="end")

    def legend(self, items: Sequence[tuple[str, str]], *, top: float, left: float) -> float:
        """Colour swatches and names in rows that wrap at the width; the height they take."""
        x, y, row = left, top, self.size + 8
        for name, color in items:
            room = 16 + _text_width(name, self.size) + 18
            if x > left and x + room > self.width - 8:
                x, y = left, y + row
            if color == "line":
                self.line(x, y + row / 2 - 4, x + 12, y + row / 2 - 4, color="black", width=2)
            else:
                self.rect(x, y + row / 2 - 9, 12, 10, fill=color, opacity=0.8)
            self.text(x + 16, y + row / 2, name)
            x += room
        return y + row - top

    def svg(self, height: float, title: str) -> str:
        return (
            f'<svg class="chart-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width:g} '
            f'{height:.0f}" width="{self.width:g}" height="{height:.0f}" role="img" '
            f'aria-label="{_escape(title)}" font-family="{FONT}">'
            f'<rect width="100%" height="100%" fill="white"/>' + "".join(self.parts) + "</svg>"
        )


def _titled_canvas(width: float, title: str | None) -> tuple[_Canvas, float, float]:
    """A chart's canvas at ``width`` (a smaller font on a phone), its font size, and where its
    drawing starts below the title (a picture keeps the title; a page has its own heading)."""
    size = 12.0 if width >= 500 else 11.0
    canvas = _Canvas(width, size)
    if not title:
        return canvas, size, 8.0
    canvas.text(
        8, size * 1.6, _fit(title, width - 16, size * 1.25), size=size * 1.25, weight="600", fill="#222"
    )
    return canvas, size, size * 2.6


def ordered_chart(
    *,
    column: str,
    x: Sequence[float],
    parts: Sequence[Series],
    means: Sequence[float | None],
    width: float,
    title: str | None = None,
    markers_up_to: int = 30,
) -> str:
    """Shares stacked as areas over the ordered values ``x`` (ascending), and below them the
    mean reward as a line, each on an axis from zero; one hover per value covers both.

    >>> parts = [Series("all failed", "#d62728", [0.5, 0.25], ["a", "b"])]
    >>> svg = ordered_chart(column="step", x=[1, 2], parts=parts, means=[0.2, 0.4], width=600)
    >>> svg.count("<polygon"), svg.count("<polyline"), ">step<" in svg
    (1, 2, True)
    """
    canvas, size, top = _titled_canvas(width, title)
    integer = all(float(v).is_integer() for v in x)
    left, right = 52.0, width - 16
    low, high = (min(x), max(x)) if x else (0.0, 1.0)
    spread = high - low

    def x_of(value: float) -> float:
        return (left + right) / 2 if spread == 0 else left + (value - low) / spread * (right - left)

    # the inactive shares, stacked
    canvas.text(left, top + size, "inactive groups (share of the groups)", weight="600", fill="#222")
    area_top, area_height = top + size + 10, 210.0 if width >= 500 else 170.0
    stacked = [sum(s.values[i] for s in parts) for i in range(len(x))]
    y_ticks = nice_ticks(max(stacked, default=0.0), percent=True)

    def y_area(value: float) -> float:
        return area_top + area_height * (1 - value / y_ticks[-1])

    canvas.value_axis(y_ticks, left=left, right=right, y_of=y_area, percent=True)
    below = [0.0] * len(x)
    marked = len(x) <= markers_up_to
    for part in parts:
        above = [b + v for b, v in zip(below, part.values, strict=True)]
        upper = [(x_of(xv), y_area(a)) for xv, a in zip(x, above, strict=True)]
        lower = [(x_of(xv), y_area(b)) for xv, b in zip(x, below, strict=True)]
        if len(x) == 1:  # one value: a band the width of a bar
            (px, uy), (_, ly) = upper[0], lower[0]
            canvas.rect(px - 12, uy, 24, ly - uy, fill=part.color, opacity=0.6)
        else:
            canvas.polygon([*upper, *reversed(lower)], fill=part.color, opacity=0.55)
            canvas.polyline(upper, color=part.color)
        if marked:
            for px, py in upper:
                canvas.circle(px, py, 2.5, color=part.color)
        below = above
    # the mean reward, on its own axis from zero
    line_top = area_top + area_height + size * 2.2
    canvas.text(left, line_top, "mean reward", weight="600", fill="#222")
    line_top += 8
    line_height = 90.0 if width >= 500 else 80.0
    mean_ticks = nice_ticks(max((m for m in means if m is not None), default=0.0), count=3)

    def y_line(value: float) -> float:
        return line_top + line_height * (1 - value / mean_ticks[-1])

    canvas.value_axis(mean_ticks, left=left, right=right, y_of=y_line, percent=False)
    drawn = [(x_of(xv), y_line(m)) for xv, m in zip(x, means, strict=True) if m is not None]
    if len(drawn) > 1:
        canvas.polyline(drawn, color="black")
    if marked or len(drawn) == 1:
        for px, py in drawn:
            canvas.circle(px, py, 2.5, color="black")
    # the ordered axis
    axis_y = line_top + line_height
    canvas.line(left, axis_y, right, axis_y, color=AXIS)
    count = max(2, int((right - left) // (70 if width >= 500 else 55)))
    for tick in ordered_ticks(low, high, integer=integer, count=count):
        px = x_of(tick)
        canvas.line(px, axis_y, px, axis_y + 4, color=AXIS)
        canvas.text(px, axis_y + size + 6, _label(tick), anchor="middle")
    canvas.text((left + right) / 2, axis_y + size * 2 + 14, column, anchor="middle", weight="600")
    # one hover column per value, over both panels
    for i, xv in enumerate(x):
        half = (right - left) / (2 * max(len(x) - 1, 1)) if spread else 12.0
        lines = [f"{column} {_label(xv)}"] + [part.hovers[i] for part in parts]
        if means[i] is not None:
            lines.append(f"mean reward {means[i]:.4g}")
        canvas.rect(
            x_of(xv) - half,
            area_top,
            2 * half,
            axis_y - area_top,
            fill="white",
            opacity=0,
            hover="\n".join(lines),
        )
    legend_top = axis_y + size * 2 + 24
    legend = [(p.name, p.color) for p in parts] + [("mean reward", "line")]
    height = legend_top + canvas.legend(legend, top=legend_top, left=left) + 6
    return canvas.svg(height, title or f"By {column}")


def ranked_chart(
    *,
    column: str,
    labels: Sequence[str],
    parts: Sequence[Series],
    means: Sequence[float | None],
    width: float,
    title: str | None = None,
) -> str:
    """One row per label, in the order given: shares stacked as horizontal bars, and the mean
    reward as a dot on an axis of its own, each from zero.

    >>> parts = [Series("all failed", "#d62728", [0.5, 0.25], ["a: 50%", "b: 25%"])]
    >>> svg = ranked_chart(column="source", labels=["a", "b"], parts=parts, means=[0.2, None], width=600)
    >>> svg.count("<circle"), svg.count("<title>a: 50%</title>")
    (1, 1)
    """
    canvas, size, top = _titled_canvas(width, title)
    widest = max((_text_width(label, size) for label in labels), default=0.0)
    label_room = min(widest, width * (0.32 if width >= 500 else 0.3))
    left = 18 + label_room
    right = width - 12
    split = left + (right - left) * 0.66
    bars_right, dots_left = split - 18, split + 22
    heading = "inactive groups (share, worst first)" if width >= 500 else "inactive (share, worst first)"
    canvas.text(left, top + size, _fit(heading, bars_right - left, size), weight="600", fill="#222")
    canvas.text(
        dots_left, top + size, _fit("mean reward", right - dots_left, size), weight="600", fill="#222"
    )
    rows_top, pitch = top + size + 12, 24.0
    rows_bottom = rows_top + pitch * len(labels)
    totals = [sum(s.values[i] for s in parts) for i in range(len(labels))]
    share_ticks = nice_ticks(max(totals, default=0.0), percent=True, count=4 if width >= 500 else 3)
    mean_ticks = nice_ticks(max((m for m in means if m is not None), default=0.0), count=2)

    def x_share(value: float) -> float:
        return left + (bars_right - left) * value / share_ticks[-1]

    def x_mean(value: float) -> float:
        return dots_left + (right - dots_left) * value / mean_ticks[-1]

    for ticks, x_of, percent in ((share_ticks, x_share, True), (mean_ticks, x_mean, False)):
        for tick in ticks:
            px = x_of(tick)
            canvas.line(px, rows_top - 4, px, rows_bottom, color=GRID)
            canvas.text(px, rows_bottom + size + 4, _label(tick, percent=percent), anchor="middle")
    for i, label in enumerate(labels):
        y = rows_top + pitch * i
        canvas.parts.append(f"<g><title>{_escape(label)}</title>")
        canvas.text(left - 8, y + pitch / 2 + size * 0.35, _fit(label, label_room + 1, size), anchor="end")
        canvas.parts.append("</g>")
        start = 0.0
        for part in parts:
            value = part.values[i]
            if value > 0:
                canvas.rect(
                    x_share(start),
                    y + 4,
                    x_share(start + value) - x_share(start),
                    pitch - 8,
                    fill=part.color,
                    opacity=0.85,
                    hover=part.hovers[i],
                )
            start += value
        mean = means[i]
        if mean is not None:
            canvas.circle(
                x_mean(mean), y + pitch / 2, 4, color="black", hover=f"{label}: mean reward {mean:.4g}"
            )
    canvas.line(left, rows_top - 4, left, rows_bottom, color=AXIS)
    canvas.line(dots_left, rows_top - 4, dots_left, rows_bottom, color=AXIS)
    legend_top = rows_bottom + size + 16
    legend = [(p.name, p.color) for p in parts]
    height = legend_top + canvas.legend(legend, top=legend_top, left=8) + 6
    return canvas.svg(height, title or f"By {column}")


def bar_chart(
    *,
    labels: Sequence[str],
    counts: Sequence[int],
    color: str,
    x_title: str,
    y_title: str,
    width: float,
    title: str | None = None,
    hovers: Sequence[str] | None = None,
) -> str:
    """A count per label as vertical bars on an axis from zero (whole-number ticks); a few
    labels are narrow bars, not the whole width; labels too many for the width are shown one
    in every few, tilted. ``hovers``: what each bar's hover names it (its label by default).

    >>> svg = bar_chart(labels=["0/2", "1/2", "2/2"], counts=[1, 0, 4], color="#4C78A8",
    ...                 x_title="group mean", y_title="groups", width=500)
    >>> svg.count("<title>")
    3
    """
    canvas, size, top = _titled_canvas(width, title)
    ticks = nice_ticks(max(counts, default=0), integer=True, count=4)
    left = 14 + max(_text_width(_label(t), size) for t in ticks) + size + 6
    right = width - 12
    plot_top, plot_height = top + 8, 200.0 if width >= 500 else 160.0
    base = plot_top + plot_height

    def y_of(value: float) -> float:
        return base - plot_height * value / ticks[-1]

    canvas.value_axis(ticks, left=left, right=right, y_of=y_of, percent=False)
    canvas.text(12, plot_top + plot_height / 2, y_title, anchor="middle", rotate=-90, weight="600")
    slot = (right - left) / max(len(labels), 1)
    bar = min(slot * 0.8, 56.0)
    tilted = max((_text_width(label, size) for label in labels), default=0.0) > slot - 4
    every = max(1, math.ceil(size * 1.6 / slot)) if tilted else 1  # tilted labels a line apart
    names = labels if hovers is None else hovers
    for i, (label, name, count) in enumerate(zip(labels, names, counts, strict=True)):
        middle = left + slot * (i + 0.5)
        canvas.rect(
            middle - bar / 2,
            y_of(count),
            bar,
            base - y_of(count),
            fill=color,
            hover=f"{name}: {count:,} {y_title}",
        )
        if i % every:
            continue
        if tilted:
            canvas.text(middle + 3, base + size + 2, label, anchor="end", rotate=-40)
        else:
            canvas.text(middle, base + size + 6, label, anchor="middle")
    canvas.line(left, base, right, base, color=AXIS)
    label_room = (
        max((_text_width(label, size) for label in labels), default=0.0) * 0.66 + size if tilted else size + 6
    )
    title_y = base + label_room + size + 8
    canvas.text((left + right) / 2, title_y, x_title, anchor="middle", weight="600")
    return canvas.svg(title_y + 10, title or y_title)
