"""The FastSurfer bench's blocks of batches: one measurement of the interleaved rounds."""

from __future__ import annotations

from benchmarks.bench_fastsurfer import _Batches


class _Loader:
    """Two batches of 16 an epoch; counts the epochs started."""

    def __init__(self):
        self.epochs = 0

    def __iter__(self):
        self.epochs += 1
        return iter([{"label": [0] * 16}, {"label": [0] * 16}])


def test_a_block_goes_on_into_the_next_epoch_and_counts_only_batches_read():
    loader = _Loader()
    block = _Batches(loader, batches=3)
    assert block.first() >= 0  # one batch of the first epoch read apart
    result = block()  # the epoch's last batch, its end, then the next epoch's first
    assert result["items"] == 32 and loader.epochs == 2
    assert result["seconds"] >= 0 and result["bytes"] == 0
    assert block()["items"] == 32 and loader.epochs == 3
