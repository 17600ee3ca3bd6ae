"""The FastSurfer bench's measurement of a loader: whole epochs, as training reads them."""

from __future__ import annotations

from benchmarks.bench_fastsurfer import _Epochs


class _Loader:
    """Two batches of 16 an epoch, then one of 5; counts the epochs started and ended."""

    def __init__(self):
        self.started = self.ended = 0

    def __iter__(self):
        self.started += 1
        yield from ({"label": [0] * n} for n in (16, 16, 5))
        self.ended += 1


def test_a_measurement_reads_whole_epochs_to_their_end():
    loader = _Loader()
    measure = _Epochs(loader)
    result = measure()
    assert result["items"] == 37 and result["bytes"] == 0 and result["seconds"] >= 0
    assert loader.started == loader.ended == 1  # the workers' stop counted in the epoch
    assert measure()["items"] == 37 and loader.started == loader.ended == 2
