"""The loader bench's rounds: interleaved, the order turned each round, each measurement
started on a quiet machine."""

from __future__ import annotations

import sys
import types

from benchmarks import bench_loader


def test_rounds_turn_the_order_and_wait_for_quiet_before_each_measurement(monkeypatch,
                                                                          capsys):
    events = []
    quiet = iter([True, False, True, True, True, True, True])
    monkeypatch.setattr(bench_loader, "wait_until_quiet",
                        lambda: events.append("wait") or next(quiet))

    def once(name):
        return lambda: events.append(name) or {"MB/s": float(len(events))}

    contenders = [("a", once("a"), None), ("b", once("b"), None), ("c", once("c"), 1)]
    measured = bench_loader.interleaved(contenders, rounds=3)
    order = [e for e in events if e != "wait"]
    # round 1: a b c; round 2 starts one later (b, then c, which takes part once, then a)
    assert order == ["a", "b", "c", "b", "a", "a", "b"]
    assert events[::2] == ["wait"] * len(order)  # a wait before every measurement
    assert [len(measured[n]) for n in "abc"] == [3, 3, 1]
    assert "1 measurement(s) started on a machine that did not fall quiet" in \
        capsys.readouterr().err


def test_quiet_is_a_sample_under_the_share_or_a_timeout(monkeypatch):
    samples = iter([80.0, 35.0, 4.0])
    fake = types.SimpleNamespace(cpu_percent=lambda interval: next(samples))
    monkeypatch.setitem(sys.modules, "psutil", fake)
    assert bench_loader.wait_until_quiet(sample_s=0.0)
    fake.cpu_percent = lambda interval: 90.0
    assert not bench_loader.wait_until_quiet(sample_s=0.0, timeout_s=0.05)
