"""The loader bench's rounds: interleaved, the order reversed every other round, and each
measurement long enough."""

from __future__ import annotations

import pytest

from benchmarks import bench_loader


def _timed(name, events, seconds):
    def once():
        events.append(name)
        return {"bytes": 1_000_000, "items": 2, "seconds": seconds}
    return once


def test_rounds_reverse_the_order_every_other_round():
    events = []
    contenders = [("a", _timed("a", events, 1.0), None), ("b", _timed("b", events, 1.0), None),
                  ("c", _timed("c", events, 1.0), 1)]
    measured = bench_loader.interleaved(contenders, rounds=3, min_seconds=1.0)
    # c takes part in the first round only; b follows a, then c, then a again
    assert events == ["a", "b", "c", "b", "a", "a", "b"]
    assert [len(measured[n]) for n in "abc"] == [3, 3, 1]


def test_a_short_measurement_is_repeated_until_it_spans_the_minimum():
    events = []
    result = bench_loader.for_at_least(1.0, _timed("fast", events, 0.3))
    assert events == ["fast"] * 4 and result["repeats"] == 4
    assert result["seconds"] == pytest.approx(1.2) and result["bytes"] == 4_000_000
    assert result["MB/s"] == pytest.approx(4.0 / 1.2)
    assert result["items/s"] == pytest.approx(8 / 1.2)
    slow = bench_loader.for_at_least(1.0, _timed("slow", events, 2.5))
    assert slow["repeats"] == 1 and slow["MB/s"] == 0.4
