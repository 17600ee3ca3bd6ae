"""The label mosaic through the check's flagged regions: drawn from arrays (pure), and by
the report for the entries a fresh record flags, with a note where it cannot be."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from PIL import Image

from mriprep.cache.check_regions import regions_path
from mriprep.qc.check_flags import FLAG_PICTURE
from mriprep.qc.flag_mosaic import FLAG_COLOURS, FlaggedRegion, flag_picture, marked
from mriprep.qc.report import write_report
from tests.check.flagged_cache import flagged_cache, rebuild


def _head(shape=(48, 48, 48)):
    grid = np.indices(shape)
    radius = np.sqrt(sum((g - s / 2) ** 2 for g, s in zip(grid, shape)))
    image = np.where(radius < 18, 100.0, 5.0).astype(np.float32)
    labels = np.where(radius < 14, 2, 0).astype(np.int16)
    return image, labels, np.diag([1.0, 1.0, 1.0, 1.0])


def _pixels(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).astype(int)


def _near(picture: np.ndarray, colour: str, tolerance: int = 40) -> int:
    target = np.array([round(c * 255) for c in to_rgb(colour)])
    return int((np.abs(picture - target).max(axis=-1) <= tolerance).sum())


def test_flagged_voxels_are_drawn_in_their_codes_colour_and_counted_in_the_legend():
    image, labels, affine = _head()
    blob = np.argwhere(np.ones((3, 3, 3), dtype=bool)) + [40, 8, 40]  # in the air
    regions = {"label-off-anatomy": FlaggedRegion("label-off-anatomy", 27, blob)}
    jpeg, legend = flag_picture(image, labels, affine, regions, {2: "#f5f5f5"})
    assert legend == [{"code": "label-off-anatomy", "colour": FLAG_COLOURS[
        "label-off-anatomy"], "voxels": 27, "drawn": 27, "whole_map": False}]
    drawn = _pixels(jpeg)
    assert _near(drawn, FLAG_COLOURS["label-off-anatomy"]) > 20  # magenta, on its tiles
    plain, _ = flag_picture(image, labels, affine,
                            {"label-misfit": FlaggedRegion("label-misfit", 1, None)})
    assert _near(_pixels(plain), FLAG_COLOURS["label-off-anatomy"]) == 0
    assert _near(_pixels(plain), FLAG_COLOURS["label-misfit"]) > 50  # the outline


def test_a_speck_is_marked_with_a_margin_and_nothing_is_drawn_without_regions():
    mask = marked(np.array([[5, 5, 5]]), (10, 10, 10))
    assert mask.sum() == 27 and mask[4:7, 4:7, 4:7].all()
    assert not marked(np.empty((0, 3)), (4, 4, 4)).any()
    # a point off the grid: the region is not this map's, said rather than drawn short
    with pytest.raises(ValueError, match="1 of the region's 2 voxels lie outside"):
        marked(np.array([[5, 5, 5], [99, 0, 0]]), (10, 10, 10))
    image, labels, affine = _head()
    with pytest.raises(ValueError, match="no flagged region"):
        flag_picture(image, labels, affine, {})
    with pytest.raises(ValueError, match="one grid"):
        flag_picture(image[:-1], labels, affine,
                     {"label-misfit": FlaggedRegion("label-misfit", 1, None)})


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return flagged_cache(tmp_path_factory.mktemp("flags") / "c", check=True)


def _page(report, subject: str) -> str:
    return next((report.parent / "subjects").glob(f"{subject}-*.html")).read_text()


def test_the_report_draws_the_flagged_entries_and_not_the_clean_one(checked, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(checked, root)
    report = write_report(root)
    swap, misfit, clean = (_page(report, s) for s in ("sub-01", "sub-02", "sub-00"))
    assert 'id="picture-label-flags"' in swap and 'data-code="label-side-swap"' in swap
    assert 'id="picture-label-flags"' in misfit and "the whole map" in misfit
    assert "picture-label-flags" not in clean and "flag-note" not in clean
    pictures = sorted((root / "qc").glob(f"*/{FLAG_PICTURE}-*.jpg"))
    assert len(pictures) == 2
    assert all(p.name in swap + misfit for p in pictures)
    # a second report shows the pictures drawn from the same record, not redrawn
    drawn = {p: p.stat().st_mtime_ns for p in pictures}
    again = write_report(root)
    assert {p: p.stat().st_mtime_ns for p in pictures} == drawn
    assert _page(again, "sub-01") == swap
    # the entry rebuilt since the check: its record is stale, so no picture, and a note
    rebuild(root, 1)
    report = write_report(root)
    page = _page(report, "sub-01")
    assert "picture-label-flags" not in page and "is stale for this entry" in page
    assert len(list((root / "qc").glob(f"*/{FLAG_PICTURE}*.jpg"))) == 1


def test_a_regions_archive_that_is_not_the_records_is_said_not_drawn(checked, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(checked, root)
    path = regions_path(root)
    path.write_bytes(path.read_bytes() + b"\0")  # another archive than the record's
    page = _page(write_report(root), "sub-01")
    assert "picture-label-flags" not in page
    assert "no picture of the flagged regions" in page and str(path) in page
    path.unlink()
    page = _page(write_report(root), "sub-01")
    assert "are missing" in page and "mriprep check" in page
