"""The population's variations do what they say, on small head phantoms built here.

A phantom is an ellipsoidal head in MNI-like coordinates (anterior +y, superior +z):
white matter inside grey matter inside a CSF shell (labels 3, 2, 1), a dark skull and
bright scalp, with Rician noise, on a 2 mm grid, sampled analytically in any pose.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
from nibabel.affines import apply_affine
from scipy import ndimage

from mriprep.demo import population as pop
from mriprep.demo.anatomy import Anatomy
from mriprep.demo.calibration import calibration_cases, person
from mriprep.demo.real_scans import real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire
from mriprep.stages.registration.geometry import rigid_matrix

BRAIN_CENTRE = np.array([0.0, -18.0, 15.0])
# Semi-axes (mm) of each surface: WM, GM, CSF (the brain's outside), skull, scalp.
SURFACES = {"wm": (40, 55, 35), "gm": (58, 75, 55), "csf": (62, 79, 59),
            "skull": (68, 85, 65), "scalp": (76, 93, 73)}
LEVELS = {"wm": 1000.0, "gm": 650.0, "csf": 250.0, "skull": 80.0, "scalp": 850.0}


def _inside(points, surface):
    return np.sum(((points - BRAIN_CENTRE) / SURFACES[surface]) ** 2, axis=-1) <= 1.0


def phantom_scan(pose=None, spacing=2.0, noise=15.0, seed=0) -> Scan:
    """The phantom moved by ``pose`` (anatomy mm -> scan mm), on an axial grid."""
    pose = np.eye(4) if pose is None else pose
    shape = (96, 116, 100)
    affine = np.diag([spacing] * 3 + [1.0])
    affine[:3, 3] = np.array([0.0, -18.0, 15.0]) - spacing * (np.asarray(shape) - 1) / 2
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    anatomy = apply_affine(np.linalg.inv(pose) @ affine, ijk)
    data = np.zeros(shape, np.float32)
    labels = np.zeros(shape, np.int16)
    for surface, label in (("scalp", 0), ("skull", 0), ("csf", 1), ("gm", 2), ("wm", 3)):
        inside = _inside(anatomy, surface)
        data[inside] = LEVELS[surface]
        labels[inside] = label
    rng = np.random.default_rng(seed)
    data = np.hypot(data + rng.normal(0, noise, shape), rng.normal(0, noise, shape))
    return Scan(data.astype(np.float32), labels, affine, pose, np.asarray(pose))


@pytest.fixture(scope="module")
def scan() -> Scan:
    return phantom_scan()


@pytest.fixture(scope="module")
def turned() -> Scan:
    """The phantom in a pose of 12 degrees and a few mm, as the calibration set draws."""
    return phantom_scan(rigid_matrix((12.0, -8.0, 5.0), (6.0, -9.0, 4.0)), seed=1)


def _anatomy_points(scan: Scan) -> np.ndarray:
    """Anatomy-space mm of every voxel, shape (*scan.shape, 3)."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in scan.data.shape], indexing="ij"),
                   axis=-1)
    return apply_affine(np.linalg.inv(scan.pose) @ scan.affine, ijk)


def _same_geometry(a: Scan, b: Scan) -> None:
    assert a.data.shape == b.data.shape and a.data.dtype == np.float32
    np.testing.assert_array_equal(a.affine, b.affine)
    np.testing.assert_array_equal(a.pose, b.pose)
    np.testing.assert_array_equal(a.labels, b.labels)


# --- scaled_anatomy ---------------------------------------------------------------------

def _phantom_anatomy() -> Anatomy:
    base = phantom_scan(noise=0.0)
    return Anatomy(base.data / 1000.0, base.labels.astype(np.uint8), base.affine,
                   np.eye(4), "phantom")


def test_scaled_anatomy_is_a_smaller_or_larger_head_on_the_same_voxels():
    anatomy = _phantom_anatomy()
    small = pop.scaled_anatomy(anatomy, 0.8)
    assert small.image is anatomy.image and small.labels is anatomy.labels
    assert small.name == "phantom@0.8" and small.details["scaled_by"] == [0.8] * 3
    # The grid's centre stays where it was; voxels become 0.8 times as large.
    centre = (np.asarray(anatomy.image.shape) - 1) / 2
    np.testing.assert_allclose(apply_affine(small.affine, centre),
                               apply_affine(anatomy.affine, centre), atol=1e-9)
    np.testing.assert_allclose(small.affine[:3, :3], 0.8 * anatomy.affine[:3, :3])
    # Not rigid any more: no rigid truth, but the map is kept for whoever needs it.
    assert small.template_to_anatomy is None
    scaling = np.asarray(small.details["scaling"])
    np.testing.assert_allclose(scaling @ anatomy.affine, small.affine, atol=1e-9)
    with pytest.raises(ValueError):
        pop.scaled_anatomy(anatomy, 0.0)


def test_a_scaled_anatomy_is_scanned_at_its_new_size():
    anatomy = _phantom_anatomy()
    plain = Acquisition((2.0, 2.0, 2.0), noise=0.0, bias=0.0)
    rng = np.random.default_rng(0)
    before = acquire(anatomy, np.eye(4), plain, rng)
    brain = np.count_nonzero(before.labels == 3)
    for scale in (0.82, 1.18, (0.85, 1.0, 1.1)):
        after = acquire(pop.scaled_anatomy(anatomy, scale), np.eye(4), plain, rng)
        assert after.template_to_subject is None
        expected = float(np.prod(np.broadcast_to(scale, (3,))))
        assert np.count_nonzero(after.labels == 3) / brain == pytest.approx(expected,
                                                                            rel=0.05)
    # Per axis: the extent of white matter along each axis follows its own factor.
    after = acquire(pop.scaled_anatomy(anatomy, (0.8, 1.0, 1.2)), np.eye(4), plain, rng)
    extents = [np.ptp(np.nonzero(s.labels == 3)[a]) for s in (before, after)
               for a in range(3)]
    ratios = np.asarray(extents[3:]) / np.asarray(extents[:3])
    np.testing.assert_allclose(ratios, (0.8, 1.0, 1.2), atol=0.05)


# --- with_bias ----------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [2.0, 4.0, 7.0, 10.0])
def test_bias_field_spans_exactly_the_ratio_over_the_head(turned, ratio):
    out = pop.with_bias(turned, ratio, np.random.default_rng(3))
    _same_geometry(out, turned)
    head = pop.head_mask(turned.data)
    field = out.data[head] / turned.data[head]
    assert field.max() / field.min() == pytest.approx(ratio, rel=0.01)
    # Centred in log: the brightest and darkest gains straddle 1.
    assert field.max() == pytest.approx(np.sqrt(ratio), rel=0.01)
    # Smooth: neighbours differ by a few % at most, even at 10x.
    gain = out.data / np.maximum(turned.data, 1e-3)
    step = np.abs(np.diff(np.log(gain[head.nonzero()[0].min():, :, :]), axis=0))
    both = head[head.nonzero()[0].min():][1:] & head[head.nonzero()[0].min():][:-1]
    assert np.percentile(step[both], 99) < np.log(ratio) / 20


def test_bias_field_depends_on_its_generator(scan):
    a = pop.with_bias(scan, 4.0, np.random.default_rng(1)).data
    b = pop.with_bias(scan, 4.0, np.random.default_rng(1)).data
    c = pop.with_bias(scan, 4.0, np.random.default_rng(2)).data
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


# --- skull_stripped -------------------------------------------------------------------------

def test_skull_stripped_keeps_the_brain_and_a_thin_rim_and_zeroes_the_rest(turned):
    out = pop.skull_stripped(turned)
    _same_geometry(out, turned)
    brain = turned.labels > 0
    spacing = np.abs(np.diag(turned.affine)[:3])
    distance = ndimage.distance_transform_edt(~brain, sampling=spacing)
    # The brain and the rim within 2 mm: unchanged, bit for bit.
    np.testing.assert_array_equal(out.data[distance <= 2.0], turned.data[distance <= 2.0])
    # Everything further out: exactly zero, no noise (BET's background).
    assert np.all(out.data[distance > 2.0 + 1e-6] == 0.0)
    # The skull and scalp were there and are gone.
    assert np.count_nonzero(turned.data[distance > 2.5] > 500) > 10_000
    with pytest.raises(ValueError, match="labels"):
        pop.skull_stripped(Scan(turned.data, None, turned.affine, turned.pose, None))


# --- defaced -----------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["scan", "turned"])
def test_defacing_removes_the_face_only_in_the_anatomy_frame(which, request):
    source = request.getfixturevalue(which)
    out = pop.defaced(source)
    _same_geometry(out, source)
    removed = out.data != source.data
    assert np.all(out.data[removed] == 0.0)
    points = _anatomy_points(source)  # anatomy mm: MNI-like whatever the pose
    y, z = points[..., 1], points[..., 2]
    # Everything removed lies further anterior-inferior than any of the brain, above
    # the mask's bottom edge; the head tissue removed is anterior and inferior.
    assert (y - z)[removed].min() > (y - z)[source.labels > 0].max()
    assert np.all(z[removed] > pop.DEFACE_BOTTOM_Z_MM)
    tissue = removed & (source.data > 200)
    assert np.all(y[tissue] > BRAIN_CENTRE[1]) and np.all(z[tissue] < BRAIN_CENTRE[2])
    # Not one brain voxel, and at least 4 mm between the cut and the brain.
    assert not np.any(removed & (source.labels > 0))
    brain = source.labels > 0
    distance = ndimage.distance_transform_edt(~brain, sampling=2.0)
    assert distance[removed].min() >= pop.DEFACE_MARGIN_MM - 2.0  # a voxel's rounding
    # The face is gone: the scalp's anterior-inferior part, the back of the head stays.
    scalp = (source.labels == 0) & (source.data > 500)
    # (the brain reaches y - z = 66 mm, the scalp 85, the cut starts 4 mm past the brain)
    front = (y - z > 76) & scalp
    assert np.count_nonzero(front) > 500 and np.all(removed[front])
    back = scalp & (y < BRAIN_CENTRE[1])
    np.testing.assert_array_equal(out.data[back], source.data[back])


def test_defacing_an_unlabelled_scan_uses_the_mni_plane(scan):
    bare = Scan(scan.data, None, scan.affine, scan.pose, None)
    cut = pop.deface_mask(bare)
    points = _anatomy_points(bare)[cut]
    angle = np.radians(pop.DEFACE_ANGLE_DEG)
    along = np.cos(angle) * points[:, 1] - np.sin(angle) * points[:, 2]
    assert cut.any() and np.all(along > pop.DEFACE_OFFSET_MM)


@pytest.mark.skipif(real_scan("colin27") is None, reason="mricron-data not installed")
def test_defacing_colin27_leaves_its_bet_brain_whole():
    from mriprep.demo.calibration import real_head

    head, brain = real_head("colin27"), real_head("colin27_brain")
    np.testing.assert_array_equal(head.affine, brain.affine)
    scan = Scan(head.image, None, head.affine, np.eye(4), None)
    cut = pop.deface_mask(scan)
    assert not np.any(cut & (brain.image > 0))
    assert np.count_nonzero(cut & (head.image > 0.1 * np.percentile(head.image, 99))) \
        > 20_000  # a face's worth of head (ml)


# --- mp2rage_background -------------------------------------------------------------------

def test_mp2rage_background_is_uniform_noise_up_to_white_matter(scan):
    out = pop.mp2rage_background(scan, np.random.default_rng(0))
    _same_geometry(out, scan)
    head = ndimage.binary_fill_holes(pop.head_mask(scan.data))
    np.testing.assert_array_equal(out.data[head], scan.data[head])
    changed = out.data != scan.data
    assert not np.any(changed & head)
    background = out.data[~ndimage.binary_dilation(head, iterations=2)]
    top = np.percentile(scan.data[head], 99)
    assert background.max() <= top and background.min() >= 0
    # Uniform over [0, top]: a mean of top/2, a quarter of it above 3/4 of top.
    assert background.mean() == pytest.approx(top / 2, rel=0.02)
    assert np.mean(background > 0.75 * top) == pytest.approx(0.25, abs=0.01)
    # Before: dark air (Rician noise of sigma 15).
    assert scan.data[~ndimage.binary_dilation(head, iterations=2)].mean() < 50


# --- ghosted --------------------------------------------------------------------------------

def test_ghosts_are_copies_at_half_and_quarter_of_the_phase_encode_field():
    data = np.zeros((40, 64, 10), np.float32)
    data[18:22, 4:8, 5] = 100.0
    affine = np.diag([1.0, 1.0, 3.0, 1.0])  # axis 1 has the larger field of view
    scan = Scan(data, None, affine, np.eye(4), None)
    out = pop.ghosted(scan, 0.15)
    assert out.data[20, 6 + 32, 5] == pytest.approx(15.0)  # N/2
    assert out.data[20, 6 + 16, 5] == pytest.approx(7.5)  # N/4
    assert out.data[20, (6 - 16) % 64, 5] == pytest.approx(7.5)  # -N/4, wrapped
    assert out.data[20, 6, 5] == pytest.approx(100.0)  # the object itself
    assert out.data.sum() == pytest.approx(data.sum() * 1.3, rel=1e-5)
    assert np.all(out.data[:, :, :5] == 0)  # other slices: nothing
    # Along axis 0 when asked.
    along0 = pop.ghosted(scan, 0.2, axis=0)
    assert along0.data[(20 + 20) % 40, 6, 5] == pytest.approx(20.0)
    assert along0.data[20, 6 + 32, 5] == 0.0


def test_ghosting_a_head_puts_its_signal_into_the_air(scan):
    out = pop.ghosted(scan, 0.15, np.random.default_rng(0))
    _same_geometry(out, scan)
    # The field of view is larger along y (axis 1): the ghosts are shifted along it.
    n = scan.data.shape[1]
    expected = 0.15 * np.roll(scan.data, n // 2, axis=1) + 0.075 * (
        np.roll(scan.data, n // 4, axis=1) + np.roll(scan.data, -(n // 4), axis=1))
    added = out.data - scan.data
    gain = added[expected > 50] / expected[expected > 50]
    assert 0.8 <= gain.min() and gain.max() <= 1.2  # drawn once, within +-20%
    assert np.ptp(gain) < 1e-3
    # The air in front of and behind the head now holds a ghost of it.
    air = ~ndimage.binary_dilation(pop.head_mask(scan.data), iterations=2)
    assert out.data[air].mean() > 2.5 * scan.data[air].mean()


# --- with_lesions ---------------------------------------------------------------------------

def test_lesions_darken_white_matter_only(turned):
    out = pop.with_lesions(turned, np.random.default_rng(0), count=8, radius_mm=(3, 6))
    _same_geometry(out, turned)
    changed = out.data != turned.data
    assert changed.any() and np.all(changed <= (turned.labels == 3))
    assert np.all(out.data <= turned.data)
    ratio = out.data[changed] / turned.data[changed]
    assert ratio.min() == pytest.approx(0.3, abs=0.2) and ratio.min() >= 0.3 - 1e-6
    # Lesion cores fall to the CSF-grey range (0.3-0.5 of white matter).
    cores = changed & (out.data < 0.6 * LEVELS["wm"])
    blobs = ndimage.label(cores)[1]
    assert 1 <= blobs <= 8
    # Each is at least a sphere of 3 mm on a 2 mm grid (a few voxels), at most 6 mm.
    assert 8 * 4 <= np.count_nonzero(cores) <= 8 * (4 / 3 * np.pi * 7**3) / 8


def test_lesions_without_labels_stay_deep_in_the_brightest_tissue(scan):
    bare = Scan(scan.data, None, scan.affine, scan.pose, None)
    out = pop.with_lesions(bare, np.random.default_rng(1), count=4, radius_mm=4.0)
    changed = out.data != bare.data
    assert changed.any() and np.all(changed <= pop.white_matter_mask(bare))
    # The bright scalp (fat) is never hit.
    assert not np.any(changed & (scan.labels == 0))
    with pytest.raises(ValueError, match="deep enough"):
        pop.with_lesions(scan, np.random.default_rng(0), count=1, radius_mm=60.0)


def test_a_bright_ring_has_a_bright_rim_around_a_dark_core_in_white_matter(turned):
    out = pop.with_bright_ring(turned, np.random.default_rng(2))
    _same_geometry(out, turned)
    changed = out.data != turned.data
    assert changed.any() and np.all(changed <= (turned.labels == 3))
    wm = float(np.median(turned.data[turned.labels == 3]))
    assert out.data[changed].max() > 1.4 * wm  # the rim, brighter than white matter
    assert out.data[changed].min() < 0.6 * wm  # the core, darker
    with pytest.raises(ValueError, match="deep enough"):
        pop.with_bright_ring(turned, np.random.default_rng(0), radius_mm=(60.0, 61.0))


def _broken_slices(data: np.ndarray) -> dict[str, list[int]]:
    per_slice = np.moveaxis(data, 2, 0).reshape(data.shape[2], -1)
    return {"nan": [k for k, s in enumerate(per_slice) if np.isnan(s).all()],
            "zero": [k for k, s in enumerate(per_slice) if (s == 0).all()]}


def test_slice_defects_break_the_slices_asked_for_apart_from_each_other(scan):
    out = pop.slice_defects(scan, np.random.default_rng(3), nan=2, zero=3, spike=1,
                            dropout=1)
    _same_geometry(out, scan)
    broken = _broken_slices(out.data)
    assert len(broken["nan"]) == 2 and len(broken["zero"]) == 3
    assert np.ptp(broken["zero"]) == 2  # one slab of consecutive slices
    ratio = [float(np.median(out.data[:, :, k][scan.data[:, :, k] > 100]
                             / scan.data[:, :, k][scan.data[:, :, k] > 100]))
             for k in range(scan.data.shape[2]) if (scan.data[:, :, k] > 100).any()
             and np.isfinite(out.data[:, :, k]).all()]
    assert sorted(round(r, 3) for r in ratio if r != 1.0) == [0.0, 0.0, 0.0, 0.5, 4.0]
    slices = sorted(broken["nan"] + broken["zero"])
    singles = broken["nan"]
    assert all(abs(a - b) > 1 for a in singles for b in slices if a != b)
    # Only the slices asked for changed.
    changed = [k for k in range(scan.data.shape[2])
               if not np.array_equal(out.data[:, :, k], scan.data[:, :, k])]
    assert len(changed) == 7


# --- int16_scaled and clipped ---------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 12])
def test_int16_storage_has_at_most_2_to_the_bits_levels(scan, bits):
    out = pop.int16_scaled(scan, bits)
    _same_geometry(out, scan)
    assert len(np.unique(out.data)) <= 2**bits
    assert len(np.unique(scan.data)) > 2**bits  # it did quantise
    slope = pop.quantisation_slope(scan.data, bits)
    assert slope == pytest.approx(scan.data.max() / (2**bits - 1))
    np.testing.assert_allclose(out.data, scan.data, atol=slope / 2 * 1.001)
    levels = out.data / slope
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
    assert out.data.max() == pytest.approx(scan.data.max(), rel=1e-6)


def test_clipping_saturates_at_the_head_percentile(scan):
    out = pop.clipped(scan, 95)
    _same_geometry(out, scan)
    level = np.percentile(scan.data[pop.head_mask(scan.data)], 95)
    assert out.data.max() == pytest.approx(level, rel=1e-6)
    below = scan.data < level
    np.testing.assert_array_equal(out.data[below], scan.data[below])
    assert np.count_nonzero(scan.data > level) > 1000  # something was clipped


# --- population_cases -----------------------------------------------------------------------

def test_population_cases_are_good_unique_lazy_and_deterministic():
    calls = person.cache_info()
    cases = pop.population_cases(seed=0, people=2, real=True)
    after = person.cache_info()
    assert (after.hits, after.misses) == (calls.hits, calls.misses)  # nothing asked for yet
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert {c.kind for c in cases} == {"good"}
    assert all(isinstance(c.build, functools.partial) for c in cases)
    colin = real_scan("colin27") is not None
    kinds = ("size", "bias", "stripped", "defaced", "mp2rage", "ghost", "lesions",
             "int16", "clipped")
    variations = Counter(next(k for k in kinds if n.split("/")[1].startswith(k))
                         for n in names)
    sources = 2 if colin else 1
    assert variations["size"] == sources * 9 * 2  # 6 + 3 scales, two poses each
    assert variations["bias"] == sources * 4
    assert variations["stripped"] == 2
    assert variations["defaced"] == sources + 1
    for label in kinds[4:]:
        assert variations[label] == sources, label
    assert ("colin27/size0.82" in names) == colin
    assert {"person-0/size0.82", "person-0/size0.85x1x1.1", "person-1/stripped",
            "person-0/bias10x", "person-0/defaced"} <= set(names)
    # With the calibration set: every anatomy has exactly one reference pose.
    both = cases + calibration_cases(people=2, real=True, seed=0, failures=False)
    references = Counter(c.anatomy for c in both if c.reference)
    assert set(references.values()) == {1}
    assert {c.anatomy for c in both} == set(references)
    scaled = [c for c in cases if "@" in c.anatomy]
    assert all(c.reference == (c.acquisition == "1mm") for c in scaled)
    assert not any(c.reference for c in cases if "@" not in c.anatomy)
    # Deterministic in the seed, and the seed matters.
    again = pop.population_cases(seed=0, people=2, real=True)
    other = pop.population_cases(seed=1, people=2, real=True)
    assert [(c.name, c.build.args[1:]) for c in again] == [(c.name, c.build.args[1:])
                                                            for c in cases]
    assert [c.build.args[2] for c in other] != [c.build.args[2] for c in cases]
    assert not any(n.startswith("colin27") for n in
                   (c.name for c in pop.population_cases(people=1, real=False)))
