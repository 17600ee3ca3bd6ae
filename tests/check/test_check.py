"""Tests of `mriprep check`: a clean cache passes, and every corruption is named.

Two kinds of cache. The demo cache (the session's ``demo_cache``: the demo cohort through
the default pipeline, as ``make demo`` makes it) carries the acceptance tests: a clean
clone passes, and each corruption of issue 7 makes ``mriprep check`` exit 1 and name the
entry. Small caches written with the real cache API from MNI152-derived volumes (the
template at 4 mm, each subject a distinct smooth intensity modulation of it; labels from
the template's GM/WM probability maps) cover every other finding quickly; each of those
tests corrupts its own copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import ndimage

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.check.tensors import scan_tensor_file
from mriprep.cli import main as cli_main
from mriprep.core.errors import CacheError
from mriprep.core.hashing import checksum_file
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import run_cohort, cohort_rows

from tests.cache_clone import (
    clone_cache,
    file_checksums,
    read_array,
    relabel_entry,
    replace_array,
    replace_bytes,
    shares_inode,
)

PIPELINE_A = hashlib.sha256(b"t1w-mni v1").hexdigest()
PIPELINE_B = hashlib.sha256(b"t1w-mni v2 other params").hexdigest()
STEP = 4  # 1 mm template -> 4 mm grid: (50, 59, 48) voxels, fast to write and read
LABELS = [0, 1, 2]

# (subject, session, split)
COHORT = [
    ("sub-01", "ses-1", "train"),
    ("sub-01", "ses-2", "train"),
    ("sub-02", "", "train"),
    ("sub-03", "", "train"),
    ("sub-04", "", "train"),
    ("sub-05", "", "val"),
    ("sub-06", "", "val"),
    ("sub-07", "", "test"),
    ("sub-08", "", "test"),
]


@pytest.fixture(scope="module")
def anatomy():
    """Template image, GM/WM label map and affine on the 4 mm grid."""
    template = load_template("mni152")
    tissue = load_mni152_tissue()
    image = template.data[::STEP, ::STEP, ::STEP].copy()
    gm = tissue["gm"][::STEP, ::STEP, ::STEP]
    wm = tissue["wm"][::STEP, ::STEP, ::STEP]
    label = np.zeros(image.shape, dtype=np.int16)
    label[gm > 0.5] = 1
    label[wm > 0.5] = 2
    affine = template.affine.copy()
    affine[:3, :3] *= STEP
    return image, label, affine


def subject_image(anatomy, seed: int) -> np.ndarray:
    """A distinct 'subject': the template under a smooth random intensity field, z-scored."""
    image, _, _ = anatomy
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.standard_normal(image.shape), sigma=4)
    field *= 0.25 / field.std()
    out = image * (1.0 + field) + 0.01 * rng.standard_normal(image.shape)
    return ((out - out.mean()) / out.std()).astype(np.float32)


def write_subject(
    cache: Cache,
    anatomy,
    subject: str,
    session: str,
    split: str,
    image: np.ndarray,
    *,
    pipeline_hash: str = PIPELINE_A,
    input_sha: str | None = None,
    invalid_slices: int = 0,
    label: np.ndarray | None = None,
    meta_extra: dict | None = None,
    extra_files: dict | None = None,
) -> str:
    """Write one entry with the real cache API and index it; return its key."""
    _, template_label, affine = anatomy
    valid = np.ones(image.shape, dtype=bool)
    if invalid_slices:
        valid[:, :, :invalid_slices] = False
        image = image.copy()
        image[:, :, :invalid_slices] = 0.0
    label = template_label if label is None else label
    input_sha = input_sha or hashlib.sha256(f"{subject}/{session}".encode()).hexdigest()
    meta = {
        "subject_id": subject,
        "session_id": session,
        "pipeline_name": "t1w-mni",
        "pipeline_hash": pipeline_hash,
        "inputs": {"image": {"path": f"/data/{subject}_{session}_T1w.nii.gz", "sha256": input_sha}},
        "affine": affine,
        "spacing": [float(s) for s in np.linalg.norm(affine[:3, :3], axis=0)],
        "shape": list(image.shape),
        "label_values": LABELS,
        "provenance": [{"stage": "validate", "params": {}, "metrics": {}, "warnings": []}],
        **(meta_extra or {}),
    }
    key = hashlib.sha256(f"{subject}/{session}/{input_sha}/{pipeline_hash}".encode()).hexdigest()
    tensors = {"image": image, "valid": valid, "label": label}
    entry = cache.write_entry(key, tensors, meta, extra_files=extra_files)
    cache.update_index([entry.with_split(split)])
    return key


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, anatomy):
    """A sound cache of 9 entries (8 subjects, one with two sessions) and their keys."""
    root = tmp_path_factory.mktemp("pristine") / "cache"
    cache = Cache(root, create=True)
    keys = {}
    for seed, (subject, session, split) in enumerate(COHORT):
        image = subject_image(anatomy, seed)
        keys[(subject, session)] = write_subject(
            cache,
            anatomy,
            subject,
            session,
            split,
            image,
            invalid_slices=2 if subject == "sub-02" else 0,
        )
    return root, keys


@pytest.fixture
def cache_copy(pristine, tmp_path):
    """A private copy of the sound cache for a test to corrupt."""
    root, keys = pristine
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    return Cache(copy), keys


def findings_of(report, code):
    return [f for f in report.findings if f.code == code]


def rewrite_array(path: Path, array: np.ndarray) -> None:
    """Overwrite a tensor file in place, bypassing the cache (as a stray script would)."""
    with open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)


# -- a clean cache -----------------------------------------------------------------------


def test_clean_cache_passes_with_split_summaries(pristine, anatomy):
    root, keys = pristine
    report = chk.check_cache(root)
    assert report.ok, [f.message for f in report.findings]
    assert report.findings == []
    assert report.entries == len(COHORT)
    assert set(report.splits) == {"train", "val", "test"}
    train = report.splits["train"]
    assert (train.entries, train.subjects, train.sessions) == (5, 4, 2)
    # sub-02's first two z slices were masked: the train split shows exactly that share.
    shape = anatomy[0].shape
    expected_invalid = 2 * shape[0] * shape[1] / (5 * np.prod(shape))
    assert train.invalid_fraction == pytest.approx(expected_invalid)
    assert report.splits["val"].invalid_fraction == 0.0
    label = anatomy[1]
    expected_shares = {v: float(np.mean(label == v)) for v in LABELS}
    for split in report.splits.values():
        assert split.label_shares == pytest.approx(expected_shares)
    # every byte of every tensor was read once
    total = sum(record.bytes for e in Cache(root).entries() for record in e.files.values())
    assert report.bytes_read == total
    assert report.near_duplicate_search["method"] == "exact"
    # one reader thread finds exactly what several do
    timing = ("bytes_read", "read_seconds", "read_mb_per_s", "seconds", "near_duplicate_search")
    serial = chk.check_cache(root, workers=1).to_json()
    threaded = report.to_json()
    assert {k: v for k, v in serial.items() if k not in timing} == {
        k: v for k, v in threaded.items() if k not in timing
    }


# -- corruption, one kind per test -----------------------------------------------------


def test_pipeline_tie_reports_every_group(tmp_path, anatomy):
    cache = Cache(tmp_path / "c", create=True)
    a = write_subject(cache, anatomy, "a", "", "train", subject_image(anatomy, 1))
    b = write_subject(
        cache, anatomy, "b", "", "test", subject_image(anatomy, 2), pipeline_hash=PIPELINE_B
    )
    report = chk.check_cache(cache.root)
    assert [f.keys for f in findings_of(report, "pipeline-mismatch")] == [(a,), (b,)]
    assert "mixes 2 pipelines" in report.errors[0].message


def test_identical_tensor_from_different_input_files(cache_copy, anatomy):
    """The same image under a renamed/re-encoded file: input hashes differ, tensors match."""
    cache, keys = cache_copy
    original = keys[("sub-06", "")]
    image = np.load(cache.tensor_path(original, "image"))
    copy = write_subject(cache, anatomy, "sub-66", "", "train", image)
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "duplicate-tensor"
    assert set(finding.keys) == {original, copy}


def test_nan_with_recomputed_checksums_is_still_reported(cache_copy):
    """A forger who also fixes the index and the sidecar cannot hide a NaN."""
    cache, keys = cache_copy
    key = keys[("sub-04", "")]
    path = cache.tensor_path(key, "image")
    image = np.load(path)
    image[3, 4, 5] = np.inf
    image[7, 8, 9] = np.nan
    rewrite_array(path, image)
    new_sum = checksum_file(path)
    index = json.loads(cache.index_path.read_text())
    index["entries"][key]["files"]["image"]["xxh3_128"] = new_sum
    cache.index_path.write_text(json.dumps(index))
    meta_path = cache.entry_dir(key) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["files"]["image"]["xxh3_128"] = new_sum
    meta_path.write_text(json.dumps(meta))
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "non-finite" and finding.keys == (key,)
    assert "1 NaN, 1 +Inf, 0 -Inf" in finding.message and "(3, 4, 5)" in finding.message


def test_index_edited_without_sidecar_is_a_meta_mismatch(cache_copy):
    cache, keys = cache_copy
    key = keys[("sub-08", "")]
    index = json.loads(cache.index_path.read_text())
    index["entries"][key]["pipeline_hash"] = PIPELINE_A[:-1] + "0"
    cache.index_path.write_text(json.dumps(index))
    report = chk.check_cache(cache.root)
    [meta] = findings_of(report, "meta-mismatch")
    assert meta.keys == (key,) and "pipeline_hash" in meta.message


def test_values_beyond_float16_range_are_reported(cache_copy):
    cache, keys = cache_copy
    key = keys[("sub-02", "")]
    path = cache.tensor_path(key, "image")
    image = np.load(path)
    image[1, 2, 3] = 1e30
    rewrite_array(path, image)
    report = chk.check_cache(cache.root)
    [extreme] = findings_of(report, "extreme-values")
    assert extreme.keys == (key,) and "(1, 2, 3)" in extreme.message
    assert not findings_of(report, "non-finite")


def test_truncated_tensor_is_reported(cache_copy):
    cache, keys = cache_copy
    key = keys[("sub-06", "")]
    path = cache.tensor_path(key, "label")
    path.write_bytes(path.read_bytes()[:-1000])
    report = chk.check_cache(cache.root)
    codes = {f.code for f in report.errors if f.keys == (key,)}
    assert {"tensor-unreadable", "checksum-mismatch", "file-size"} <= codes


def test_pickled_object_array_is_refused(cache_copy):
    cache, keys = cache_copy
    key = keys[("sub-06", "")]
    path = cache.tensor_path(key, "label")
    with open(path, "wb") as fh:
        np.save(fh, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    report = chk.check_cache(cache.root)
    [unreadable] = findings_of(report, "tensor-unreadable")
    assert unreadable.keys == (key,) and "label.npy" in unreadable.message


def test_label_values_outside_recorded_set(cache_copy, anatomy):
    cache, keys = cache_copy
    label = anatomy[1].copy()
    label[0, 0, :5] = 7
    bad = write_subject(cache, anatomy, "sub-09", "", "val", subject_image(anatomy, 9), label=label)
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "label-values" and finding.keys == (bad,)
    assert "7 (5 voxels)" in finding.message and "{0, 1, 2}" in finding.message
    # an explicit allowed set overrides the recorded one
    assert chk.check_cache(cache.root, allowed_labels=range(8)).ok
    narrow = chk.check_cache(cache.root, allowed_labels=[0, 1])
    assert len(findings_of(narrow, "label-values")) == len(COHORT) + 1


def test_label_set_recorded_by_the_runner_in_the_sidecar(cache_copy, anatomy):
    cache, _ = cache_copy
    key = write_subject(
        cache,
        anatomy,
        "sub-09",
        "",
        "val",
        subject_image(anatomy, 9),
        meta_extra={"label_values": [0, 1]},
    )
    [finding] = chk.check_cache(cache.root).errors
    assert finding.code == "label-values" and finding.keys == (key,)
    assert "{0, 1}: 2 (" in finding.message


def test_changed_transform_file_is_reported(cache_copy, anatomy):
    cache, _ = cache_copy
    key = write_subject(
        cache,
        anatomy,
        "sub-09",
        "",
        "val",
        subject_image(anatomy, 9),
        extra_files={"transform.tfm": "#Insight Transform File V1.0\n"},
    )
    assert chk.check_cache(cache.root).ok
    (cache.entry_dir(key) / "transform.tfm").write_text("#Insight Transform File V1.0\n# edited\n")
    [finding] = chk.check_cache(cache.root).errors
    assert finding.code == "checksum-mismatch" and "transform.tfm" in finding.message


def test_labels_without_recorded_set_are_a_warning(tmp_path, anatomy):
    cache = Cache(tmp_path / "c", create=True)
    for seed, (subject, split) in enumerate([("a", "train"), ("b", "train"), ("c", "val")]):
        # As mriprep records a pipeline whose stages declare no allowed set.
        write_subject(cache, anatomy, subject, "", split, subject_image(anatomy, seed),
                      meta_extra={"label_values": None})
    report = chk.check_cache(cache.root)
    assert report.ok
    [warning] = report.warnings
    assert warning.code == "labels-unchecked" and "{0, 1, 2}" in warning.message


def test_spacing_inconsistent_with_affine(cache_copy, anatomy):
    cache, keys = cache_copy
    bad = write_subject(
        cache,
        anatomy,
        "sub-09",
        "",
        "val",
        subject_image(anatomy, 9),
        meta_extra={"spacing": [1.0, 1.0, 1.0]},
    )
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "geometry" and finding.keys == (bad,)
    assert "[1.0, 1.0, 1.0]" in finding.message and "[4.0, 4.0, 4.0]" in finding.message


def test_entry_without_split(cache_copy, anatomy):
    cache, keys = cache_copy
    loose = write_subject(cache, anatomy, "sub-09", "", "", subject_image(anatomy, 9))
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "split-missing" and finding.keys == (loose,)


def test_near_duplicate_under_another_id_is_a_warning(cache_copy, anatomy):
    """The same image with noise under another id, in the same split: one person
    counted twice, a warning."""
    cache, keys = cache_copy
    original = keys[("sub-05", "")]
    image = np.load(cache.tensor_path(original, "image"))
    noisy = image + 0.05 * np.random.default_rng(1).standard_normal(image.shape).astype(np.float32)
    twin = write_subject(cache, anatomy, "sub-55", "", "val", noisy)
    report = chk.check_cache(cache.root)
    assert report.ok  # warnings do not fail the gate
    [warning] = report.warnings
    assert warning.code == "near-duplicate"
    assert set(warning.keys) == {original, twin}
    assert set(warning.subjects) == {"sub-05", "sub-55"}
    assert warning.message.count("(val)") == 2 and "sub-55" in warning.message


def test_near_duplicate_in_another_split_is_an_identity_leak(cache_copy, anatomy):
    cache, keys = cache_copy
    original = keys[("sub-05", "")]
    image = np.load(cache.tensor_path(original, "image"))
    noisy = image + 0.05 * np.random.default_rng(1).standard_normal(image.shape).astype(np.float32)
    twin = write_subject(cache, anatomy, "sub-55", "", "test", noisy)
    report = chk.check_cache(cache.root)
    [error] = report.errors
    assert error.code == "identity-leak" and set(error.keys) == {original, twin}
    assert set(error.subjects) == {"sub-05", "sub-55"}
    assert "(val)" in error.message and "(test)" in error.message


def test_every_problem_is_reported_at_once(cache_copy, anatomy):
    cache, keys = cache_copy
    cache.tensor_path(keys[("sub-05", "")], "label").unlink()
    write_subject(cache, anatomy, "sub-01", "ses-3", "val", subject_image(anatomy, 51))
    write_subject(
        cache, anatomy, "sub-09", "", "test", subject_image(anatomy, 9), pipeline_hash=PIPELINE_B
    )
    report = chk.check_cache(cache.root)
    assert {"file-missing", "subject-split-leak", "pipeline-mismatch"} <= {
        f.code for f in report.errors
    }


def test_missing_and_non_cache_folders_are_usage_errors(tmp_path):
    with pytest.raises(CacheError, match="does not exist"):
        chk.check_cache(tmp_path / "nowhere")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CacheError, match="is not an mriprep cache"):
        chk.check_cache(tmp_path / "plain")


def test_malformed_index_entry_is_named_and_the_rest_still_checked(cache_copy):
    cache, keys = cache_copy
    broken, corrupt = keys[("sub-06", "")], keys[("sub-07", "")]
    index = json.loads(cache.index_path.read_text())
    del index["entries"][broken]["pipeline_hash"]
    cache.index_path.write_text(json.dumps(index))
    cache.tensor_path(corrupt, "valid").unlink()
    report = chk.check_cache(cache.root)
    assert [(f.code, f.keys) for f in report.errors] == [
        ("index-malformed", (broken,)),
        ("file-missing", (corrupt,)),
    ]
    assert "lacks 'pipeline_hash'" in report.errors[0].message


def test_corrupt_index_is_a_finding(cache_copy):
    cache, _ = cache_copy
    cache.index_path.write_text("{ not json")
    report = chk.check_cache(cache.root)
    [finding] = report.errors
    assert finding.code == "index-unreadable" and "index.json" in finding.message


# -- manifest --------------------------------------------------------------------------


def _rows(entries):
    return [SimpleNamespace(subject_id=s, session_id=ses, split=split) for s, ses, split in entries]


def test_manifest_rows_that_failed_or_are_missing_fail_the_gate(cache_copy):
    cache, keys = cache_copy
    rows = _rows(COHORT + [("sub-10", "", "train"), ("sub-11", "", "test")])
    report_path = cache.root / "reports" / "latest.json"
    report_path.write_text(
        json.dumps(
            {
                "subjects": [
                    {
                        "subject_id": "sub-10",
                        "session_id": "",
                        "status": "failed",
                        "reason": "stage 'sanitize': 31% of voxels are NaN (limit 15%)",
                    },
                    {"subject_id": "sub-02", "session_id": "", "status": "cached", "reason": ""},
                ]
            }
        )
    )
    report = chk.check_cache(cache.root, manifest=SimpleNamespace(rows=rows))
    [failed] = findings_of(report, "manifest-failed")
    assert failed.severity == "error" and "31% of voxels are NaN" in failed.message
    assert "--exclude FILE" in failed.message
    [missing] = findings_of(report, "manifest-missing")
    assert missing.subjects == ("sub-11",) and "does not list them as failed" in missing.message
    assert {f.code for f in report.errors} == {"manifest-missing", "manifest-failed"}
    assert not report.ok
    # Known exclusions are accepted, with a warning that names them.
    accepted = chk.check_cache(cache.root, manifest=SimpleNamespace(rows=rows),
                               exclusions=["sub-10", "sub-11"])
    assert accepted.ok, [f.message for f in accepted.errors]
    [excluded] = findings_of(accepted, "manifest-excluded")
    assert excluded.severity == "warning" and excluded.subjects == ("sub-10", "sub-11")
    # An exclusion of one session does not excuse the subject's other rows.
    partly = chk.check_cache(cache.root, manifest=SimpleNamespace(rows=rows),
                             exclusions=["sub-10/ses-9"])
    assert {f.code for f in partly.errors} == {"manifest-missing", "manifest-failed"}


def test_check_exits_1_on_failed_rows_and_0_with_them_excluded(cache_copy, tmp_path, capsys):
    cache, _ = cache_copy
    manifest = tmp_path / "cohort.csv"
    lines = ["subject_id,session_id,image,split"]
    lines += [f"{s},{ses},images/{s}{ses}.nii.gz,{split}" for s, ses, split in COHORT]
    lines.append("sub-10,,images/sub-10.nii.gz,train")
    manifest.write_text("\n".join(lines) + "\n")
    (cache.root / "reports").mkdir(exist_ok=True)
    (cache.root / "reports" / "latest.json").write_text(json.dumps({"subjects": [
        {"subject_id": "sub-10", "session_id": "", "status": "failed", "stage": "register",
         "reason": "the head is 84 mm long"}]}))
    capsys.readouterr()
    assert cli_main(["check", str(cache.root), "--manifest", str(manifest)]) == 1
    out = capsys.readouterr().out
    assert "sub-10 failed preprocessing at stage 'register'" in out and "84 mm" in out
    exclusions = tmp_path / "excluded.txt"
    exclusions.write_text("# refused by registration: not a human head\nsub-10\n")
    assert cli_main(["check", str(cache.root), "--manifest", str(manifest),
                     "--exclude", str(exclusions)]) == 0
    assert "manifest-excluded" in capsys.readouterr().out
    assert cli_main(["check", str(cache.root), "--exclude", str(exclusions)]) == 2
    assert "give the manifest too" in capsys.readouterr().err


def test_manifest_split_mismatch_and_extra_entries(cache_copy):
    cache, keys = cache_copy
    rows = _rows(
        [(s, ses, "test" if s == "sub-03" else split) for s, ses, split in COHORT if s != "sub-08"]
    )
    report = chk.check_cache(cache.root, manifest=SimpleNamespace(rows=rows))
    [mismatch] = findings_of(report, "manifest-split-mismatch")
    assert mismatch.keys == (keys[("sub-03", "")],) and "'test'" in mismatch.message
    [extra] = findings_of(report, "not-in-manifest")
    assert extra.keys == (keys[("sub-08", "")],)
    # without a run report, a missing row is an error that says so
    rows.append(SimpleNamespace(subject_id="sub-12", session_id=None, split="val"))
    report = chk.check_cache(cache.root, manifest=SimpleNamespace(rows=rows))
    [missing] = findings_of(report, "manifest-missing")
    assert "no run report" in missing.message and missing.subjects == ("sub-12",)


# -- scanning one file ----------------------------------------------------------------


def test_scan_reports_fortran_order_and_counts_labels(tmp_path, anatomy):
    label = anatomy[1]
    path = tmp_path / "label.npy"
    np.save(path, label)
    scan = scan_tensor_file(path, "label")
    assert scan.checksum == checksum_file(path) and scan.problems == []
    assert scan.value_counts == {v: int((label == v).sum()) for v in LABELS}
    np.save(path, np.asfortranarray(label))
    assert [c for c, _ in scan_tensor_file(path, "label").problems] == ["tensor-layout"]


# -- the cast to the training dtype (--dtype) ----------------------------------------

CAST_CODES = {"extreme-values", "cast-underflow", "cast-precision"}
DTYPES = ("float16", "bfloat16", "float32")


def with_image(tmp_path, anatomy, image) -> tuple[Cache, str]:
    """A sound cache of two entries, one of which (sub-42) holds ``image``; written by the
    cache API (checksums and sidecars right): only the values can be wrong. Two entries:
    no near-duplicate search, whose fingerprints one extreme voxel would dominate."""
    cache = Cache(tmp_path / "cast", create=True)
    write_subject(cache, anatomy, "sub-41", "", "val", subject_image(anatomy, 41))
    return cache, write_subject(cache, anatomy, "sub-42", "", "train", image)


def test_clean_cache_has_no_cast_finding_under_any_dtype(pristine):
    root, _ = pristine
    for dtype in DTYPES:
        report = chk.check_cache(root, dtype=dtype)
        assert report.findings == [] and report.dtype == dtype


def test_float16_overflow_is_an_error_only_when_training_casts_to_float16(tmp_path, anatomy):
    image = subject_image(anatomy, 42)
    image[1, 2, 3] = 1e5  # beyond 65504, far inside bfloat16 and float32
    cache, key = with_image(tmp_path, anatomy, image)
    report = chk.check_cache(cache.root, dtype="float16")
    [extreme] = report.findings
    assert extreme.code == "extreme-values" and extreme.keys == (key,)
    assert extreme.subjects == ("sub-42",)
    for words in ("sub-42", "1 voxel", "float16", "65504", "(1, 2, 3)", "Rebuild"):
        assert words in extreme.message
    # the same limit under every name a numpy or torch user would give the dtype
    assert [f.code for f in chk.check_cache(cache.root, dtype=np.float16).findings] == [
        "extreme-values"
    ]
    for dtype in ("bfloat16", "torch.bfloat16", "float32"):
        report = chk.check_cache(cache.root, dtype=dtype)
        assert report.ok and report.findings == [], dtype


def test_bfloat16_overflow_of_a_float32_value(tmp_path, anatomy):
    """3.40e38 is a float32 (max 3.4028e38) beyond bfloat16's max (3.3895e38)."""
    image = subject_image(anatomy, 42)
    image[4, 5, 6] = np.float32(3.40e38)
    image[7, 8, 9] = np.float32(-3.38e38)  # inside bfloat16's range
    assert np.isfinite(image).all()
    cache, key = with_image(tmp_path, anatomy, image)
    report = chk.check_cache(cache.root, dtype="bfloat16")
    [extreme] = [f for f in report.findings if f.code in CAST_CODES]
    assert extreme.code == "extreme-values" and extreme.keys == (key,)
    assert "1 voxel" in extreme.message and "(4, 5, 6)" in extreme.message
    assert "bfloat16" in extreme.message and "3.38953e+38" in extreme.message
    float16 = chk.check_cache(cache.root, dtype="float16")
    assert "2 voxel" in findings_of(float16, "extreme-values")[0].message
    assert not findings_of(chk.check_cache(cache.root, dtype="float32"), "extreme-values")


def test_image_scaled_too_small_underflows_float16_not_bfloat16(tmp_path, anatomy):
    image = subject_image(anatomy, 42) * np.float32(1e-6)  # z-scores of 1e-6: |x| < 6.1e-5
    cache, key = with_image(tmp_path, anatomy, image)
    report = chk.check_cache(cache.root, dtype="float16")
    assert report.ok  # a warning: training runs, but on an image without contrast
    [underflow] = [f for f in report.findings if f.code in CAST_CODES]
    assert underflow.code == "cast-underflow" and underflow.keys == (key,)
    assert underflow.severity == "warning" and "sub-42" in underflow.message
    assert "6.104e-05" in underflow.message and "float16" in underflow.message
    share = float(underflow.message.split("image.npy ")[1].split("%")[0]) / 100
    expected = np.mean(np.abs(image) < 2.0**-14)
    assert share == pytest.approx(expected, abs=1e-3) and share > 0.99
    assert not [f for f in chk.check_cache(cache.root, dtype="bfloat16").findings
                if f.code in CAST_CODES]


def test_scan_of_integer_and_small_images_per_dtype(tmp_path):
    """uint8 is exact in float16 and bfloat16; larger integers are rounded or overflow."""
    def codes(array, dtype):
        path = tmp_path / "image.npy"
        np.save(path, array)
        return [c for c, _ in scan_tensor_file(path, "image", cast_dtype=dtype).problems]

    ramp = np.arange(16 * 16 * 16).reshape(16, 16, 16)
    conformed = (ramp % 256).astype(np.uint8)
    assert [codes(conformed, d) for d in DTYPES] == [[], [], []]
    wide = (ramp % 1000).astype(np.int16)  # exact in float16 (2048), not in bfloat16 (256)
    assert [codes(wide, d) for d in DTYPES] == [[], ["cast-precision"], []]
    counts = ramp.astype(np.uint16) * 16  # up to 65520: overflows float16
    assert [codes(counts, d) for d in DTYPES] == [["extreme-values"], ["cast-precision"], []]
    # a few voxels below float16's smallest normal (z-scores near 0) are no finding
    z = np.random.default_rng(0).standard_normal((16, 16, 16)).astype(np.float32)
    z.flat[:3] = [1e-6, -2e-5, 0.0]
    assert codes(z, "float16") == []
    z.flat[:10] = 1e-6  # 10 of 4096 nonzero voxels: 0.24%
    assert codes(z, "float16") == ["cast-underflow"]


def test_unknown_dtype_is_a_value_error(pristine):
    root, _ = pristine
    with pytest.raises(ValueError, match="'float64'.*float16, bfloat16, float32"):
        chk.check_cache(root, dtype="float64")


# -- command line ----------------------------------------------------------------------


def test_cli_strict_fails_on_warnings_and_labels_option(cache_copy, anatomy, capsys):
    cache, keys = cache_copy
    image = np.load(cache.tensor_path(keys[("sub-05", "")], "image"))
    # in sub-05's split: a near-duplicate warning (in another split: an identity-leak error)
    write_subject(cache, anatomy, "sub-55", "", "val", image + np.float32(0.01))
    assert cli_main(["check", str(cache.root)]) == 0
    assert cli_main(["check", str(cache.root), "--strict"]) == 1
    assert cli_main(["check", str(cache.root), "--labels", "0-1"]) == 1
    out = capsys.readouterr().out
    assert "label-values" in out and "near-duplicate" in out


def test_cli_usage_errors_exit_2_without_traceback(tmp_path, capsys):
    assert cli_main(["check", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        cli_main(["check", str(tmp_path), "--labels", "a,b"])
    assert exc.value.code == 2
    assert "not a list of integers" in capsys.readouterr().err


def test_cli_dtype_option(tmp_path, anatomy, capsys):
    image = subject_image(anatomy, 42)
    image[1, 2, 3] = -1e5
    cache, key = with_image(tmp_path, anatomy, image)
    capsys.readouterr()
    assert cli_main(["check", str(cache.root)]) == 1  # float16 by default
    out = capsys.readouterr().out
    assert "cast check: float16" in out and "extreme-values" in out and "sub-42" in out
    status, doc = cli_check(cache.root, capsys, "--dtype", "bfloat16")
    assert status == 0 and doc["dtype"] == "bfloat16" and doc["findings"] == []
    status, doc = cli_check(cache.root, capsys, "--dtype", "float16")
    assert status == 1 and doc["dtype"] == "float16"
    assert [(f["code"], f["keys"]) for f in doc["findings"]] == [("extreme-values", [key])]
    with pytest.raises(SystemExit) as exc:
        cli_main(["check", str(cache.root), "--dtype", "float64"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "float64" in err and "bfloat16" in err and "Traceback" not in err


def test_cli_manifest_option_reads_a_real_manifest(cache_copy, tmp_path, capsys):
    cache, keys = cache_copy
    manifest = tmp_path / "cohort.csv"
    lines = ["subject_id,session_id,image,split"]
    lines += [f"{s},{ses},/data/{s}_{ses}.nii.gz,{split}" for s, ses, split in COHORT]
    manifest.write_text("\n".join(lines) + "\n")
    assert cli_main(["check", str(cache.root), "--manifest", str(manifest)]) == 0
    capsys.readouterr()
    manifest.write_text("\n".join(lines + ["sub-42,,/data/sub-42.nii.gz,val"]) + "\n")
    assert cli_main(["check", str(cache.root), "--manifest", str(manifest), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    [missing] = doc["findings"]
    assert missing["code"] == "manifest-missing" and missing["subjects"] == ["sub-42"]
    assert cli_main(["check", str(cache.root), "--manifest", str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- the demo cache: the default pipeline's output on the demo cohort ---------------------
#
# These tests run on the session's demo cache (see ``demo_cache`` in conftest.py). It
# holds the planted leak (a copy of one subject's scan under another id, in another
# split); ``demo_clean`` is a clone without it, which each test corrupts one way. Clones
# hard-link the tensors, so every corruption replaces the file it changes (see
# tests/cache_clone.py), and the last test proves that the demo cache is as it was.

TIMING_KEYS = ("bytes_read", "read_seconds", "read_mb_per_s", "seconds", "near_duplicate_search")


def planted_leak(demo_cohort) -> tuple[str, str]:
    """(copy, original): the subject that is a copy of another subject's scan."""
    return next(
        (sid, defect["copy_of"])
        for sid, subject in demo_cohort.subjects.items()
        for defect in subject["defects"]
        if defect["kind"] == "leak"
    )


def subject_keys(root) -> dict[str, str]:
    """Cache keys by the demo's scan names (``sub-01``, ``sub-01_ses-2``)."""
    return {(f"{ref.subject_id}_{ref.session_id}" if ref.session_id else ref.subject_id): ref.key
            for ref in Cache(root).entries()}


def timeless(report_json: dict) -> dict:
    return {k: v for k, v in report_json.items() if k not in TIMING_KEYS}


def cli_check(root, capsys, *options) -> tuple[int, dict]:
    """``mriprep check ROOT --json [options]``: its exit status and its report."""
    capsys.readouterr()
    status = cli_main(["check", str(root), "--json", *options])
    return status, json.loads(capsys.readouterr().out)


def errors_of(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "error"]


@pytest.fixture(scope="module")
def demo_baseline(demo_cache):
    """Checksums of the demo cache's files as its build left them (whichever xdist worker
    asks first, and whatever ran there before), and its check report as this worker
    first reads it."""
    return demo_cache.checksums, timeless(chk.check_cache(demo_cache.path).to_json())


@pytest.fixture
def demo_clean(demo_cache, demo_cohort, demo_baseline, tmp_path) -> Cache:
    """A clone of the demo cache without the planted leak: a sound cache to corrupt."""
    copy, _ = planted_leak(demo_cohort)
    return clone_cache(demo_cache.path, tmp_path / "cache", drop_subjects=[copy])


@pytest.mark.slow
def test_demo_cache_without_the_leak_passes(demo_clean, demo_cache, demo_cohort, capsys):
    copy, _ = planted_leak(demo_cohort)
    entries = Cache(demo_cache.path).entries()
    clone_entries = demo_clean.entries()
    assert sorted(e.key for e in clone_entries) == sorted(
        e.key for e in entries if e.subject_id != copy
    )
    # The clone is cheap because it shares the demo cache's tensor files.
    for entry in clone_entries:
        for name in entry.files:
            assert shares_inode(
                demo_clean.tensor_path(entry.key, name),
                Cache(demo_cache.path).tensor_path(entry.key, name),
            )
    capsys.readouterr()
    assert cli_main(["check", str(demo_clean.root)]) == 0
    out = capsys.readouterr().out
    assert "OK: 0 error(s)" in out
    cached = {(r.subject_id, r.session_id): r.split for r in demo_cache.run.results
              if r.status == "cached" and r.subject_id != copy}
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["train"], ["val"], ["test"])}
    for split in ("train", "val", "test"):
        assert int(rows[split][1]) == sum(s == split for s in cached.values())


@pytest.mark.slow
def test_demo_flipped_byte_in_a_tensor(demo_clean, capsys):
    """One byte of the compressed image changed: blosc2 decodes it without complaint
    (into other values, maybe non-finite ones), and the checksum names the entry."""
    key = subject_keys(demo_clean.root)["sub-03"]
    path = demo_clean.tensor_path(key, "image")
    assert path.suffix == ".b2nd"  # the default pipeline compresses
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    replace_bytes(path, bytes(data))
    status, doc = cli_check(demo_clean.root, capsys)
    assert status == 1
    errors = errors_of(doc)
    assert "checksum-mismatch" in {f["code"] for f in errors}
    assert all(f["keys"] == [key] and f["subjects"] == ["sub-03"] for f in errors)
    [mismatch] = [f for f in errors if f["code"] == "checksum-mismatch"]
    assert "image.b2nd" in mismatch["message"] and key[:12] in mismatch["message"]


@pytest.mark.slow
def test_demo_deleted_tensor_file(demo_clean, capsys):
    key = subject_keys(demo_clean.root)["sub-06"]
    path = demo_clean.tensor_path(key, "valid")
    path.unlink()
    status, doc = cli_check(demo_clean.root, capsys)
    assert status == 1
    [finding] = errors_of(doc)
    assert finding["code"] == "file-missing"
    assert finding["keys"] == [key] and finding["subjects"] == ["sub-06"]
    assert f"{path.name} is missing" in finding["message"] and "sub-06" in finding["message"]


@pytest.mark.slow
def test_demo_entry_from_a_different_pipeline(demo_clean, demo_cache, demo_cohort, capsys,
                                              tmp_path):
    # sub-06 preprocessed again, by the conform pipeline, and its entry copied into the
    # cache by hand (`mriprep run` itself refuses to mix pipelines in one cache).
    [task] = [t for t in cohort_rows(demo_cohort.manifest) if t.subject_id == "sub-06"]
    conform = run_cohort([task], tmp_path / "conform", load_pipeline("conform_1mm"),
                         scheduler="sync", report=False)
    assert conform.counts()["cached"] == 1
    key = conform.results[0].key
    shutil.copytree(Cache(tmp_path / "conform").entry_dir(key), demo_clean.entry_dir(key))
    demo_clean.update_index([conform.results[0].entry.with_split(task.split)])
    status, doc = cli_check(demo_clean.root, capsys)
    assert status == 1
    [finding] = errors_of(doc)
    assert finding["code"] == "pipeline-mismatch"
    assert finding["keys"] == [key] and finding["subjects"] == ["sub-06"]
    default = demo_cache.run.pipeline.hash
    assert f"conform_1mm {conform.pipeline.hash[:12]}" in finding["message"]
    assert f"{default[:12]} (t1w_mni_rigid)" in finding["message"]
    cached = len(demo_clean.read_index())
    assert doc["pipeline_hashes"] == {default: cached - 1, conform.pipeline.hash: 1}
    # Fingerprints of another pipeline's grid must not make distinct subjects look alike.
    assert not [f for f in doc["findings"] if f["code"] == "near-duplicate"]


@pytest.mark.slow
def test_demo_subject_in_train_and_test(demo_clean, capsys):
    keys = subject_keys(demo_clean.root)
    # A manifest that gives sub-12's scan (test) as a third session of sub-01 (train).
    third = relabel_entry(demo_clean, keys["sub-12"], "sub-01", "ses-3", "test")
    status, doc = cli_check(demo_clean.root, capsys)
    assert status == 1
    [finding] = errors_of(doc)
    assert finding["code"] == "subject-split-leak"
    assert finding["subjects"] == ["sub-01"]
    assert set(finding["keys"]) == {keys["sub-01"], keys["sub-01_ses-2"], third}
    assert "test: ses-3" in finding["message"] and "train: (no session)" in finding["message"]


@pytest.mark.slow
def test_demo_planted_leak_same_image_under_two_ids(demo_cache, demo_cohort, demo_baseline,
                                                    capsys):
    copy, original = planted_leak(demo_cohort)
    keys = subject_keys(demo_cache.path)
    status, doc = cli_check(demo_cache.path, capsys, "--manifest", str(demo_cohort.manifest))
    assert status == 1
    # The failed rows fail the gate too; besides them, one error: the identical tensors
    # are the same group, reported once.
    [finding] = [f for f in errors_of(doc) if f["code"] != "manifest-failed"]
    assert finding["code"] == "duplicate-input"
    assert set(finding["subjects"]) == {copy, original}
    assert set(finding["keys"]) == {keys[copy], keys[original]}
    splits = {demo_cohort.subjects[s]["split"] for s in (copy, original)}
    assert all(f"({split})" in finding["message"] for split in splits)
    assert not any(f["code"] == "near-duplicate" and set(f["subjects"]) == {copy, original}
                   for f in doc["findings"])
    # The subjects that failed in the run are listed with the run's reason, not as missing.
    failed = {r.subject_id: r.reason for r in demo_cache.run.failed}
    listed = [f for f in doc["findings"] if f["code"] == "manifest-failed"]
    assert sorted(s for f in listed for s in f["subjects"]) == sorted(failed)
    for f in listed:
        assert failed[f["subjects"][0]][:40] in f["message"]


@pytest.mark.slow
def test_demo_nan_written_into_a_tensor(demo_clean, capsys):
    key = subject_keys(demo_clean.root)["sub-07"]
    path = demo_clean.tensor_path(key, "image")
    image = read_array(path)
    recorded_size = path.stat().st_size
    image[98, 116, 94] = np.nan
    replace_array(path, image)
    status, doc = cli_check(demo_clean.root, capsys)
    assert status == 1
    expected = {"non-finite", "checksum-mismatch"}
    if path.stat().st_size != recorded_size:  # LZ4 may pack the NaN in other bytes
        expected.add("file-size")
    assert {f["code"] for f in errors_of(doc)} == expected
    [nan] = [f for f in doc["findings"] if f["code"] == "non-finite"]
    assert nan["keys"] == [key] and nan["subjects"] == ["sub-07"]
    assert "1 NaN" in nan["message"] and "(98, 116, 94)" in nan["message"]


@pytest.mark.slow
def test_demo_cache_survives_the_cast_to_every_dtype(demo_cache):
    """The default pipeline's z-scored images: none overflows or underflows a cast."""
    for dtype in ("float16", "bfloat16"):
        report = chk.check_cache(demo_cache.path, dtype=dtype)
        assert not [f for f in report.findings if f.code in CAST_CODES], dtype


@pytest.mark.slow
def test_demo_cache_is_untouched_by_the_corrupted_clones(demo_cache, demo_baseline):
    """Runs last in this module: every clone above shared the demo cache's tensor files,
    and none may have changed them since the build."""
    checksums, report = demo_baseline
    assert checksums and file_checksums(demo_cache.path) == checksums
    assert timeless(chk.check_cache(demo_cache.path).to_json()) == report
