"""A terminal that reports its width gets a bar; one that reports none (-1, 0 or no
size: `docker exec -t`, `script`, some CI runners) gets plain periodic lines, never a
carriage return; a log gets lines only when asked."""

from __future__ import annotations

import io
import re

import pytest
import tqdm.std

import mriprep.core.progress as progress
from mriprep.core.progress import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


def _report_columns(monkeypatch, columns):
    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: (lambda fp: (columns, 24)))


def _drawn(monkeypatch, columns):
    _report_columns(monkeypatch, columns)
    stream = _Terminal()
    bar = ProgressBar("mriprep check", "entry", total=10, stream=stream)
    bar.update_to(5)
    bar.close()
    return bar, stream.getvalue()


@pytest.mark.parametrize("columns", [-1, 0, None])
def test_a_terminal_of_no_width_gets_plain_lines_with_rate_and_time_left(
        monkeypatch, clock, columns):
    _report_columns(monkeypatch, columns)
    stream = _Terminal()
    bar = ProgressBar("export", "entry", total=100, stream=stream)
    for done in range(1, 101):
        clock.now += 0.5  # two entries a second: a line each 10 s, 20 entries apart
        bar.update_to(done, 100)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    assert not bar.shown and bar.lines
    lines = text.splitlines()
    assert lines[0] == "export: 0/100 entry"
    assert lines[1] == "export: 20/100 entry, 2.0 entry/s, about 40 s left"
    assert lines[-1] == "export: 100/100 entry, 2.0 entry/s"
    assert len(lines) == 1 + 5  # the start, then each 10 s (the last one at 100/100)


def test_plain_lines_carry_the_counts_and_end_with_a_last_line(monkeypatch, clock):
    _report_columns(monkeypatch, -1)
    stream = _Terminal()
    bar = ProgressBar("mriprep run", "subj", total=8, stream=stream, every_s=60)
    for cached, failed in [(1, 0), (1, 1), (2, 1)]:
        clock.now += 30  # two subjects a minute
        bar.advance(postfix={"cached": cached, "failed": failed})
    bar.close()  # interrupted at 3 of 8: the last count is still said
    lines = stream.getvalue().splitlines()
    assert lines == ["mriprep run: 0/8 subj",
                     "mriprep run: 2/8 subj (cached=1, failed=1), 2.0 subj/min, about 3 min "
                     "left",
                     "mriprep run: 3/8 subj (cached=2, failed=1), 2.0 subj/min, "
                     "about 2 min left"]


def test_a_reported_width_is_used(monkeypatch):
    bar, text = _drawn(monkeypatch, 60)
    line = text.strip().split("\r")[-1]
    assert bar.shown and not bar.lines
    assert "|" in line and len(line) <= 60


def test_a_log_gets_lines_only_when_asked(clock):
    quiet = io.StringIO()
    bar = ProgressBar("derive labels", "subject", total=3, stream=quiet)
    for done in range(4):
        bar.update_to(done, 3)
    bar.close()
    assert quiet.getvalue() == "" and not bar.shown and not bar.lines
    log = io.StringIO()
    bar = ProgressBar("derive labels", "subject", stream=log, log_lines=True)
    bar.update_to(1, 3)  # the total comes with the first call; one entry was derived
    clock.now += 120
    bar.update_to(3, 3)
    bar.close()
    assert log.getvalue().splitlines() == ["derive labels: 1/3 subject",
                                           "derive labels: 3/3 subject, 1.0 subject/min"]
    assert not re.search(r"\r", log.getvalue())
