"""FBER and SNR (air) on padded and skull-stripped scans: finite where noise was measured
(MRIQC leaves a padded frame's zeros out), n/a with the reason where none was, and n/a
values are never flagged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mriprep.qc.metrics import fber, image_quality, tissue_masks
from mriprep.qc.outliers import cohort_flags
from tests.qc.test_metrics import RADII, phantom


PAD = 16


def _padded(data, pad=PAD):
    """The scan inside a frame of exact zeros, as a rotated or padded field of view leaves
    it: most of the 'air' is then zeros, and its median energy 0."""
    out = np.zeros([n + 2 * pad for n in data.shape], dtype=np.float32)
    out[pad:-pad, pad:-pad, pad:-pad] = data
    return out


def test_fber_is_finite_on_a_padded_scan_and_equals_the_unpadded_one():
    data, truth = phantom(sigma=20.0, seed=1, n=96)
    inner = (slice(PAD, -PAD),) * 3
    head = np.zeros([n + 2 * PAD for n in data.shape], dtype=bool)
    head[inner] = truth["head"]
    air = ~head
    air[inner] &= truth["radius"] > RADII["head"] + 6
    padded = _padded(data)
    assert (padded[air] == 0).mean() > 0.5  # the median air energy is 0
    assert math.isfinite(fber(padded, head, air))
    assert fber(padded, head, air) == fber(data, truth["head"], air[inner])
    valid = np.ones(padded.shape, dtype=bool)
    notes: list[str] = []
    metrics = image_quality(padded, valid, tissue_masks(padded, valid), notes)
    plain = image_quality(data, valid[inner], tissue_masks(data, valid[inner]))
    assert notes == [] and math.isfinite(metrics["snr_dietrich"])
    assert metrics["fber"] == pytest.approx(plain["fber"], rel=0.02)
    assert metrics["snr_dietrich"] == pytest.approx(plain["snr_dietrich"], rel=0.02)


def test_skull_stripped_scan_gives_na_air_metrics_with_the_reason_and_no_flag():
    data, truth = phantom(sigma=20.0, seed=2)
    stripped = np.where(truth["head"], data, 0.0).astype(np.float32)
    valid = np.ones(data.shape, dtype=bool)
    notes: list[str] = []
    metrics = image_quality(stripped, valid, tissue_masks(stripped, valid), notes)
    assert math.isnan(metrics["fber"]) and math.isnan(metrics["snr_dietrich"])
    assert math.isfinite(metrics["cnr"])  # the tissue spread alone
    assert len(notes) == 1 and "FBER" in notes[0] and "SNR (air)" in notes[0]
    assert "exact zeros" in notes[0] and "skull-stripped" in notes[0]
    # n/a is out of the cohort's flags: five clean subjects and the stripped one.
    cohort = {f"sub-{i}": {"fber": 50.0 + i, "snr_dietrich": 20.0 + i} for i in range(5)}
    cohort["stripped"] = {"fber": metrics["fber"], "snr_dietrich": metrics["snr_dietrich"]}
    assert [o for o in cohort_flags(cohort) if o.name == "stripped"] == []


def test_a_field_of_view_without_air_says_so():
    from tests.qc.test_metrics import head_filling_the_box

    data = head_filling_the_box()
    valid = np.ones(data.shape, dtype=bool)
    notes: list[str] = []
    image_quality(data, valid, tissue_masks(data, valid), notes)
    assert len(notes) == 1 and "no air in the field of view" in notes[0]


def test_a_metric_n_a_for_every_subject_says_so_in_its_panel(monkeypatch):
    from matplotlib.axes import Axes

    from mriprep.qc.plots import distributions_png

    said = []
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, **kw: said.append(s))
    png = distributions_png({"fber": {"train": [math.nan, math.nan]},
                             "cnr": {"train": [3.0, 4.0]}},
                            {"fber": {"train": [False, False]},
                             "cnr": {"train": [False, False]}},
                            {"fber": "FBER", "cnr": "CNR"})
    assert png and len(said) == 1 and "n/a for every subject" in said[0]
