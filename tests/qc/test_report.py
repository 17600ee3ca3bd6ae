"""The QC report of the demo cache, and what it says of bad input (no traceback)."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.qc.report import write_report
from mriprep.qc.store import picture_path, qc_root, read_qc
from mriprep.qc.subject import OutputData, subject_qc
from tests.cache_clone import clone_cache, replace_bytes

pytestmark = pytest.mark.slow


def _qc_of(cache_root, subject_id):
    for entry in Cache(cache_root).entries():
        if entry.subject_id == subject_id and not entry.session_id:
            return entry.key, read_qc(cache_root, entry.key)
    raise AssertionError(f"{subject_id} is not cached")


def _share_of_colour(jpeg: bytes, colour: str) -> float:
    """The share of pixels tinted by ``colour``: overlays are blended into grey anatomy,
    so a pixel's colour minus its grey part points the overlay colour's way."""
    from matplotlib.colors import to_rgb
    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=float)
    chroma = rgb - rgb.min(axis=-1, keepdims=True)
    target = np.array(to_rgb(colour)) * 255
    target -= target.min()
    strength = np.linalg.norm(chroma, axis=-1)
    cosine = chroma @ target / (strength * np.linalg.norm(target) + 1e-9)
    return float(np.mean((strength > 60) & (cosine > 0.97)))


def test_planted_defects_are_drawn_in_their_colours(demo_cache):
    from mriprep.qc.causes import cause_table

    colour = {cause.name: cause.colour for cause in cause_table().values()}
    expected = {"sub-02": "filled", "sub-05": "incomplete slice", "sub-04": "artifact slice"}
    for subject, cause in expected.items():
        key, qc = _qc_of(demo_cache.path, subject)
        assert qc["source"] == "run"
        for picture in ("input", "output"):
            assert cause in qc["legends"][picture], (subject, picture, qc["legends"])
            jpeg = picture_path(demo_cache.path, key, picture).read_bytes()
            assert _share_of_colour(jpeg, colour[cause]) > 1e-4, (subject, picture)
    # A clean scan shows none of them, and the template's outline is drawn.
    key, qc = _qc_of(demo_cache.path, "sub-01")
    assert set(qc["legends"]["input"]) == set()
    assert qc["images"] == ["input", "labels", "output", "template"]
    assert qc["metrics"]["registration_similarity"] > 0.5


def test_failed_subjects_show_their_stage_reason_and_input(demo_cache):
    index = demo_cache.run.report_paths["qc"]
    failed = [r for r in demo_cache.run.results if r.failed]
    assert failed
    pages = {p.name: p.read_text() for p in (index.parent / "subjects").glob("*.html")}
    for result in failed:
        page = next(text for name, text in pages.items()
                    if name.startswith(result.subject_id + "-"))
        assert f"Refused at {result.stage}" in page
        assert result.reason.split(";")[0][:60].replace("'", "&#39;") in page
    # A subject whose file could be read gets a picture of it; a truncated one does not.
    readable = next(r for r in failed if r.stage == "sanitize")
    assert read_qc(demo_cache.path, readable.key)["images"] == ["input"]
    truncated = next(r for r in failed if r.stage == "load")
    assert read_qc(demo_cache.path, truncated.key) is None


def test_metrics_and_outliers_match_the_planted_defects(demo_cache):
    from mriprep.qc.gather import gather

    data = gather(demo_cache.path, make_missing=False)
    flagged = {(s.subject_id, o.metric) for s in data.subjects for o in s.outliers}
    assert ("sub-02", "filled_voxels") in flagged
    assert ("sub-05", "masked_slices") in flagged
    clean = {"sub-01", "sub-03", "sub-06", "sub-07", "sub-11"}
    assert not {m for s, m in flagged if s in clean and m != "invalid_fraction"}


def test_report_made_from_the_cache_without_qc_matches_the_runs(demo_cache, tmp_path):
    clone = clone_cache(demo_cache.path, tmp_path / "cache")
    # As after `mriprep run --no-report`, for the scans with a filled blob, a masked slab
    # and artifact slices, and a clean one.
    entries = [e for e in clone.entries() if e.subject_id in
               ("sub-01", "sub-02", "sub-04", "sub-05") and not e.session_id]
    for entry in entries:
        shutil.rmtree(qc_root(clone.root) / entry.key)
    index = write_report(clone.root)
    for entry in entries:
        made = read_qc(clone.root, entry.key)
        assert made is not None and made["source"] == "cache"
        assert any("made from the cache" in note for note in made["notes"])
        # The replayed steps find the very causes the worker saw: same pictures, same
        # legends, same metrics.
        during_run = read_qc(demo_cache.path, entry.key)
        assert made["legends"] == during_run["legends"], entry.subject_id
        assert made["metrics"] == during_run["metrics"], entry.subject_id
        for picture in during_run["images"]:
            assert (picture_path(clone.root, entry.key, picture).read_bytes()
                    == picture_path(demo_cache.path, entry.key, picture).read_bytes())
    assert index.read_text().count("data-status=\"cached\"") == len(clone.entries())


def test_damaged_tensor_and_unreadable_run_report_still_render(demo_cache, tmp_path):
    clone = clone_cache(demo_cache.path, tmp_path / "cache")
    entry = next(e for e in clone.entries() if e.subject_id == "sub-03")
    shutil.rmtree(qc_root(clone.root) / entry.key)  # so the report must read the tensor
    image = clone.tensor_path(entry.key, "image")
    replace_bytes(image, image.read_bytes()[: 1000])
    (clone.reports_dir / "latest.json").write_text("{ not json")
    index = write_report(clone.root)
    text = index.read_text()
    assert "cannot be read" in text  # the run report
    page = next((index.parent / "subjects").glob("sub-03-*.html")).read_text()
    assert "tensor image is damaged" in page and "mriprep check" in page
    assert "QC could not be made from the cache" in page


def test_empty_cache_renders_and_says_so(tmp_path):
    cache = Cache(tmp_path / "cache", create=True)
    index = write_report(cache.root)
    assert "holds no subjects" in index.read_text()


def test_subject_without_label_map_or_template_says_what_is_missing():
    rng = np.random.default_rng(0)
    image = rng.normal(100, 5, (40, 40, 40)).astype(np.float32)
    output = OutputData(image=image, valid=np.ones(image.shape, bool), affine=np.eye(4))
    qc = subject_qc(None, [], output, None, [])
    assert set(qc.images) == {"output"}
    assert any("no label map" in n for n in qc.notes)
    assert any("does not register" in n for n in qc.notes)
    assert any("could not be read" in n for n in qc.notes)


def test_check_warns_of_the_same_outliers_the_report_flags(demo_cache):
    from mriprep.check import check_cache
    from mriprep.qc.gather import gather

    report = check_cache(demo_cache.path)
    warned = {(f.subjects[0], f.message.split(": ", 1)[1].split(" = ")[0])
              for f in report.warnings if f.code == "qc-outlier"}
    flagged = {(s.subject_id, o.metric) for s in gather(demo_cache.path, make_missing=False)
               .subjects for o in s.outliers}
    assert warned == flagged and ("sub-02", "filled_voxels") in warned
    assert all(f.severity == "warning" for f in report.findings if f.code.startswith("qc-"))


def test_report_command(demo_cache, tmp_path, capsys):
    from mriprep.cli import main

    assert main(["report", str(demo_cache.path), "-o", str(tmp_path / "r")]) == 0
    assert str(tmp_path / "r" / "index.html") in capsys.readouterr().out
    # A report outside the cache carries its pictures (hard links where it can).
    pictures = list((tmp_path / "r").glob("*/*.jpg"))
    assert len(pictures) >= 4 * sum(r.status == "cached" for r in demo_cache.run.results)
    assert main(["report", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    (tmp_path / "plain").mkdir()
    assert main(["report", str(tmp_path / "plain")]) == 2
    assert "is not an mriprep cache" in capsys.readouterr().err
    # A folder that holds other things is not overwritten by a report.
    (tmp_path / "plain" / "notes.html").write_text("mine")
    assert main(["report", str(demo_cache.path), "-o", str(tmp_path / "plain")]) == 2
    assert "holds no mriprep QC report" in capsys.readouterr().err
    assert (tmp_path / "plain" / "notes.html").read_text() == "mine"
    # An earlier report there is replaced.
    assert main(["report", str(demo_cache.path), "-o", str(tmp_path / "r")]) == 0
