"""The cohort runner: failures stay per subject, reruns resume, crashes leave no corrupt entry.

The fast tests run small pipelines made of the stages registered below over a cohort of
MNI152 volumes downsampled to 4 mm (real anatomy, about 50x58x47 voxels). The stages are
importable as ``test_runner`` from the tests folder, so that worker processes (a
LocalCluster, ``dask worker``, a second ``mriprep run``) find them when they unpickle a
pipeline. The end-to-end run of the shipped default pipeline is marked slow.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage

from mriprep.cache import Cache
from mriprep.cli import main
from mriprep.core.errors import CacheError, StageError
from mriprep.core.errors import SchedulerError
from mriprep.core.hashing import checksum_file
from mriprep.inputs.templates import load_mni152_tissue, load_template
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import cohort_rows, run_cohort
from mriprep.run.progress import ProgressReporter
from mriprep.cache.run_report import SubjectResult
from mriprep.run.scheduling import connect
from mriprep.stages import StageOutput, stage

from tests.cache_clone import clone_cache

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(sys.executable).parent
# A child process that registers this module's stages, then runs the mriprep CLI with
# Ctrl-C as a terminal delivers it: a shell without job control (CI, `make test &`) starts
# background commands with SIGINT ignored, every child inherits that, and the Ctrl-C
# tests would then time a run that cannot be stopped.
CLI_BOOT = ("import signal, sys, tests.run.test_runner; from mriprep.cli import main; "
            "signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(main())")


@dataclass(frozen=True)
class SmoothParams:
    sigma_vox: float = 0.5
    # Stands in for registration's run time, so that a kill lands in the middle of a run.
    pause_s: float = 0.0


@stage("runner_test_smooth", SmoothParams)
def _smooth(volume, params):
    time.sleep(params.pause_s)
    data = ndimage.gaussian_filter(volume.data, params.sigma_vox)
    change = float(np.abs(data - volume.data).max())
    return StageOutput(volume.replace(data=data), {"max_change": change})


@dataclass(frozen=True)
class ZScoreParams:
    min_std: float = 1e-3


@stage("runner_test_zscore", ZScoreParams)
def _zscore(volume, params):
    foreground = volume.data[volume.valid & (volume.data > 0)]
    std = float(foreground.std()) if foreground.size else 0.0
    if std < params.min_std:
        raise StageError("runner_test_zscore",
                         f"constant image (std {std:.3g}), nothing to normalise")
    data = (volume.data - foreground.mean()) / std
    return StageOutput(volume.replace(data=data), {"mean": float(foreground.mean()), "std": std})


@dataclass(frozen=True)
class CrashParams:
    subject: str = ""


@stage("runner_test_crash", CrashParams)
def _crash(volume, params):
    if volume.subject_id == params.subject:
        os._exit(3)  # what a segfault in a native library or the OOM killer looks like
    return StageOutput(volume)


GOOD = ["sub-01", "sub-02", "sub-03", "sub-05", "sub-06", "sub-07"]
BROKEN = {"sub-04": "runner_test_zscore", "sub-08": "load"}


def write_pipeline(folder: Path, name="runner-test", pause_s=0.0, sigma=0.5, extra="",
                   dtype="float32") -> Path:
    path = folder / f"{name}-{pause_s}-{sigma}-{dtype}.yaml"
    path.write_text(
        f"name: {name}\noutput_dtype: {dtype}\nstages:\n{extra}"
        f"  - runner_test_smooth: {{sigma_vox: {sigma}, pause_s: {pause_s}}}\n"
        "  - runner_test_zscore\n"
    )
    return path


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """Eight 4 mm subjects from MNI152 with tissue labels; sub-04 constant, sub-08 truncated."""
    root = tmp_path_factory.mktemp("runner_cohort")
    mni = load_template("mni152")
    tissue = load_mni152_tissue()
    small = ndimage.zoom(mni.data, 0.25, order=1)
    gm = ndimage.zoom(tissue["gm"], 0.25, order=1)
    wm = ndimage.zoom(tissue["wm"], 0.25, order=1)
    labels = np.select([wm > 0.5, gm > 0.5, small > 0.05 * small.max()], [3, 2, 1], 0)
    labels = labels.astype(np.int16)
    affine = mni.affine.copy()
    affine[:3, :3] *= 4
    rng = np.random.default_rng(0)
    rows = []
    splits = ["train", "train", "train", "train", "val", "val", "test", "test"]
    for i, split in enumerate(splits, start=1):
        sid = f"sub-{i:02d}"
        data = small * (1 + 0.05 * i) + rng.normal(0, 20, small.shape)
        if sid == "sub-04":
            data = np.full(small.shape, 400.0)
        image = root / f"{sid}_T1w.nii.gz"
        label = root / f"{sid}_dseg.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), affine), image)
        nib.save(nib.Nifti1Image(labels, affine), label)
        if sid == "sub-08":
            image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])
        rows.append({"subject_id": sid, "image": image.name, "label": label.name,
                     "split": split, "session_id": ""})
    manifest = root / "cohort.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_pipeline(root)
    return root


def run(cohort, cache, pipeline=None, **kwargs):
    kwargs.setdefault("scheduler", "threads")
    kwargs.setdefault("workers", 2)
    # These tests are about the runner; the QC report has its own (tests/qc), and the
    # CLI test below runs with it as users do.
    kwargs.setdefault("report", False)
    pipe = load_pipeline(pipeline or write_pipeline(cohort))
    return run_cohort(cohort_rows(cohort / "cohort.csv"), cache, pipe, **kwargs)


def statuses(result):
    return {r.subject_id: r.status for r in result.results}


def subprocess_env():
    path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("MRIPREP_DEBUG", None)
    return env


def assert_cache_whole(cache_root, expected_subjects, only_indexed=True):
    """Every indexed entry verifies and every subject is indexed.

    With ``only_indexed`` no other entry folder exists (true unless an earlier run with
    other inputs or parameters left entries that the index has since retired).
    """
    cache = Cache(cache_root)
    refs = cache.entries()
    assert sorted(r.subject_id for r in refs) == sorted(expected_subjects)
    assert all(cache.has_entry(r.key, verify=True) for r in refs)
    if only_indexed:
        visible = sorted(p.name for p in cache.entries_dir.iterdir() if p.name != ".tmp")
        assert visible == sorted(r.key for r in refs)


def test_failing_subjects_are_reported_and_the_rest_cached(cohort, tmp_path):
    result = run(cohort, tmp_path / "cache")
    assert statuses(result) == {**{s: "cached" for s in GOOD},
                                "sub-04": "failed", "sub-08": "failed"}
    assert result.exit_code == 1
    failed = {r.subject_id: r for r in result.failed}
    assert failed["sub-04"].stage == "runner_test_zscore"
    assert "constant image" in failed["sub-04"].reason
    assert failed["sub-08"].stage == "load"
    assert "sub-08_T1w.nii.gz" in failed["sub-08"].reason
    # The stages before the failure still report their metrics.
    assert "runner_test_smooth" in failed["sub-04"].metrics
    assert_cache_whole(tmp_path / "cache", GOOD)
    cache = Cache(tmp_path / "cache")
    assert {r.subject_id: r.split for r in cache.entries()} == {
        "sub-01": "train", "sub-02": "train", "sub-03": "train",
        "sub-05": "val", "sub-06": "val", "sub-07": "test",
    }


def test_entries_hold_typed_tensors_and_full_provenance(cohort, tmp_path):
    result = run(cohort, tmp_path / "cache", write_pipeline(tmp_path, dtype="float16"))
    cache = Cache(tmp_path / "cache")
    entry = next(r for r in result.results if r.subject_id == "sub-02")
    image = cache.load_tensor(entry.key, "image")
    assert image.dtype == np.float16 and np.isfinite(image).all()
    assert cache.load_tensor(entry.key, "valid").dtype == bool
    label = cache.load_tensor(entry.key, "label")
    assert label.dtype == np.int16 and set(np.unique(label)) == {0, 1, 2, 3}
    meta = cache.read_meta(entry.key)
    assert meta["pipeline_name"] == "runner-test" and meta["output_dtype"] == "float16"
    assert meta["inputs"]["image"]["path"] == str(cohort / "sub-02_T1w.nii.gz")
    assert meta["inputs"]["label"]["sha256"]
    assert meta["spacing"] == pytest.approx([4.0, 4.0, 4.0])
    assert meta["shape"] == list(image.shape)
    assert [p["stage"] for p in meta["provenance"]] == [
        "load", "runner_test_smooth", "runner_test_zscore"]
    assert meta["provenance"][2]["params"] == {"min_std": 0.001}
    assert meta["mriprep_version"]


def test_reports_list_every_subject_with_metrics(cohort, tmp_path):
    run(cohort, tmp_path / "cache")
    reports = tmp_path / "cache" / "reports"
    doc = json.loads((reports / "latest.json").read_text())
    assert doc["counts"] == {"cached": 6, "skipped": 0, "failed": 2, "total": 8}
    rows = {r["subject_id"]: r for r in doc["subjects"]}
    assert list(rows) == [f"sub-{i:02d}" for i in range(1, 9)]  # manifest order
    assert rows["sub-01"]["metrics"]["runner_test_zscore"]["std"] > 0
    assert rows["sub-01"]["metrics"]["load"]["seconds"] >= 0
    assert rows["sub-04"]["status"] == "failed" and rows["sub-04"]["reason"]
    table = list(csv.DictReader(io.StringIO((reports / "latest.csv").read_text())))
    assert [r["status"] for r in table] == [rows[r["subject_id"]]["status"] for r in table]
    assert float(table[0]["runner_test_zscore.std"]) == pytest.approx(
        rows["sub-01"]["metrics"]["runner_test_zscore"]["std"])
    assert len(list(reports.glob("run-*.json"))) == 1 and len(list(reports.glob("run-*.csv"))) == 1


def test_rerun_skips_everything_and_says_so(cohort, tmp_path, capsys):
    argv = ["run", str(cohort / "cohort.csv"), "-o", str(tmp_path / "cache"), "-p",
            str(write_pipeline(cohort)), "--scheduler", "sync"]
    assert main(argv) == 1
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache" / "entries").rglob("*.npy")}
    capsys.readouterr()
    assert main(argv + ["--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"cached": 0, "skipped": 6, "failed": 2, "total": 8}
    assert {p: p.stat().st_mtime_ns for p in written} == written
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert ("6 subjects already had a verified cache entry for these inputs and this "
            "pipeline: skipped") in text
    assert "sub-04 at runner_test_zscore: constant image" in text
    # Every run ends with the QC report, unless asked not to.
    index = tmp_path / "cache" / "qc" / "index.html"
    assert f"QC report: {index}" in text and index.is_file()
    assert main(["run", str(cohort / "cohort.csv"), "-o", str(tmp_path / "plain"), "-p",
                 str(write_pipeline(cohort)), "--scheduler", "sync", "--no-report"]) == 1
    assert "QC report" not in capsys.readouterr().out
    assert not (tmp_path / "plain" / "qc").exists()


def test_changed_input_recomputes_only_that_subject(cohort, tmp_path):
    cache_root = tmp_path / "cache"
    run(cohort, cache_root)
    before = {r.subject_id: r.key for r in Cache(cache_root).entries()}
    image = cohort / "sub-03_T1w.nii.gz"
    original = image.read_bytes()
    try:
        os.utime(image)  # a new mtime alone changes nothing: the key is the content
        assert statuses(run(cohort, cache_root))["sub-03"] == "skipped"
        img = nib.load(image)
        nib.save(nib.Nifti1Image(img.get_fdata(dtype=np.float32) * 1.5, img.affine), image)
        result = run(cohort, cache_root)
    finally:
        image.write_bytes(original)
    assert statuses(result) == {**{s: "skipped" for s in GOOD}, "sub-03": "cached",
                                "sub-04": "failed", "sub-08": "failed"}
    after = {r.subject_id: r.key for r in Cache(cache_root).entries()}
    assert [s for s in GOOD if after[s] != before[s]] == ["sub-03"]


def test_changed_parameter_and_force_recompute(cohort, tmp_path):
    cache_root = tmp_path / "cache"
    run(cohort, cache_root)
    # A changed parameter is another pipeline: it takes the cache over only when asked.
    with pytest.raises(CacheError, match="the same name with other parameters"):
        run(cohort, cache_root, write_pipeline(tmp_path, sigma=1.0))
    changed = run(cohort, cache_root, write_pipeline(tmp_path, sigma=1.0),
                  replace_pipeline=True)
    assert [s for s, v in statuses(changed).items() if v == "cached"] == GOOD
    forced = run(cohort, cache_root, write_pipeline(tmp_path, sigma=1.0), force=True)
    assert [s for s, v in statuses(forced).items() if v == "cached"] == GOOD
    assert_cache_whole(cache_root, GOOD, only_indexed=False)
    assert {r.pipeline_hash for r in Cache(cache_root).entries()} == {changed.pipeline.hash}


def test_corrupt_entry_is_recomputed_not_skipped(cohort, tmp_path):
    cache_root = tmp_path / "cache"
    first = run(cohort, cache_root)
    key = next(r.key for r in first.results if r.subject_id == "sub-05")
    path = Cache(cache_root).tensor_path(key, "image")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    again = run(cohort, cache_root)
    assert statuses(again)["sub-05"] == "cached"
    assert "replaced an entry that failed verification" in next(
        r for r in again.results if r.subject_id == "sub-05").warnings
    assert_cache_whole(cache_root, GOOD)


def test_config_errors_exit_2_before_any_subject(cohort, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nstages:\n  - runner_test_smooth: {sigma_vox: wide}\n")
    cache_root = tmp_path / "cache"
    assert main(["run", str(cohort / "cohort.csv"), "-o", str(cache_root), "-p", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"pipeline {bad} has 1 problem(s)" in err
    assert "key 'sigma_vox' = 'wide' must be a number" in err
    assert not cache_root.exists()
    assert main(["run", str(cohort / "cohort.csv"), "-o", str(cache_root), "-p",
                 str(write_pipeline(cohort)), "--scheduler", "pbs"]) == 2
    assert "unknown scheduler 'pbs'" in capsys.readouterr().err
    assert not cache_root.exists()


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(SchedulerError, match="cannot reach the dask scheduler at tcp://127"):
        connect("tcp://127.0.0.1:9", timeout_s=1)


def test_progress_bar_on_a_terminal_and_plain_lines_otherwise(cohort, tmp_path, monkeypatch):
    import tqdm.std

    results = run(cohort, tmp_path / "cache").results
    # A terminal 100 columns wide (a StringIO reports no width: it would get lines).
    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: (lambda fp: (100, 24)))
    bar_stream, log_stream = io.StringIO(), io.StringIO()
    bar = ProgressReporter(len(results), stream=bar_stream, terminal=True)
    log = ProgressReporter(len(results), stream=log_stream, terminal=False, log_every_s=3600)
    for result in results:
        bar(result)
        log(result)
    bar.close()
    shown = bar_stream.getvalue()
    assert "8/8" in shown and "failed=2" in shown and "subj" in shown
    assert "FAILED sub-04 at runner_test_zscore: constant image" in shown
    lines = log_stream.getvalue().splitlines()
    assert lines[-1].startswith("mriprep run: 8/8 subjects done (6 cached, 0 skipped, 2 failed)")
    assert sum("FAILED" in line for line in lines) == 2 and len(lines) == 3
    assert "\r" not in log_stream.getvalue()


def test_dead_worker_fails_only_its_subject(cohort, tmp_path):
    pipeline = write_pipeline(tmp_path, extra="  - runner_test_crash: {subject: sub-02}\n")
    result = run(cohort, tmp_path / "cache", pipeline, scheduler="processes", workers=2)
    failed = {r.subject_id: r for r in result.failed}
    assert set(failed) == {"sub-02", "sub-04", "sub-08"}
    assert failed["sub-02"].stage == "worker"
    assert "worker process died" in failed["sub-02"].reason
    assert_cache_whole(tmp_path / "cache", set(GOOD) - {"sub-02"})


def test_sigkill_midway_then_rerun_completes(cohort, tmp_path):
    cache_root = tmp_path / "cache"
    slow = write_pipeline(tmp_path, pause_s=0.4)
    cmd = [sys.executable, "-c", CLI_BOOT, "run", str(cohort / "cohort.csv"), "-o",
           str(cache_root), "-p", str(slow), "--scheduler", "processes", "--workers", "2",
           "--no-report"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    entries = cache_root / "entries"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        done = [p for p in entries.glob("*") if p.name != ".tmp"] if entries.exists() else []
        if done:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its worker processes, mid-write
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_with = {p.name for p in entries.iterdir() if p.name != ".tmp"}
    assert 1 <= len(killed_with) < len(GOOD)
    result = run(cohort, cache_root, slow, scheduler="processes", workers=2)
    assert result.count("cached") + result.count("skipped") == len(GOOD)
    assert result.count("skipped") >= len(killed_with)
    assert_cache_whole(cache_root, GOOD)


def test_two_runs_on_one_cache_at_once(cohort, tmp_path):
    cache_root = tmp_path / "cache"
    cmd = [sys.executable, "-c", CLI_BOOT, "run", str(cohort / "cohort.csv"), "-o",
           str(cache_root), "-p", str(write_pipeline(tmp_path, pause_s=0.1)),
           "--scheduler", "threads", "--workers", "2", "--json", "--no-report"]
    procs = [subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], [o[1][-2000:] for o in outputs]
    summaries = [json.loads(out) for out, _ in outputs]
    for summary in summaries:
        assert summary["counts"]["failed"] == 2
        assert summary["counts"]["cached"] + summary["counts"]["skipped"] == len(GOOD)
    assert_cache_whole(cache_root, GOOD)
    assert list(Cache(cache_root).tmp_dir.iterdir()) == []


@pytest.fixture
def dask_cluster(tmp_path):
    """A dask scheduler and one worker, started as separate CLI processes on loopback."""
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen(
        [str(BIN_DIR / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--no-dashboard", "--scheduler-file", str(scheduler_file)],
        env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(subprocess.Popen(
            [str(BIN_DIR / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp_path)],
            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        ))
        client = connect(address)
        client.wait_for_workers(1, timeout=60)
        client.close()
        yield address
    finally:
        # Each CLI process leads its own group: the worker's nanny and its child go together.
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_distributed_cluster_gives_the_same_bytes_as_a_local_run(cohort, tmp_path, dask_cluster):
    local = run(cohort, tmp_path / "local", scheduler="sync")
    remote = run(cohort, tmp_path / "remote", scheduler=dask_cluster)
    assert statuses(remote) == statuses(local)
    assert all(r.worker for r in remote.results), [r.subject_id for r in remote.results]
    worker_pids = {r.worker.rsplit(":", 1)[1] for r in remote.results}
    assert str(os.getpid()) not in worker_pids  # the subjects ran in the dask worker
    local_cache, remote_cache = Cache(tmp_path / "local"), Cache(tmp_path / "remote")
    local_refs, remote_refs = local_cache.entries(), remote_cache.entries()
    assert [r.key for r in remote_refs] == [r.key for r in local_refs]
    for ref in local_refs:
        for name in ("image", "valid", "label"):
            assert checksum_file(remote_cache.tensor_path(ref.key, name)) == checksum_file(
                local_cache.tensor_path(ref.key, name))
        assert remote_cache.read_index()[ref.key]["files"] == ref.to_json()["files"]


def test_gzip_inputs_are_hashed_by_their_bytes(cohort, tmp_path):
    # Same voxels, different compression level: different bytes, so a different entry.
    copy = tmp_path / "cohort"
    copy.mkdir()
    for path in cohort.glob("sub-0[12]_*"):
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    raw = gzip.decompress((copy / "sub-01_T1w.nii.gz").read_bytes())
    (copy / "sub-01_T1w.nii.gz").write_bytes(gzip.compress(raw, compresslevel=1))
    (copy / "cohort.csv").write_text(
        "subject_id,image,label,split\n"
        "sub-01,sub-01_T1w.nii.gz,sub-01_dseg.nii.gz,train\n"
        "sub-02,sub-02_T1w.nii.gz,sub-02_dseg.nii.gz,train\n")
    original = run(cohort, tmp_path / "c1")
    recompressed = run(copy, tmp_path / "c2")
    keys = {r.subject_id: r.key for r in original.results}
    assert recompressed.results[0].key != keys["sub-01"]
    assert recompressed.results[1].key == keys["sub-02"]


def test_quality_stages_of_mriprep_through_the_runner(cohort, tmp_path):
    pipeline = tmp_path / "quality.yaml"
    pipeline.write_text(
        "name: quality\noutput_dtype: float16\nstages:\n"
        "  - reorient\n  - sanitize\n  - mask_slices\n  - normalize\n"
        "  - validate: {allowed_labels: [0, 1, 2, 3]}\n"
    )
    result = run(cohort, tmp_path / "cache", pipeline)
    failed = {r.subject_id: r for r in result.failed}
    assert set(failed) == {"sub-04", "sub-08"}
    assert failed["sub-08"].stage == "load"
    assert failed["sub-04"].stage in ("sanitize", "mask_slices", "normalize")
    assert_cache_whole(tmp_path / "cache", GOOD)
    cache = Cache(tmp_path / "cache")
    for ref in cache.entries():
        image = cache.load_tensor(ref.key, "image")
        assert image.dtype == np.float16 and np.isfinite(image).all()
        assert ref.label_values == (0, 1, 2, 3)
        meta = cache.read_meta(ref.key)
        assert [p["stage"] for p in meta["provenance"]] == [
            "load", "reorient", "sanitize", "mask_slices", "normalize", "validate"]
        # sanitize and validate inherit the pipeline's dtype
        assert meta["provenance"][2]["params"]["output_dtype"] == "float16"


@pytest.mark.slow
def test_default_pipeline_over_the_demo_cohort(demo_cohort, demo_cache, tmp_path, capsys):
    """The session's demo cache is this run: the default pipeline, 2 worker processes."""
    import SimpleITK as sitk

    from mriprep.stages.registration.geometry import (
        matrix_from_sitk,
        target_registration_error,
    )
    from mriprep.stages.registration.template import template_brain_points

    cache_root = demo_cache.path
    assert demo_cache.run.exit_code == 1
    assert demo_cache.run.pipeline.name == "t1w_mni_rigid"
    assert (demo_cache.run.scheduler, demo_cache.run.workers) == ("processes", 2)
    from mriprep.demo.verify import TRUTH_MEAN_LIMIT_MM, refusal_causes

    truth = demo_cohort.subjects
    doc = json.loads((cache_root / "reports" / "latest.json").read_text())

    def scan_name(subject_id, session_id):
        return f"{subject_id}_{session_id}" if session_id else subject_id

    rows = {scan_name(r["subject_id"], r["session_id"]): r for r in doc["subjects"]}
    assert set(rows) == set(truth)
    expected_failures = {s for s, t in truth.items() if t["expected"] == "fail"}
    assert {s for s, r in rows.items() if r["status"] == "failed"} == expected_failures
    for sid in expected_failures:
        kinds = {d["kind"] for d in truth[sid]["defects"]}
        if "truncated_file" in kinds:
            assert rows[sid]["stage"] == "load" and "voxel data is not" in rows[sid]["reason"]
        elif truth[sid]["expected_causes"]:  # refused by a check, its metrics kept
            # The report row read back as the result it records.
            causes = refusal_causes(SubjectResult.from_json(rows[sid]))
            assert set(causes) & set(truth[sid]["expected_causes"])
            stage = rows[sid]["stage"]
            measured = {"register": "search_best_ncc", "plausibility": "head_extents_mm"}
            assert measured[stage] in rows[sid]["metrics"][stage]
        else:  # a dead (constant) volume: no stage after the quality stages may cache it
            assert rows[sid]["stage"] in ("sanitize", "mask_slices", "register", "normalize")
            assert rows[sid]["reason"]
    cache = Cache(cache_root)
    points = template_brain_points()
    for ref in cache.entries():
        name = scan_name(ref.subject_id, ref.session_id)
        meta = cache.read_meta(ref.key)
        assert meta["shape"] == [197, 233, 189] and ref.split == truth[name]["split"]
        # Other people score 0.57-0.73 on the calibration set (a template copy 0.94-0.99).
        assert 0.45 < rows[name]["metrics"]["register"]["similarity"] < 0.9
        written = sitk.ReadTransform(str(cache.entry_dir(ref.key) / "transform.tfm"))
        np.testing.assert_allclose(matrix_from_sitk(written), meta["template_to_subject"],
                                   atol=1e-6)
        mean_mm, _ = target_registration_error(
            np.asarray(meta["template_to_subject"]),
            np.asarray(truth[name]["template_to_subject"]), points)
        assert mean_mm < TRUTH_MEAN_LIMIT_MM, name
    # The rerun goes through the CLI, on a clone: the session's demo cache stays as the
    # first run left it for the other tests. Its manifest holds the cached scans only: a
    # failed subject is tried again on every run (test_rerun_skips_everything_and_says_so),
    # which here would register the refused heads again, half a minute of CPU.
    clone = clone_cache(cache_root, tmp_path / "cache")
    manifest = tmp_path / "cached.csv"
    with open(demo_cohort.manifest, newline="") as fh:
        rows_in = list(csv.DictReader(fh))
    with open(manifest, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows_in[0]))
        writer.writeheader()
        for row in rows_in:
            if scan_name(row["subject_id"], row["session_id"]) not in expected_failures:
                writer.writerow({**row, "image": demo_cohort.root / row["image"],
                                 "label": demo_cohort.root / row["label"]})
    argv = ["run", str(manifest), "-o", str(clone.root), "--workers", "2", "--no-report"]
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts == {"cached": 0, "skipped": len(truth) - len(expected_failures),
                      "failed": 0, "total": len(truth) - len(expected_failures)}


def test_an_entry_whose_sidecar_was_edited_out_of_shape_is_made_again(cohort, tmp_path):
    """Intact tensors under a hand-edited meta.json: the rerun makes the entry again
    instead of failing the subject on every run."""
    cache_root = tmp_path / "cache"
    run(cohort, cache_root)
    entry = next(e for e in Cache(cache_root).entries() if e.subject_id == "sub-01")
    meta_path = Cache(cache_root).entry_dir(entry.key) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["affine"] = "not a matrix"
    meta_path.write_text(json.dumps(meta))
    again = {r.subject_id: r for r in run(cohort, cache_root).results}
    assert again["sub-01"].status == "cached", (again["sub-01"].stage, again["sub-01"].reason)
    assert isinstance(json.loads(meta_path.read_text())["affine"], list)
    assert {r.status for sid, r in again.items() if sid != "sub-01"} <= {"skipped", "failed"}
