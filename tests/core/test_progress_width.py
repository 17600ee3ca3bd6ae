"""A terminal that reports 0 columns still gets a bar, 80 columns wide."""

from __future__ import annotations

import io

import tqdm.std

from mriprep.core.progress import FALLBACK_COLUMNS, ProgressBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _drawn(monkeypatch, columns):
    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: (lambda fp: (columns, 24)))
    stream = _Terminal()
    bar = ProgressBar("mriprep check", "entry", total=10, stream=stream)
    bar.update_to(5)
    bar.close()
    return stream.getvalue().strip().split("\r")[-1]


def test_zero_columns_fall_back_to_80(monkeypatch):
    line = _drawn(monkeypatch, 0)
    assert "|" in line and "#" in line  # a bar, not just the counts
    assert len(line) == FALLBACK_COLUMNS == 80


def test_a_reported_width_is_used(monkeypatch):
    line = _drawn(monkeypatch, 60)
    assert "|" in line and len(line) <= 60
