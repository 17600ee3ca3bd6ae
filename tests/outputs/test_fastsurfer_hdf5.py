"""``mriprep export --format fastsurfer-hdf5`` (issue 29): layout, contents against the
referee, checksums first, failed subjects named, no empty file, and FastSurfer's own
reader.

FastSurfer's ``MultiScaleDataset`` is run on the export when ``MRIPREP_FASTSURFER`` names
a FastSurfer checkout whose imports resolve (its ``FastSurferCNN`` needs h5py, pandas,
torch, yacs and scikit-image); otherwise that test skips and says so.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cli import main
from mriprep.demo.fastsurfer_referee import referee_subject
from mriprep.training.labels import dkt_table
from tests.training.fastsurfer_cache import SIZE, shared_cache, subject, write_cache

# One xdist worker runs the whole module (make test's --dist loadgroup), so that what it
# builds once per process (module fixtures, cached scans) is built once per run.
pytestmark = pytest.mark.xdist_group("fastsurfer_hdf5")

h5py = pytest.importorskip("h5py", reason="h5py missing: pip install 'mriprep[fastsurfer]'")
DKT = str(resources.files("mriprep.training.labels") / "fastsurfer_dkt.tsv")


@pytest.fixture(scope="module")
def derived(tmp_path_factory) -> list[str]:
    """--derived-dir away from the shared cache, which the tests only read."""
    return ["--derived-dir", str(tmp_path_factory.mktemp("derived"))]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, derived) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hdf5")
    files = {}
    for view in ("axial", "coronal", "sagittal"):
        files[view] = out / f"{view}.hdf5"
        assert main(["export", str(shared_cache()), "-o", str(files[view]), "--format",
                     "fastsurfer-hdf5", "--view", view, *derived,
                     "--workers", "2" if view == "axial" else "1"]) == 0
    return files


@pytest.mark.parametrize("view", ["axial", "coronal", "sagittal"])
def test_layout_and_contents_equal_the_referee(exports, view):
    with h5py.File(exports[view], "r") as hf:
        assert list(hf) == ["72"]
        g = hf["72"]
        orig, aseg, weight = g["orig_dataset"][:], g["aseg_dataset"][:], g["weight_dataset"][:]
        zoom, subjects = g["zoom_dataset"][:], [s.decode() for s in g["subject"][:]]
        which = g["slice_subject"][:]
    assert subjects == ["sub-00", "sub-01", "sub-02"]
    assert orig.dtype == np.uint8 and orig.shape[1:] == (72, 72, 7)
    assert aseg.dtype == np.uint8 and aseg.max() < dkt_table().num_classes(view)
    assert np.isfinite(weight).all() and (weight >= 0).all()
    for i, name in enumerate(subjects):
        person = subject(i)
        ref = referee_subject(person["image"], person["label"], (1.0, 1.0, 1.0), DKT, view,
                              weights_by="class")  # the people lack classes: by class
        mine = which == i
        np.testing.assert_array_equal(orig[mine], ref[0])
        np.testing.assert_array_equal(aseg[mine], ref[1])
        np.testing.assert_allclose(weight[mine], ref[2], rtol=1e-12, atol=0)
        np.testing.assert_array_equal(zoom[mine], np.broadcast_to(ref[3], (mine.sum(), 2)))


def _damage_one(root: Path) -> None:
    cache = Cache(root)
    entry = cache.entries()[1]
    path = cache.entry_dir(entry.key) / entry.files["image"].file
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_and_unmappable_subjects_are_named_and_exit_1(tmp_path, capsys):
    def edit(i, tensors):
        if i == 2:
            tensors["label"][30:33, 30:33, 30:33] = 5001  # not a FreeSurfer value
    root = write_cache(tmp_path / "c", count=3, edit=edit)
    _damage_one(root)
    out = tmp_path / "x.hdf5"
    code = main(["export", str(root), "-o", str(out), "--format", "fastsurfer-hdf5",
                 "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert "sub-01" in err and "checksum" in err
    assert "sub-02" in err and "[5001]" in err and "unknown background" in err
    with h5py.File(out, "r") as hf:
        assert [s.decode() for s in hf["72"]["subject"][:]] == ["sub-00"]
    # --unknown background takes sub-02 back and counts what it mapped.
    code = main(["export", str(root), "-o", str(out), "--format", "fastsurfer-hdf5",
                 "--unknown", "background", "--workers", "1"])
    assert code == 1 and "27 voxels of values not in the table" in capsys.readouterr().out


def test_no_slice_means_no_file_and_exit_1(tmp_path, capsys):
    def edit(i, tensors):
        tensors["label"][:] = 5001
    root = write_cache(tmp_path / "c", count=2, edit=edit)
    out = tmp_path / "empty.hdf5"
    assert main(["export", str(root), "-o", str(out), "--format", "fastsurfer-hdf5"]) == 1
    err = capsys.readouterr().err
    assert "sub-00" in err and "sub-01" in err and "was not written" in err
    assert not out.exists() and not list(tmp_path.glob("empty.hdf5*"))


def test_a_class_no_subject_holds_writes_nothing_unless_allowed(tmp_path, capsys):
    def edit(i, tensors):
        tensors["label"][tensors["label"] == 77] = 2
    root = write_cache(tmp_path / "c", count=2, edit=edit)
    out = tmp_path / "absent.hdf5"
    args = ["export", str(root), "-o", str(out), "--format", "fastsurfer-hdf5"]
    assert main(args) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "WM-hypointensities" in err and "--absent-classes allow" in err
    assert main([*args, "--absent-classes", "allow"]) == 0 and out.exists()
    assert "warning:" in capsys.readouterr().err  # accepted, still named


def test_unknown_region_name_is_a_usage_error(tmp_path, capsys, derived):
    code = main(["export", str(shared_cache()), "-o", str(tmp_path / "r.hdf5"), "--format",
                 "fastsurfer-hdf5", "--region-weight", "Left-Cerebelum-Cortex=1.3",
                 *derived])
    assert code == 2 and "Left-Cerebelum-Cortex" in capsys.readouterr().err


def test_region_weight_scales_cerebellum(tmp_path, exports, derived):
    out = tmp_path / "r.hdf5"
    assert main(["export", str(shared_cache()), "-o", str(out), "--format",
                 "fastsurfer-hdf5", "--region-weight", "Left-Cerebellum-Cortex=1.3",
                 "--workers", "1", *derived]) == 0
    cls = dkt_table().class_of_name("Left-Cerebellum-Cortex", "coronal")
    with h5py.File(out, "r") as a, h5py.File(exports["coronal"], "r") as b:
        aseg, wa, wb = b["72"]["aseg_dataset"][:], a["72"]["weight_dataset"][:], \
            b["72"]["weight_dataset"][:]
    np.testing.assert_allclose(wa[aseg == cls], 1.3 * wb[aseg == cls])
    np.testing.assert_array_equal(wa[aseg != cls], wb[aseg != cls])


def test_missing_h5py_names_the_fix(tmp_path, monkeypatch, capsys, derived):
    monkeypatch.setitem(sys.modules, "h5py", None)
    code = main(["export", str(shared_cache()), "-o", str(tmp_path / "a.hdf5"), "--format",
                 "fastsurfer-hdf5", *derived])
    assert code == 2 and "mriprep[fastsurfer]" in capsys.readouterr().err


def _fastsurfer(monkeypatch):
    checkout = os.environ.get("MRIPREP_FASTSURFER")
    if not checkout:
        pytest.skip("set MRIPREP_FASTSURFER to a FastSurfer checkout (with yacs and "
                    "scikit-image importable) to run FastSurfer's own code on the export")
    monkeypatch.syspath_prepend(checkout)
    return pytest.importorskip("yacs.config")


def test_fastsurfers_own_multiscale_dataset_reads_it(exports, monkeypatch):
    yacs = _fastsurfer(monkeypatch)
    from FastSurferCNN.data_loader.dataset import MultiScaleDataset

    for view, path in exports.items():
        cfg = yacs.CfgNode({"DATA": {"PADDED_SIZE": 80, "SIZES": [72], "PLANE": view},
                            "MODEL": {"BASE_RES": 1.0}})
        ds = MultiScaleDataset(str(path), cfg, transforms=None)
        with h5py.File(path, "r") as hf:
            g = hf["72"]
            n, first, w0 = len(g["orig_dataset"]), g["aseg_dataset"][0], g["weight_dataset"][0]
        assert len(ds) == n and [s.decode() for s in ds.get_subject_names()] == \
            ["sub-00", "sub-01", "sub-02"]
        item = ds[n - 1]
        assert item["image"].shape == (7, 80, 80, 1) and item["label"].shape == (1, 80, 80, 1)
        assert item["scale_factor"].tolist() == [1.0, 1.0]
        first_item = ds[0]
        np.testing.assert_array_equal(first_item["label"][0, :72, :72, 0], first)
        np.testing.assert_array_equal(first_item["weight"][0, :72, :72, 0], w0)


@pytest.mark.parametrize("view", ["axial", "coronal", "sagittal"])
def test_equals_fastsurfers_own_functions_where_they_work(monkeypatch, view):
    """FastSurfer's create_weight_mask is right only when every class is present: add a
    block of each missing value, then its functions and ours must agree exactly."""
    _fastsurfer(monkeypatch)
    from FastSurferCNN.data_loader import data_utils as du
    from mriprep.training.labels.subject import derive, slices_of

    person = subject(0)
    table = dkt_table()
    missing = sorted(set(table.ids.tolist()) - set(np.unique(person["label"]).tolist()))
    for i, value in enumerate(missing):
        person["label"][2 + 2 * (i % 30), 2 + 2 * (i // 30), 60:62] = value
    lut = du.read_classes_from_lut(DKT)
    labels, labels_sag = du.get_labels_from_lut(lut, ("Left-", "ctx-rh"))
    pairs = du.unify_lateralized_labels(lut, ("Left-", "Right-"))
    full, sag = du.map_aparc_aseg2label(person["label"].astype(np.int16).copy(), labels,
                                        labels_sag, pairs, None, processing="aparc")
    mapped = sag if view == "sagittal" else full
    weights = du.create_weight_mask(mapped, max_weight=5, max_edge_weight=5,
                                    ctx_thresh=19 if view == "sagittal" else 33,
                                    max_hires_weight=None, cortex_mask=False, gradient=True)
    vols = [person["image"], mapped, weights]
    if view != "coronal":
        move = du.transform_sagittal if view == "sagittal" else du.transform_axial
        vols = [move(v) for v in vols]
    thick = du.get_thick_slices(vols[0], 3)
    orig, aseg, w = du.filter_blank_slices_thick(thick, vols[1], vols[2], threshold=50)
    got = slices_of(person["image"], derive(person["label"], table, view), [1, 1, 1], view)
    np.testing.assert_array_equal(got.classes, np.transpose(aseg, (2, 0, 1)))
    np.testing.assert_array_equal(got.orig, np.transpose(orig, (2, 0, 1, 3)))
    np.testing.assert_allclose(got.weights, np.transpose(w, (2, 0, 1)), rtol=1e-12, atol=0)


@pytest.fixture(scope="module")
def mixed_export(tmp_path_factory, derived) -> Path:
    """A cohort of mixed resolutions, as ``conform_min`` caches it: two subjects at 1 mm
    on 72^3, two at 0.8 mm on 90^3."""
    root = write_cache(tmp_path_factory.mktemp("mixed") / "c", count=4,
                       spacing=lambda i: 1.0 if i < 2 else 0.8)
    path = tmp_path_factory.mktemp("mixed-hdf5") / "coronal.hdf5"
    assert main(["export", str(root), "-o", str(path), "--format", "fastsurfer-hdf5",
                 "--view", "coronal", *derived]) == 0
    return path


FINE = int(round(SIZE / 0.8))


def test_a_mixed_resolution_cohort_gets_one_group_per_size(mixed_export):
    with h5py.File(mixed_export, "r") as hf:
        assert sorted(hf, key=int) == [str(SIZE), str(FINE)]
        for size, zoom, names in ((SIZE, 1.0, ["sub-00", "sub-01"]),
                                  (FINE, 0.8, ["sub-02", "sub-03"])):
            g = hf[str(size)]
            assert [s.decode() for s in g["subject"][:]] == names
            assert g["orig_dataset"].shape[1:] == (size, size, 7)
            np.testing.assert_allclose(g["zoom_dataset"][:], zoom)


def test_fastsurfers_multiscale_dataset_reads_every_size_padded(mixed_export, monkeypatch):
    yacs = _fastsurfer(monkeypatch)
    from FastSurferCNN.data_loader.dataset import MultiScaleDataset

    padded = 96
    cfg = yacs.CfgNode({"DATA": {"PADDED_SIZE": padded, "SIZES": [SIZE, FINE],
                                 "PLANE": "coronal"}, "MODEL": {"BASE_RES": 1.0}})
    ds = MultiScaleDataset(str(mixed_export), cfg, transforms=None)
    with h5py.File(mixed_export, "r") as hf:
        counts = [len(hf[str(size)]["orig_dataset"]) for size in (SIZE, FINE)]
        last_fine = hf[str(FINE)]["aseg_dataset"][-1]
    assert len(ds) == sum(counts)
    coarse, fine = ds[0], ds[len(ds) - 1]
    for item in (coarse, fine):
        assert item["image"].shape == (7, padded, padded, 1)
        assert item["label"].shape == (1, padded, padded, 1)
    np.testing.assert_allclose(coarse["scale_factor"], [1.0, 1.0])
    np.testing.assert_allclose(fine["scale_factor"], [1.25, 1.25])
    np.testing.assert_array_equal(fine["label"][0, :FINE, :FINE, 0], last_fine)
    assert not fine["label"][0, FINE:, :, 0].any()  # padded with background
