"""The FastSurfer-style training example: three views of thick slices from the cache,
their classes, weights and mirror, through make_dataloader, with finite losses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mriprep.cache import Cache
from tests.examples.scripts import load_example
from tests.training.fastsurfer_cache import write_cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = write_cache(tmp_path_factory.mktemp("fs") / "cache", count=3)
    c = Cache(root)
    entries = c.entries()
    c.update_index([entries[-1].with_split("val")])
    return root


def test_trains_every_view_with_finite_losses(cache, capsys):
    code = load_example("train_fastsurfer").main(
        [str(cache), "--epochs", "1", "--steps", "2", "--batch-size", "4", "--width", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    for view, classes in (("coronal", 79), ("axial", 79), ("sagittal", 51)):
        assert f"{view}: " in out and f"{classes} classes" in out
        assert f"train_fastsurfer: {view}: mean Dice" in out
    assert (cache / "derived").is_dir()


def test_a_class_no_subject_holds_stops_it_naming_the_classes(tmp_path, capsys):
    def edit(i, tensors):
        tensors["label"][tensors["label"] == 77] = 2
    root = write_cache(tmp_path / "cache", count=2, edit=edit)
    code = load_example("train_fastsurfer").main(
        [str(root), "--views", "axial", "--epochs", "1", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 1 and "absent from all 2 subjects" in err and "WM-hypointensities" in err
