"""Predictions back onto the native scan: the geometry exactly (a tiny hand-made cache, fast),
then the demo's label maps and images through both shipped pipelines and back (slow)."""

from __future__ import annotations

import shutil

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cli import main as cli_main
from mriprep.core.errors import CacheError, InputError
from mriprep.outputs import to_native, to_native_batch

# -- the geometry, on the tiny cache ---------------------------------------------------


def _native_to_cache(tiny, subject) -> tuple[np.ndarray, np.ndarray]:
    """Every native voxel's continuous cache voxel (n, 3) and its template-world point,
    computed here from the definitions: native voxel -> subject world -> template world
    -> cache voxel."""
    ijk = np.indices(subject.native_shape).reshape(3, -1).T.astype(np.float64)
    world = ijk @ subject.native_affine[:3, :3].T + subject.native_affine[:3, 3]
    to_template = np.linalg.inv(subject.template_to_subject)
    template = world @ to_template[:3, :3].T + to_template[:3, 3]
    to_cache = np.linalg.inv(tiny.affine)
    return template @ to_cache[:3, :3].T + to_cache[:3, 3], template


def _inside(coords, shape, margin=0.0):
    return np.all((coords >= margin) & (coords <= np.array(shape) - 1 - margin), axis=1)


@pytest.mark.parametrize("subject_id", ["sub-a", "sub-b"])
def test_a_linear_function_of_the_template_world_comes_back_exactly(tiny_cache, subject_id):
    """Linear interpolation reproduces a linear function: at every native voxel the
    output must be the function of the template point that voxel shows, which holds
    only if the map goes through template_to_subject the right way round (sub-a's is
    rigid, sub-b's an affine with its own sizes and a shear)."""
    sub = tiny_cache.subjects[subject_id]
    ijk = np.indices(tiny_cache.shape).reshape(3, -1).T
    world = ijk @ tiny_cache.affine[:3, :3].T + tiny_cache.affine[:3, 3]
    weights = np.array([0.7, -1.3, 2.1])
    prediction = (world @ weights + 5.0).reshape(tiny_cache.shape).astype(np.float32)
    img = to_native(tiny_cache.root, subject_id, prediction, kind="image")
    out = np.asarray(img.dataobj).reshape(-1)
    coords, template = _native_to_cache(tiny_cache, sub)
    inside = _inside(coords, tiny_cache.shape, 1e-3)
    assert 0.2 < inside.mean() < 0.9  # the grids overlap in part: both cases are tested
    np.testing.assert_allclose(out[inside], template[inside] @ weights + 5.0, atol=2e-3)
    outside = ~_inside(coords, tiny_cache.shape, -1e-3)
    assert outside.any() and (out[outside] == 0).all()
    assert img.get_data_dtype() == np.float32


def test_nearest_labels_read_the_nearest_cache_voxel_and_0_outside(tiny_cache):
    sub = tiny_cache.subjects["sub-a"]
    label = tiny_cache.cache.load_tensor(sub.key, "label")
    out = np.asarray(to_native(tiny_cache.root, "sub-a", label).dataobj).reshape(-1)
    coords, _ = _native_to_cache(tiny_cache, sub)
    inside = _inside(coords, tiny_cache.shape)
    # Away from ties (a coordinate half-way between two voxels rounds either way).
    clear = inside & np.all(np.abs(coords - np.floor(coords) - 0.5) > 1e-3, axis=1)
    nearest = np.rint(coords[clear]).astype(int)
    np.testing.assert_array_equal(out[clear], label[tuple(nearest.T)])
    assert (out[~inside] == 0).all()


def test_the_output_has_the_native_scans_geometry(tiny_cache):
    sub = tiny_cache.subjects["sub-a"]
    native = nib.load(sub.native)
    img = to_native(tiny_cache.root, "sub-a", tiny_cache.cache.load_tensor(sub.key, "label"),
                    interpolation="per-label")
    assert img.shape == native.shape and img.get_data_dtype() == np.int16
    for form in ("qform", "sform"):
        assert int(img.header[f"{form}_code"]) == int(native.header[f"{form}_code"])
        np.testing.assert_allclose(getattr(img.header, f"get_{form}")(),
                                   getattr(native.header, f"get_{form}")(), atol=1e-6)
    assert set(np.unique(np.asarray(img.dataobj))) <= {0, 1, 2, 3}


def test_a_batch_maps_each_prediction_onto_its_own_subject(tiny_cache):
    torch = pytest.importorskip("torch")
    cache = tiny_cache.cache
    labels = [cache.load_tensor(s.key, "label") for s in tiny_cache.subjects.values()]
    batch = torch.from_numpy(np.stack(labels)[:, None].astype(np.int64))  # [B, 1, X, Y, Z]
    images = to_native_batch(cache, list(tiny_cache.subjects), batch, ["", ""])
    for img, (sid, sub), label in zip(images, tiny_cache.subjects.items(), labels):
        assert img.shape == sub.native_shape
        single = to_native(cache, sid, label)
        np.testing.assert_array_equal(np.asarray(img.dataobj), np.asarray(single.dataobj))
    # One subject for several predictions.
    two = to_native_batch(cache, "sub-b", np.stack([labels[1], labels[1]]))
    assert [i.shape for i in two] == [tiny_cache.subjects["sub-b"].native_shape] * 2


def test_a_prediction_of_the_wrong_shape_names_both_shapes(tiny_cache):
    with pytest.raises(InputError) as info:
        to_native(tiny_cache.root, "sub-a", np.zeros((20, 22, 17), np.int16))
    message = str(info.value)
    assert "(20, 22, 17)" in message and str(tiny_cache.shape) in message
    with pytest.raises(InputError, match="2 prediction"):
        to_native_batch(tiny_cache.root, ["sub-a", "sub-b", "sub-a"],
                        np.zeros((2, *tiny_cache.shape), np.int16))


def test_a_nifti_off_the_cache_grid_names_both_affines(tiny_cache):
    moved = tiny_cache.affine.copy()
    moved[:3, 3] += 3.0
    img = nib.Nifti1Image(np.zeros(tiny_cache.shape, np.int16), moved)
    with pytest.raises(InputError) as info:
        to_native(tiny_cache.root, "sub-a", img)
    message = str(info.value)
    assert "[-1.5, 0, 0, 17]" in message and "[-1.5, 0, 0, 14]" in message
    # On the grid it passes.
    on_grid = nib.Nifti1Image(np.zeros(tiny_cache.shape, np.int16), tiny_cache.affine)
    assert to_native(tiny_cache.root, "sub-a", on_grid).shape == (24, 28, 16)


def test_interpolations_and_values_a_kind_cannot_take_are_refused(tiny_cache):
    zeros = np.zeros(tiny_cache.shape, np.float32)
    with pytest.raises(InputError, match="per-label"):
        to_native(tiny_cache.root, "sub-a", zeros.astype(np.int16), interpolation="linear")
    with pytest.raises(InputError, match="per-label is for label maps"):
        to_native(tiny_cache.root, "sub-a", zeros, kind="image", interpolation="per-label")
    with pytest.raises(InputError, match="non-integer values"):
        to_native(tiny_cache.root, "sub-a", zeros + 0.5)
    with pytest.raises(InputError, match="NaN"):
        to_native(tiny_cache.root, "sub-a", zeros + np.nan, kind="image")


def test_unknown_subjects_and_missing_or_changed_scans_are_named(tiny_cache, tmp_path):
    label = np.zeros(tiny_cache.shape, np.int16)
    with pytest.raises(CacheError) as info:
        to_native(tiny_cache.root, "sub-c", label)
    assert "'sub-c' is not in cache" in str(info.value) and "sub-a, sub-b" in str(info.value)
    gone = tmp_path / "gone.nii.gz"
    with pytest.raises(InputError, match=f"{gone} .* does not exist"):
        to_native(tiny_cache.root, "sub-a", label, native_path=gone)
    other = tmp_path / "other.nii.gz"
    shutil.copyfile(tiny_cache.subjects["sub-b"].native, other)
    with pytest.raises(InputError, match="is not the scan sub-a .* was cached from"):
        to_native(tiny_cache.root, "sub-a", label, native_path=other)
    moved = tmp_path / "moved.nii.gz"
    shutil.copyfile(tiny_cache.subjects["sub-a"].native, moved)
    assert to_native(tiny_cache.root, "sub-a", label, native_path=moved).shape == (24, 28, 16)


def test_the_cli_writes_the_native_image(tiny_cache, tmp_path, capsys):
    sub = tiny_cache.subjects["sub-b"]
    prediction = tmp_path / "pred.npy"
    np.save(prediction, np.asarray(tiny_cache.cache.load_tensor(sub.key, "label")))
    out = tmp_path / "seg.nii.gz"
    argv = ["to-native", str(tiny_cache.root), "sub-b", str(prediction), "-o", str(out)]
    assert cli_main(argv) == 0
    img = nib.load(out)
    assert img.shape == sub.native_shape and np.allclose(img.affine, sub.native_affine)
    assert cli_main(argv) == 2  # OUT exists
    assert "--force" in capsys.readouterr().err
    assert cli_main(argv + ["--force", "--interpolation", "per-label"]) == 0
    np.save(prediction, np.zeros((3, 3, 3), np.int16))
    assert cli_main(argv + ["--force"]) == 2
    err = capsys.readouterr().err
    assert "(3, 3, 3)" in err and str(tiny_cache.shape) in err and str(prediction) in err
    mgz = tmp_path / "image.mgz"
    np.save(prediction, np.asarray(tiny_cache.cache.load_tensor(sub.key, "image")))
    assert cli_main(["to-native", str(tiny_cache.root), "sub-b", str(prediction), "-o",
                     str(mgz), "--kind", "image"]) == 0
    assert nib.load(mgz).shape == sub.native_shape


def test_the_cli_writes_a_networks_classes_as_freesurfer_labels(tiny_cache, tmp_path,
                                                                  capsys):
    """``--classes dkt``: classes 0..78 of FastSurfer's DKT table come back as its
    FreeSurfer numbers, voxel for voxel where plain to-native puts the classes."""
    from mriprep.training.labels import dkt_table

    table = dkt_table()
    rng = np.random.default_rng(4)
    classes = rng.integers(0, table.num_classes("axial"), tiny_cache.shape).astype(np.int16)
    prediction = tmp_path / "classes.npy"
    np.save(prediction, classes)
    plain, mapped = tmp_path / "plain.nii.gz", tmp_path / "aparc.nii.gz"
    base = ["to-native", str(tiny_cache.root), "sub-a", str(prediction)]
    assert cli_main(base + ["-o", str(plain)]) == 0
    assert cli_main(base + ["-o", str(mapped), "--classes", "dkt"]) == 0
    plain_data = np.asarray(nib.load(plain).dataobj)
    mapped_data = np.asarray(nib.load(mapped).dataobj)
    inside = plain_data != 0  # class 0 and the outside both stay 0 (Unknown)
    np.testing.assert_array_equal(mapped_data, table.class_ids("axial")[plain_data])
    assert inside.any() and mapped_data.max() > 1000  # cortical parcels: ctx-lh-*
    np.save(prediction, np.full(tiny_cache.shape, 79, np.int16))  # one class too many
    assert cli_main(base + ["-o", str(mapped), "--classes", "dkt", "--force"]) == 2
    err = capsys.readouterr().err
    assert "0..78" in err and "'dkt'" in err and "--view" in err
    assert cli_main(base + ["-o", str(mapped), "--classes", "dkt", "--kind", "image",
                            "--force"]) == 2


def test_the_cli_maps_classes_back_through_the_table_an_export_recorded(tiny_cache, tmp_path,
                                                                         capsys):
    """``--classes FILE.hdf5``: the table and view recorded in a FastSurfer export
    (here sagittal, cortex split) map classes back; a recorded table edited after export
    no longer matches its hash and is refused, as is a --view the file does not hold."""
    h5py = pytest.importorskip("h5py")
    from mriprep.outputs.fastsurfer_hdf5 import HDF5Options, _write_attributes
    from mriprep.training.labels import dkt_table

    table = dkt_table(cortex="split")
    exported = tmp_path / "train_sagittal.hdf5"
    with h5py.File(exported, "w") as hf:
        _write_attributes(hf, table, HDF5Options(view="sagittal"))
    rng = np.random.default_rng(5)
    classes = rng.integers(0, table.num_classes("sagittal"), tiny_cache.shape).astype(np.int16)
    prediction = tmp_path / "classes.npy"
    np.save(prediction, classes)
    plain, mapped = tmp_path / "plain.nii.gz", tmp_path / "aparc.nii.gz"
    base = ["to-native", str(tiny_cache.root), "sub-a", str(prediction)]
    assert cli_main(base + ["-o", str(plain)]) == 0
    assert cli_main(base + ["-o", str(mapped), "--classes", str(exported)]) == 0
    plain_data = np.asarray(nib.load(plain).dataobj)
    np.testing.assert_array_equal(np.asarray(nib.load(mapped).dataobj),
                                  table.class_ids("sagittal")[plain_data])
    # the view came from the file: axial's list would have given other numbers
    assert (table.class_ids("axial")[plain_data] != table.class_ids("sagittal")[plain_data]).any()

    assert cli_main(base + ["-o", str(mapped), "--classes", str(exported), "--view",
                            "axial", "--force"]) == 2
    assert "holds the sagittal view" in capsys.readouterr().err
    with h5py.File(exported, "r+") as hf:
        hf.attrs["label_table"] = hf.attrs["label_table"].replace('"split"', '"fuse"')
    assert cli_main(base + ["-o", str(mapped), "--classes", str(exported), "--force"]) == 2
    err = capsys.readouterr().err
    assert "SHA-256" in err and str(exported) in err


# -- the demo cohort: labels and images there and back ---------------------------------

# Measured Dice per label (CSF, GM, WM) of native label map -> cache -> to_native, over
# the native voxels that map inside the cache grid onto valid voxels. The floors sit
# about 0.01 under the measured values. A nearest round trip through a grid turned
# against the scan's lands on a neighbouring voxel for some voxels: thin CSF suffers
# most. Per-label smooths the boundaries, which loses thin CSF when the native voxels
# are as small as the cache's, and helps where they are 5 mm thick.
DICE_FLOORS = {
    # (pipeline, subject): {interpolation: (CSF, GM, WM) floors}; measured in comments
    ("t1w_mni_rigid", "sub-01"): {"nearest": (0.95, 0.98, 0.98),      # 0.963 0.991 0.991
                                  "per-label": (0.90, 0.97, 0.97)},   # 0.911 0.980 0.980
    ("t1w_mni_rigid", "sub-06"): {"nearest": (0.92, 0.97, 0.97),      # 0.931 0.983 0.983
                                  "per-label": (0.935, 0.98, 0.98)},  # 0.945 0.988 0.989
    ("conform_1mm", "sub-01"): {"nearest": (1.0, 1.0, 1.0),           # exact copies
                                "per-label": (1.0, 1.0, 1.0)},
    ("conform_1mm", "sub-06"): {"nearest": (0.915, 0.97, 0.97),       # 0.927 0.982 0.983
                                "per-label": (0.93, 0.975, 0.975)},   # 0.939 0.986 0.987
}
IMAGE_CORRELATION_FLOOR = 0.99  # measured 0.9955 - 1.0 (see test_demo_image...)


def _cache_of(name, demo_cache, conform_cache) -> Cache:
    return Cache(demo_cache.path) if name == "t1w_mni_rigid" else conform_cache


def _compared(cache: Cache, subject_id: str):
    """The entry, the native voxels to compare (inside the cache grid, on a valid cache
    voxel) and the native label map."""
    [entry] = [e for e in cache.entries() if e.subject_id == subject_id and not e.session_id]
    valid = cache.load_tensor(entry.key, "valid")
    compared = np.asarray(to_native(cache, subject_id, valid, "").dataobj) > 0
    native = np.asarray(nib.load(entry.inputs["label"]["path"]).dataobj)
    return entry, compared, native


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * np.count_nonzero(a & b) / (np.count_nonzero(a) + np.count_nonzero(b))


@pytest.mark.slow
@pytest.mark.parametrize("pipeline, subject_id", sorted(DICE_FLOORS))
def test_demo_labels_come_back_onto_the_native_label_map(pipeline, subject_id, demo_cache,
                                                        conform_cache):
    cache = _cache_of(pipeline, demo_cache, conform_cache)
    entry, compared, native = _compared(cache, subject_id)
    assert compared.mean() > 0.5  # most of the scan lies inside the cache grid
    label = cache.load_tensor(entry.key, "label")
    for interpolation, floors in DICE_FLOORS[(pipeline, subject_id)].items():
        back = np.asarray(to_native(cache, subject_id, label, "",
                                    interpolation=interpolation).dataobj)
        dice = [_dice((back == v) & compared, (native == v) & compared) for v in (1, 2, 3)]
        print(f"{pipeline} {subject_id} {interpolation}: Dice CSF/GM/WM "
              + " ".join(f"{d:.4f}" for d in dice))
        assert all(d >= f for d, f in zip(dice, floors)), (interpolation, dice, floors)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline, subject_id", sorted(DICE_FLOORS))
def test_demo_image_on_the_native_grid_correlates_with_the_native_scan(
        pipeline, subject_id, demo_cache, conform_cache):
    """The cached image is the scan normalised (z-score, or 0-255): linear in its
    intensities, so back on the native grid it correlates with the scan inside the
    brain."""
    cache = _cache_of(pipeline, demo_cache, conform_cache)
    entry, compared, native = _compared(cache, subject_id)
    image = cache.load_tensor(entry.key, "image")
    back = np.asarray(to_native(cache, subject_id, image, "", kind="image").dataobj)
    scan = np.asarray(nib.load(entry.inputs["image"]["path"]).dataobj, dtype=np.float32)
    brain = compared & (native > 0) & np.isfinite(scan)
    r = float(np.corrcoef(back[brain], scan[brain])[0, 1])
    print(f"{pipeline} {subject_id}: image correlation {r:.4f}")
    assert r >= IMAGE_CORRELATION_FLOOR


@pytest.mark.slow
def test_a_volume_batch_of_the_dataset_goes_back_with_its_ids(demo_cache):
    from mriprep.training import MRIDataset, make_dataloader

    dataset = MRIDataset(demo_cache.path, split="val", mode="volume")
    batch = next(iter(make_dataloader(dataset, batch_size=2, num_workers=0)))
    images = to_native_batch(demo_cache.path, batch["subject_id"], batch["label"],
                             batch["session_id"])
    cache = Cache(demo_cache.path)
    for img, sid, ses in zip(images, batch["subject_id"], batch["session_id"]):
        [entry] = [e for e in cache.entries() if (e.subject_id, e.session_id) == (sid, ses)]
        native = nib.load(entry.inputs["image"]["path"])
        assert img.shape == native.shape and np.allclose(img.affine, native.affine)
        single = to_native(cache, sid, cache.load_tensor(entry.key, "label"), ses)
        np.testing.assert_array_equal(np.asarray(img.dataobj), np.asarray(single.dataobj))
