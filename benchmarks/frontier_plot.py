"""The speed/quality frontier: prediction speed against CoNLL-2003 test F1 and against SST-2 test accuracy, for every
model of ours and every peer whose speed and quality both sit in benchmarks/results/ (which, and where each figure
comes from: frontier_points.py).

    python benchmarks/frontier_plot.py    # writes results/plots/frontier.png and results/frontier.json

A point whose speed was measured on another CPU than the one the title names is drawn hollow and footnoted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Collection
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

from doc_cells import cpu, render
from doc_sources import RESULTS, fmt
from doc_tables_quality import FEATURED_STUDENTS
from frontier_points import FAMILIES, Point, frontier, gather, left_out, reference_cpu

PNG = Path("plots") / "frontier.png"
"""Where the picture goes, under the results folder."""
JSON = Path("frontier.json")
"""Where the gathered points go, under the results folder."""
STYLE = {  # family: marker, colour
    "pretrained": ("o", "tab:blue"),
    "distilled": ("^", "tab:green"),
    "scratch": ("s", "tab:purple"),
    "peer": ("D", "tab:red"),
}
FRONTIER_STYLE = {"color": "0.55", "linestyle": "--", "linewidth": 1}
DIRECTIONS = ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1), (2, 1), (-2, 1), (2, -1), (-2, -1))
LABEL_OFFSETS = [(dx * r, dy * r) for r in (5, 12, 20, 30, 42) for dx, dy in DIRECTIONS]
"""Where a label may go, in points from its marker, tried in order: beside, above or below, then farther out (with a
line to the marker)."""
CROWD_PX = 45
"""Markers closer than this (display pixels, chained) form a crowd; a crowd of CROWD_SIZE or more gets a zoomed
inset, where its labels have room."""
CROWD_SIZE = 4
AMBIGUOUS = 500.0
"""What a label without a line, nearer another marker than its own, costs (in square pixels of overlap)."""
Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels


class Mark(NamedTuple):
    """A point as one panel draws it."""

    x: float
    y: float
    text: str
    family: str
    hollow: bool  # speed measured on another CPU than the title's
    labelled: bool  # every system but a distilled row off the frontier and not the recipe's (one of dozens)


def _row(point: Point) -> str:
    """The results-file row a point's speed comes from ('FILE runs.ROW.words_per_cpu_s' -> 'ROW')."""
    return point.sources["words_per_cpu_s"].split(" ", 1)[1].split(".")[1]


def _featured(point: Point, featured: Collection[str]) -> bool:
    return any(_row(point) == row or _row(point).startswith(row + "_seed") for row in featured)


def _marks(
    points: list[Point], metric: str, reference: str | None, featured: Collection[str] = FEATURED_STUDENTS
) -> list[Mark]:
    """The points with METRIC, as marks; a label ends in '*' when its speed was measured on another CPU.

    The distilled rows are dozens of ablations of one student: only those on the panel's frontier and the recipe's
    rows (``featured`` and their seeds) are labelled; the others stay as unlabelled markers (named in the table of
    docs/benchmarks.md), so the picture can be read at a glance."""
    scored = [p for p in points if getattr(p, metric) is not None]
    front = set(frontier([(p.words_per_cpu_s, getattr(p, metric)) for p in scored]))
    return [
        Mark(
            p.words_per_cpu_s,
            getattr(p, metric),
            p.name + ("*" if cpu(p.cpu) != reference else ""),
            p.family,
            cpu(p.cpu) != reference,
            p.family != "distilled" or (p.words_per_cpu_s, getattr(p, metric)) in front or _featured(p, featured),
        )
        for p in scored
    ]


def _draw_marks(ax, marks: list[Mark]) -> None:
    """The markers (hollow when measured on another CPU) and the frontier through them."""
    for family, (marker, colour) in STYLE.items():
        for hollow in (False, True):
            group = [m for m in marks if m.family == family and m.hollow == hollow]
            if group:
                ax.scatter(
                    [m.x for m in group],
                    [m.y for m in group],
                    marker=marker,
                    s=46,
                    facecolors="none" if hollow else colour,
                    edgecolors=colour,
                    linewidths=1.3,
                    zorder=3,
                )
    front = frontier([(m.x, m.y) for m in marks])
    if len(front) > 1:
        xs, ys = zip(*front, strict=True)
        ax.step(xs, ys, where="post", zorder=1, **FRONTIER_STYLE)


def _log_speed_axis(ax, lo: float, hi: float, ticks: int = 0) -> None:
    """A log-scaled speed axis from LO to HI with plain numbers (1,000 not 10^3); TICKS evenly spaced ones if given
    (a zoomed range holds no power of ten)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(MaxNLocator(ticks).tick_values(lo, hi)))
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _panel(ax, marks: list[Mark], title: str) -> None:
    """One panel: the marks, the frontier, the axes with their units."""
    _draw_marks(ax, marks)
    xs, ys = [m.x for m in marks], [m.y for m in marks]
    _log_speed_axis(ax, min(xs) / 1.6, max(xs) * 1.6)
    pad = (max(ys) - min(ys)) * 0.12 or 0.01
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("prediction speed (words per CPU-second, 1 thread, log scale)")
    ax.set_ylabel(title)
    ax.grid(True, which="major", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)


def _pixels(ax, marks: list[Mark]) -> list[tuple[float, float]]:
    return [tuple(ax.transData.transform((m.x, m.y))) for m in marks]


def _crowd(ax, marks: list[Mark]) -> list[Mark]:
    """The largest group of marks chained within CROWD_PX of each other, if it has CROWD_SIZE or more."""
    pixels = _pixels(ax, marks)
    best: set[int] = set()
    for start in range(len(marks)):
        group, todo = {start}, [start]
        while todo:
            i = todo.pop()
            near = {j for j, q in enumerate(pixels) if abs(q[0] - pixels[i][0]) + abs(q[1] - pixels[i][1]) < CROWD_PX}
            todo += sorted(near - group)
            group |= near
        best = max(best, group, key=len)
    return [marks[i] for i in sorted(best)] if len(best) >= CROWD_SIZE else []


def _inset(ax, marks: list[Mark], crowd: list[Mark]):
    """A zoomed inset of the crowd in a corner of AX that holds no marker, None if no corner is free."""
    xs, ys = [m.x for m in crowd], [m.y for m in crowd]
    ypad = (max(ys) - min(ys)) * 0.25 or 0.002
    zoom = (min(xs) / 1.08, max(xs) * 1.08, min(ys) - ypad, max(ys) + ypad)
    to_axes = (ax.transData + ax.transAxes.inverted()).transform
    inside = [tuple(to_axes((m.x, m.y))) for m in marks]
    (zx0, zy0), (zx1, zy1) = to_axes((zoom[0], zoom[2])), to_axes((zoom[1], zoom[3]))
    w, h = 0.44, 0.44
    for x0, y0 in ((0.99 - w, 0.99 - h), (0.99 - w, 0.07), (0.08, 0.99 - h), (0.08, 0.07)):  # room for its ticks
        box = (x0 - 0.02, y0 - 0.02, x0 + w + 0.02, y0 + h + 0.02)
        clear = not any(box[0] < px < box[2] and box[1] < py < box[3] for px, py in inside)
        if clear and (zx1 < box[0] or zx0 > box[2] or zy1 < box[1] or zy0 > box[3]):
            inset = ax.inset_axes((x0, y0, w, h))
            _draw_marks(inset, marks)  # all of them, so the frontier is the panel's; the limits clip the rest
            _log_speed_axis(inset, zoom[0], zoom[1], ticks=4)
            inset.set_ylim(zoom[2], zoom[3])
            inset.tick_params(labelsize=7)
            inset.set_facecolor("0.985")
            ax.indicate_inset_zoom(inset, edgecolor="0.5")
            return inset
    return None


def _overlap(box: Box, boxes: list[Box]) -> float:
    """The area BOX shares with BOXES."""
    return sum(
        max(0.0, min(box[2], t[2]) - max(box[0], t[0])) * max(0.0, min(box[3], t[3]) - max(box[1], t[1])) for t in boxes
    )


def _line_boxes(start: tuple[float, float], end: tuple[float, float], skip: float = 6.0) -> list[Box]:
    """A line as small boxes every 3 pixels, the first SKIP pixels (its own marker) left out."""
    (x0, y0), (x1, y1) = start, end
    length = max(1.0, ((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5)
    dots = [(x0 + i / length * (x1 - x0), y0 + i / length * (y1 - y0)) for i in range(int(skip), int(length), 3)]
    return [(x - 1, y - 1, x + 1, y + 1) for x, y in dots]


def _distance(box: Box, point: tuple[float, float]) -> float:
    """How far POINT is from BOX's nearest edge (0 inside it)."""
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return (dx * dx + dy * dy) ** 0.5


def _frontier_boxes(ax, marks: list[Mark]) -> list[Box]:
    """The frontier's steps as boxes in display pixels, for the labels to keep off."""
    corners = frontier([(m.x, m.y) for m in marks])
    steps = [c for a, b in pairwise(corners) for c in (a, (b[0], a[1]))] + corners[-1:]
    pixels = [tuple(ax.transData.transform(c)) for c in steps]
    return [box for a, b in pairwise(pixels) for box in _line_boxes(a, b, skip=0)]


def _place_labels(ax, marks: list[Mark], obstacles: list[Box], renderer) -> None:
    """Each mark's label at the first offset that covers no other label, marker, line or the axes' edge, else the
    least bad; the most crowded marks are labelled first, so they get the places nearest them."""
    from matplotlib.text import Text

    markers = _pixels(ax, marks)
    taken: list[Box] = [(mx - 5, my - 5, mx + 5, my + 5) for mx, my in markers] + obstacles
    frame = ax.get_window_extent(renderer)

    def crowd(i: int) -> int:
        return sum(abs(mx - markers[i][0]) < 80 and abs(my - markers[i][1]) < 40 for mx, my in markers)

    for i in sorted((i for i, m in enumerate(marks) if m.labelled), key=lambda i: -crowd(i)):
        best = None
        for dx, dy in LABEL_OFFSETS:
            far = max(abs(dx), abs(dy)) > 5
            label = ax.annotate(
                marks[i].text,
                (marks[i].x, marks[i].y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                fontsize=8,
                fontweight="bold" if marks[i].family == "peer" else "normal",
                arrowprops={"arrowstyle": "-", "color": "0.45", "lw": 0.6, "shrinkA": 1, "shrinkB": 3} if far else None,
            )
            label.update_positions(renderer)
            e = Text.get_window_extent(label, renderer)  # the text alone, its line counted below
            box = (e.x0 - 2, e.y0 - 1, e.x1 + 2, e.y1 + 1)
            nearest = (min(max(markers[i][0], e.x0), e.x1), min(max(markers[i][1], e.y0), e.y1))
            leader = _line_boxes(markers[i], nearest) if far else []
            outside = box[0] < frame.x0 or box[2] > frame.x1 or box[1] < frame.y0 or box[3] > frame.y1
            cost = _overlap(box, taken) + 10 * sum(_overlap(b, taken) for b in leader) + (1e6 if outside else 0.0)
            if not far and any(
                _distance(box, q) <= _distance(box, markers[i]) for j, q in enumerate(markers) if j != i
            ):
                cost += AMBIGUOUS  # nearer another marker than its own, and no line to its own: read as the other's
            if best is not None and cost >= best[0]:
                label.remove()
                continue
            if best is not None:
                best[1].remove()
            best = (cost, label, [box, *leader])
            if cost == 0:
                break
        taken += best[2]


def _label_panel(ax, marks: list[Mark], renderer) -> None:
    """Every labelled mark labelled: a crowd of them in a zoomed inset (labelled there), the rest on the panel."""
    crowd = _crowd(ax, [m for m in marks if m.labelled])
    inset = _inset(ax, marks, crowd) if crowd else None
    if inset is None:
        _place_labels(ax, marks, _frontier_boxes(ax, marks), renderer)
        return
    x0, x1, y0, y1 = (*inset.get_xlim(), *inset.get_ylim())
    zoomed = [m for m in marks if x0 <= m.x <= x1 and y0 <= m.y <= y1]
    e = inset.get_tightbbox(renderer)
    _place_labels(
        ax, [m for m in marks if m not in zoomed], [*_frontier_boxes(ax, marks), (e.x0, e.y0, e.x1, e.y1)], renderer
    )
    _place_labels(inset, zoomed, _frontier_boxes(inset, marks), renderer)


def draw(points: list[Point], path: Path) -> Path:
    """Two panels (CoNLL-2003 F1, SST-2 accuracy) against speed, written as a PNG at PATH."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    reference = reference_cpu(points)
    fig, axes = plt.subplots(1, 2, figsize=(14, 7.2))
    panels = {}
    for ax, (metric, title) in zip(
        axes, (("conll_f1", "CoNLL-2003 test entity F1"), ("sst2_acc", "SST-2 test accuracy")), strict=True
    ):
        marks = _marks(points, metric, reference)
        if marks:
            _panel(ax, marks, title)
            panels[ax] = marks
        else:
            ax.set_axis_off()
    handles = [
        Line2D([], [], marker=marker, color=colour, linestyle="none", markersize=7, label=FAMILIES[family])
        for family, (marker, colour) in STYLE.items()
        if any(p.family == family for p in points)
    ]
    handles.append(Line2D([], [], label="frontier: nothing both faster and better", **FRONTIER_STYLE))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.0))
    others = sorted({cpu(p.cpu) for p in points if cpu(p.cpu) != reference})
    notes = [f"* hollow: speed measured on {', '.join(others)}"] if others else []
    if any(not m.labelled for marks in panels.values() for m in marks):
        notes.append("unlabelled triangles: the other distilled rows (docs/benchmarks.md, the table of points)")
    if notes:
        fig.text(0.99, 0.005, "; ".join(notes), ha="right", fontsize=8, color="0.3")
    fig.suptitle(
        "Prediction speed against test quality" + (f"; speed on one thread of an {reference}" if reference else ""),
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0.09, 1, 0.97))  # the final layout: the labels are placed where they stay
    renderer = fig.canvas.get_renderer()
    for ax, marks in panels.items():
        _label_panel(ax, marks, renderer)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_points(points: list[Point], missing: list[dict[str, Any]], path: Path) -> Path:
    """The gathered points and the systems left out, as JSON."""
    record = {
        "benchmark": "frontier_plot",
        "command": "python benchmarks/frontier_plot.py",
        "reference_cpu": reference_cpu(points),
        "points": [dataclasses.asdict(p) for p in points],
        "left_out": missing,
    }
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return path


def points_table(results: Path = RESULTS) -> str:
    """docs/benchmarks.md's generated block: the plot's points, read from the results files, with the file of each
    figure."""
    points = gather(results)
    reference = reference_cpu(points)
    header = ["point", "what", "words per CPU-second", "CoNLL-2003 test F1", "SST-2 test acc", "speed from"]
    header.append("quality from")
    rows = []
    for p in points:
        quality_files = sorted({path.split()[0] for figure, path in p.sources.items() if figure != "words_per_cpu_s"})
        rows.append(
            [
                p.name + ("*" if cpu(p.cpu) != reference else ""),
                re.sub(r" \(.*\)", "", FAMILIES[p.family]),
                fmt(p.words_per_cpu_s, 0),
                fmt(p.conll_f1),
                fmt(p.sst2_acc),
                f"`{p.sources['words_per_cpu_s'].split()[0]}`",
                ", ".join(f"`{f}`" for f in quality_files),
            ]
        )
    return render((header, rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: %(default)s)")
    args = parser.parse_args(argv)
    points = gather(args.results)
    if not points:
        print(f"no system in {args.results} has both a speed and a quality", file=sys.stderr)
        return 1
    json_path = write_points(points, left_out(args.results), args.results / JSON)
    png = draw(points, args.results / PNG)
    for p in points:
        print(f"{p.kind:4}  {p.name:22} {p.words_per_cpu_s:9.1f}  {fmt(p.conll_f1)}  {fmt(p.sst2_acc)}  {p.sources}")
    print(f"wrote {png} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
