"""The cohort's distributions: one panel per metric, one column of points per split.

matplotlib (Agg, no display) draws them into one PNG; each point is a subject, outliers
(robust |z| above the threshold of :mod:`mriprep.qc.outliers`) in red, the split's median
as a bar.
"""

from __future__ import annotations

import io
import math
from typing import Mapping, Sequence

import numpy as np


def distributions_png(values: Mapping[str, Mapping[str, Sequence[float]]],
                      flagged: Mapping[str, Mapping[str, Sequence[bool]]],
                      labels: Mapping[str, str]) -> bytes | None:
    """PNG bytes of the panels, or None when there is nothing to draw.

    ``values[metric][split]`` are the subjects' values; ``flagged`` the same shape, True
    for an outlier; ``labels[metric]`` the panel's title.
    """
    metrics = [m for m in values if any(len(v) for v in values[m].values())]
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    columns = 4
    rows = math.ceil(len(metrics) / columns)
    figure = Figure(figsize=(3.2 * columns, 2.4 * rows), dpi=90, layout="constrained")
    rng = np.random.default_rng(0)  # the jitter is the same in every report
    for i, metric in enumerate(metrics):
        axes = figure.add_subplot(rows, columns, i + 1)
        splits = sorted(values[metric])
        for x, split in enumerate(splits):
            v = np.asarray(values[metric][split], dtype=float)
            bad = np.asarray(flagged[metric][split], dtype=bool)
            ok = np.isfinite(v)
            jitter = x + rng.uniform(-0.18, 0.18, v.size)
            axes.scatter(jitter[ok & ~bad], v[ok & ~bad], s=14, color="#3366aa", alpha=0.8)
            axes.scatter(jitter[ok & bad], v[ok & bad], s=22, color="#dd2222", marker="D")
            if ok.any():
                axes.hlines(np.median(v[ok]), x - 0.3, x + 0.3, color="#222222", lw=1.5)
        if not any(np.isfinite(np.asarray(v, dtype=float)).any()
                   for v in values[metric].values()):
            # An empty axis reads as a rendering bug: say that there is nothing to plot.
            axes.text(0.5, 0.5, "n/a for every subject\n(the subject pages say why)",
                      ha="center", va="center", fontsize=8, color="#666666",
                      transform=axes.transAxes)
        axes.set_xticks(range(len(splits)), [s or "(none)" for s in splits])
        axes.set_title(labels.get(metric, metric), fontsize=9)
        axes.tick_params(labelsize=8)
        axes.grid(axis="y", alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
