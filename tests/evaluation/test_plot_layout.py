"""The experts heat map's layout (issue 38 case 19): the title, the axis labels and every tick label lie inside
the figure, however few gates a layer has (the last PLE layer has task gates only) and however long the names."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt

from mtl_decoder.evaluation.plots import heatmap_figure


def _gates(tasks: list[str], shared_gate: bool) -> dict:
    gates = {
        t: {"experts": [f"{t}/0", "shared/0", "shared/1"], "mean": {f"{t}/0": 0.3, "shared/0": 0.4, "shared/1": 0.3}}
        for t in tasks
    }
    if shared_gate:
        experts = [f"{t}/0" for t in tasks] + ["shared/0", "shared/1"]
        gates["shared"] = {"experts": experts, "mean": dict.fromkeys(experts, 1 / len(experts))}
    return gates


@pytest.mark.parametrize(
    "tasks, shared_gate",
    [
        (["ner", "sentiment"], False),  # the demo's last layer: what was cut off
        (["ner", "sentiment"], True),
        (["ner"], False),
        (["aspect_sentiment_polarity", "named_entities"], False),
    ],
)
def test_no_text_of_the_heat_map_is_cut_off(tasks, shared_gate):
    fig = heatmap_figure(plt, "layer_1", _gates(tasks, shared_gate))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()]
        width, height = fig.bbox.width, fig.bbox.height
        for text in texts:
            box = text.get_window_extent(renderer)
            inside = box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= width + 0.5 and box.y1 <= height + 0.5
            assert inside, f"{text.get_text()!r} at {box} outside the {width:.0f}x{height:.0f} figure"
    finally:
        plt.close(fig)
