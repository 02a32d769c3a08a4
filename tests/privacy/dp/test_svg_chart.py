"""The reports' inline SVG charts: the x axis says what it plots, and its labels never
print over one another (seen in a canary audit's histogram: "0.0537" over "0.0574")."""

from __future__ import annotations

import itertools
import math
import re

from fedveil.privacy.dp.svg_chart import Series, _x_ticks, line_chart


def test_the_x_axis_names_what_is_plotted():
    bins = [-0.05 + 0.0037 * i for i in range(30)]
    svg = line_chart(
        "scores",
        bins,
        [Series("inserted", [1.0] * 30, "#b42318")],
        "canaries",
        x_label="canary score",
    )
    assert ">canary score</text>" in svg and ">round</text>" not in svg
    rounds = line_chart("epsilon", [1, 2, 3], [Series("e", [1.0, 2.0, 3.0], "#000")], "epsilon")
    assert ">round</text>" in rounds  # the default


def test_x_tick_labels_are_at_least_half_a_stride_apart_and_end_on_the_last_x():
    for n in range(2, 120):
        xs = [float(i) for i in range(n)]
        ticks = _x_ticks(xs)
        stride = max(1, math.ceil(n / 8))
        assert ticks[0] == 0.0 and ticks[-1] == n - 1, (n, ticks)
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert all(gap >= stride / 2 for gap in gaps), (n, ticks)


def test_the_audit_histograms_ticks_do_not_overlap():
    # The histogram of the run that showed it: 30 bins, stride 4, the last bin 1 after
    # the last strided one.
    bins = [-0.05 + 0.00148 * 2.5 * i for i in range(30)]
    svg = line_chart("h", bins, [Series("held out", [0.0] * 30, "#1f6feb")], "canaries")
    xs = [
        float(x)
        for x in re.findall(
            r'<text x="([\d.]+)" y="[\d.]+" class="tick" '
            r'text-anchor="middle">',
            svg,
        )
    ]
    assert all(b - a > 30 for a, b in itertools.pairwise(xs)), xs
