"""Line charts drawn on the server: several runs' curves of one metric on shared, labelled axes.

Pure geometry (no Jinja, no FastAPI): the template turns a :class:`LineChart` into inline SVG
with gridlines, tick labels, axis titles and a legend; each point also carries its run, step and
value so the small hover script (``static/dashboard.js``) can show them, and an SVG ``<title>``
does so without any script at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Run colours, in order (colour-blind-safe Okabe–Ito hues); a chart shows at most this many runs.
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
#: Points a curve draws as hover targets; longer curves are thinned to about this many (a page
#: of 30 charts × 4 runs stays a few hundred kB).
HOVER_POINTS = 40


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[low, high]`` (steps of 1, 2 or 5 × 10ⁿ)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"ticks need finite bounds, got {low}, {high}")
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(1, count - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def tick_label(value: float) -> str:
    """A tick's text: short, no float noise (``0.3``, ``1.2e+03``, ``1500``)."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


@dataclass
class Point:
    x: float
    y: float
    step: int
    value: float


@dataclass
class Series:
    """One run's curve: an SVG ``points`` string, its colour and its hover points."""

    run: str
    color: str
    points: str
    hover: list[Point]
    last: float
    count: int


@dataclass
class Tick:
    at: float  # pixel position along the axis
    label: str


@dataclass
class LineChart:
    """A metric over steps for one or more runs, in a ``width`` × ``height`` SVG viewBox; the
    plot area is ``left``..``right`` × ``top``..``bottom``."""

    name: str
    series: list[Series]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    first_step: int
    last_step: int
    runs_without: list[str] = field(default_factory=list)


def line_chart(
    name: str,
    curves: dict[str, list[tuple[int, float]]],
    *,
    width: int = 560,
    height: int = 240,
    margin: tuple[int, int, int, int] = (14, 16, 40, 62),
) -> LineChart:
    """One chart of ``name`` with a curve per run (``curves``: run → sorted (step, value) pairs).

    Runs with no value for the metric are listed in ``runs_without`` (the legend says so) and
    keep their colour, so a run is the same colour on every chart of a page.
    """
    top, right_pad, bottom_pad, left = margin
    right, bottom = width - right_pad, height - bottom_pad
    present = {run: pairs for run, pairs in curves.items() if pairs}
    if not present:
        raise ValueError(f"no values to plot for {name!r}")
    steps = [s for pairs in present.values() for s, _ in pairs]
    values = [v for pairs in present.values() for _, v in pairs]
    x_ticks = nice_ticks(min(steps), max(steps), 6)
    y_ticks = nice_ticks(min(values), max(values), 5)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def x(step: float) -> float:
        return round(left + (step - x0) / ((x1 - x0) or 1) * (right - left), 2)

    def y(value: float) -> float:
        return round(bottom - (value - y0) / ((y1 - y0) or 1) * (bottom - top), 2)

    series = []
    for index, (run, pairs) in enumerate(curves.items()):
        if not pairs:
            continue
        stride = max(1, math.ceil(len(pairs) / HOVER_POINTS))
        hover = [Point(x(s), y(v), s, v) for s, v in pairs[::stride]]
        if hover[-1].step != pairs[-1][0]:
            hover.append(Point(x(pairs[-1][0]), y(pairs[-1][1]), *pairs[-1]))
        series.append(
            Series(
                run,
                PALETTE[index % len(PALETTE)],
                " ".join(f"{x(s)},{y(v)}" for s, v in pairs),
                hover,
                pairs[-1][1],
                len(pairs),
            )
        )
    return LineChart(
        name,
        series,
        [Tick(x(t), tick_label(t)) for t in x_ticks],
        [Tick(y(t), tick_label(t)) for t in y_ticks],
        width,
        height,
        left,
        right,
        top,
        bottom,
        min(steps),
        max(steps),
        [run for run, pairs in curves.items() if not pairs],
    )
