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


def test_each_row_is_set_against_the_fastest_monai_loader_of_its_unit():
    rows = [{"name": "mriprep volume", "unit": "volumes", "MB/s": 300.0},
            {"name": "mriprep patch", "unit": "patches", "MB/s": 50.0},
            {"name": "MONAI slow volumes", "unit": "volumes", "MB/s": 100.0},
            {"name": "MONAI fast volumes", "unit": "volumes", "MB/s": 200.0},
            {"name": "MONAI patches", "unit": "patches", "MB/s": 25.0}]
    assert bench_loader.fastest_monai(rows) == {"volumes": 200.0, "patches": 25.0}
    table = bench_loader.format_table(
        [dict(r, note="", **{"MB/s range": (r["MB/s"], r["MB/s"]), "items/s": 1.0})
         for r in rows] + [{"name": "ceiling, readinto", "unit": "volumes", "note": "",
                            "MB/s": 400.0, "MB/s range": (400.0, 400.0), "items/s": 1.0}])
    ratios = {line[:44].strip(): float(line.split()[-2]) for line in table.splitlines()
              if line.startswith(("mriprep", "MONAI"))}
    assert ratios == {"mriprep volume": 1.5, "mriprep patch": 2.0, "MONAI slow volumes": 0.5,
                      "MONAI fast volumes": 1.0, "MONAI patches": 1.0}


def test_a_row_with_no_monai_row_of_its_unit_gets_no_ratio():
    rows = [{"name": "mriprep patch", "unit": "patches", "MB/s": 50.0},
            {"name": "MONAI volumes", "unit": "volumes", "MB/s": 100.0}]
    fastest = bench_loader.fastest_monai(rows)
    assert fastest == {"volumes": 100.0}
    assert bench_loader.x_monai(rows[0], fastest).strip() == "-"
    assert bench_loader.x_monai(rows[1], fastest).strip() == "1.00"


def test_a_row_keeps_every_round_in_the_order_measured():
    results = [{"MB/s": v, "items/s": 1.0} for v in (900.0, 3000.0, 2900.0)]
    row = bench_loader.median_row("mriprep volume", "volumes", "", results)
    assert row["MB/s"] == 2900.0 and row["MB/s range"] == (900.0, 3000.0)
    assert row["MB/s by round"] == [900.0, 3000.0, 2900.0]
    assert "900 / 3000 / 2900" in bench_loader.format_rounds([row])


class _Epoch:
    """Two batches of 16 an epoch, then one of 5; counts the epochs started and ended."""

    def __init__(self):
        self.started = self.ended = 0

    def __iter__(self):
        import torch

        self.started += 1
        yield from ({"image": torch.zeros(n, 1), "label": torch.zeros(n)} for n in (16, 16, 5))
        self.ended += 1


def test_a_measurement_reads_whole_epochs_to_their_end():
    # The FastSurfer bench times its loaders this way: a loader's workers stop inside the
    # measured time, never on the next contender's.
    loader = _Epoch()
    result = bench_loader.measure(loader, 1)
    assert result["items"] == 37 and result["bytes"] == 37 * 4 * 2 and result["seconds"] > 0
    assert loader.started == loader.ended == 1
    assert bench_loader.measure(loader, 1)["items"] == 37 and loader.started == loader.ended == 2
