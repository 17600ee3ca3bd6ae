"""Header conflicts through a run: measured on load, a `header-conflict` warning of
`mriprep check`, a flag of the QC report, and the two ways to choose a form (the
pipeline's `header:`, the manifest's `header` column), which reach every reader.

Three 32^3 scans: sub-01 a 10-degree shear saved by nibabel (sform sheared, qform its
rotation-only approximation, both code 1), sub-02 an oblique grid with both forms equal,
sub-03 an SPM-like coregistration (the sform moved 3 mm and turned 2 degrees, the qform
left). The pipeline is sanitize alone, so each entry keeps its input's affine.
"""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from mriprep import check as chk
from mriprep.cache import Cache
from mriprep.cli import main as cli_main
from mriprep.inputs.headers import FORM_CONFLICT_LIMIT_MM
from mriprep.outputs.native import native_grid
from mriprep.pipelines import load_pipeline
from mriprep.run.cohort import cohort_rows, run_cohort

SHAPE = (32, 32, 32)


def _turn(degrees: float) -> np.ndarray:
    t = np.deg2rad(degrees)
    r = np.eye(4)
    r[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    return r


def _save(path, qform, sform, qcode=1, scode=1):
    rng = np.random.default_rng(int(path.name[4:6]))  # sub-NN: another scan each
    grid = np.indices(SHAPE) - 15.5
    head = 400.0 * np.exp(-(grid ** 2).sum(axis=0) / (2 * 8.0 ** 2))  # a smooth head
    data = (head + rng.uniform(20, 30, SHAPE)).astype(np.float32)
    img = nib.Nifti1Image(data, sform)
    img.set_sform(sform, code=scode)
    img.set_qform(qform, code=qcode)
    nib.save(img, path)
    hdr = nib.load(path).header
    return hdr.get_qform(), hdr.get_sform()


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("header_cohort")
    base = _turn(8.0) @ np.diag([1.1, 1.0, 1.2, 1.0])
    base[:3, 3] = [-18.0, -16.0, -19.0]
    sheared = base @ np.array([[1, np.tan(np.deg2rad(10.0)), 0, 0], [0, 1, 0, 0],
                               [0, 0, 1, 0], [0, 0, 0, 1.0]])
    coregistered = _turn(2.0) @ base
    coregistered[:3, 3] += [3.0, 0.0, 0.0]
    forms = {
        "sub-01": _save(root / "sub-01_T1w.nii.gz", sheared, sheared),
        "sub-02": _save(root / "sub-02_T1w.nii.gz", base, base),
        "sub-03": _save(root / "sub-03_T1w.nii.gz", base, coregistered, scode=2),
    }
    lines = [f"{sid},{sid}_T1w.nii.gz,train" for sid in forms]
    (root / "auto.csv").write_text("subject_id,image,split\n" + "\n".join(lines) + "\n")
    chosen = [line + (",sform" if line.startswith(("sub-01", "sub-03")) else ",")
              for line in lines]
    (root / "chosen.csv").write_text("subject_id,image,split,header\n" + "\n".join(chosen)
                                     + "\n")
    for name, header in (("auto", "auto"), ("sform", "sform")):
        (root / f"{name}.yaml").write_text(
            f"name: header-test\noutput_dtype: float32\nheader: {header}\n"
            "stages:\n  - sanitize\n")
    return root, forms


def _run(root, manifest, pipeline, cache, report=False):
    return run_cohort(cohort_rows(root / manifest), cache, load_pipeline(root / pipeline),
                      scheduler="sync", workers=1, report=report)


def _entries(cache):
    return {e["subject_id"]: (key, e) for key, e in Cache(cache).read_index().items()}


def _load_metrics(cache, key):
    meta = Cache(cache).read_meta(key)
    (load,) = [r for r in meta["provenance"] if r["stage"] == "load"]
    return meta, load["metrics"]


@pytest.fixture(scope="module")
def auto_cache(cohort, tmp_path_factory):
    root, _ = cohort
    cache = tmp_path_factory.mktemp("auto") / "cache"
    result = _run(root, "auto.csv", "auto.yaml", cache, report=True)
    assert all(r.status == "cached" for r in result.results), result.results
    return cache


def test_a_conflict_above_the_limit_is_a_check_warning_naming_subject_mm_and_fix(
        cohort, auto_cache, capsys):
    root, forms = cohort
    entries = _entries(auto_cache)
    distances = {sid: _load_metrics(auto_cache, key)[1]["form_conflict_mm"]
                 for sid, (key, _) in entries.items()}
    assert min(distances["sub-01"], distances["sub-03"]) > 2 * FORM_CONFLICT_LIMIT_MM
    assert distances["sub-02"] < 1e-3
    for sid in ("sub-01", "sub-03"):  # FastSurfer's rule: the qform
        np.testing.assert_allclose(entries[sid][1]["affine"], forms[sid][0], atol=1e-6)

    report = chk.check_cache(auto_cache)
    conflicts = [f for f in report.findings if f.code == "header-conflict"]
    assert sorted(f.subjects[0] for f in conflicts) == ["sub-01", "sub-03"]
    assert all(f.severity == "warning" for f in conflicts) and report.ok
    for finding in conflicts:
        sid = finding.subjects[0]
        assert finding.keys == (entries[sid][0],)
        assert f"up to {distances[sid]:.1f} mm apart" in finding.message
        assert f"limit {FORM_CONFLICT_LIMIT_MM:g} mm" in finding.message
        assert f"{sid}_T1w.nii.gz" in finding.message
        assert "`header: sform`" in finding.message and "SPM-coregistered" in finding.message

    # A warning: the gate stays open unless --strict.
    assert cli_main(["check", str(auto_cache)]) == 0
    assert "header-conflict" in capsys.readouterr().out
    assert cli_main(["check", str(auto_cache), "--strict"]) == 1
    capsys.readouterr()
    # The distance reaches the run report too.
    run_report = json.loads((auto_cache / "reports" / "latest.json").read_text())
    recorded = {r["subject_id"]: r["metrics"]["load"]["form_conflict_mm"]
                for r in run_report["subjects"]}
    assert recorded == pytest.approx(distances)


def test_the_qc_index_page_flags_the_uncertain_subjects(auto_cache):
    page = (auto_cache / "qc" / "index.html").read_text()
    rows = {sid: next(line for line in page.split("<tr ") if f'data-subject="{sid}"' in line)
            for sid in ("sub-01", "sub-02", "sub-03")}
    assert "header conflict: qform and sform" in rows["sub-01"]
    assert "header conflict: qform and sform" in rows["sub-03"]
    assert "header conflict" not in rows["sub-02"]
    assert "2 with header conflicts" in page


def test_the_manifest_column_reads_the_sform_and_makes_another_entry(
        cohort, auto_cache, tmp_path):
    root, forms = cohort
    cache = tmp_path / "cache"
    result = _run(root, "chosen.csv", "auto.yaml", cache)
    assert all(r.status == "cached" for r in result.results)
    chosen, auto = _entries(cache), _entries(auto_cache)
    for sid in ("sub-01", "sub-03"):
        key, entry = chosen[sid]
        np.testing.assert_allclose(entry["affine"], forms[sid][1], atol=1e-6)  # the sform
        meta, load = _load_metrics(cache, key)
        assert meta["header"] == "sform" and load["affine_source"] == "sform"
        assert key != auto[sid][0]  # another geometry, another entry
        # to-native (and QC made from the cache) read the scan again with that form.
        grid = native_grid(_index_entry(cache, key))
        np.testing.assert_allclose(grid.affine, forms[sid][1], atol=1e-6)
        auto_grid = native_grid(_index_entry(auto_cache, auto[sid][0]))
        np.testing.assert_allclose(auto_grid.affine, forms[sid][0], atol=1e-6)
    assert chosen["sub-02"][0] == auto["sub-02"][0]  # no choice: the same key as before
    assert not [f for f in chk.check_cache(cache).findings if f.code == "header-conflict"]


def test_the_pipeline_option_reads_every_scan_with_its_form(cohort, auto_cache, tmp_path):
    root, forms = cohort
    cache = tmp_path / "cache"
    result = _run(root, "auto.csv", "sform.yaml", cache)
    assert all(r.status == "cached" for r in result.results)
    assert load_pipeline(root / "sform.yaml").hash != load_pipeline(root / "auto.yaml").hash
    for sid, (key, entry) in _entries(cache).items():
        np.testing.assert_allclose(entry["affine"], forms[sid][1], atol=1e-6)
        assert _load_metrics(cache, key)[1]["header"] == "sform"
    assert not [f for f in chk.check_cache(cache).findings if f.code == "header-conflict"]


def _index_entry(cache, key):
    from mriprep.cache import IndexEntry

    return IndexEntry.from_json(key, Cache(cache).read_index()[key])
