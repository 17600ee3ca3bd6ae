"""Augment: geometry against analytic images, labels, the valid mask, the flip's label
swap, parameter distributions, reproducibility across workers, interop and numerics.

Small tensors only; speed is measured in ``benchmarks/bench_augment.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch.utils.data import DataLoader, Dataset, default_collate

from mriprep.training.augment import Augment, AugmentConfig, SampleParams
from mriprep.training.augment.geometry import sample_matrix, sampling_grid

NOTHING = dict(affine_prob=0.0, elastic_prob=0.0, flip_prob=0.0, bias_prob=0.0,
               gamma_prob=0.0, contrast_prob=0.0, noise_prob=0.0, rician_prob=0.0,
               blur_prob=0.0, lowres_prob=0.0)
EVERYTHING = dict(affine_prob=1.0, elastic_prob=1.0, bias_prob=1.0, gamma_prob=1.0,
                  contrast_prob=1.0, noise_prob=1.0, rician_prob=1.0, blur_prob=1.0,
                  lowres_prob=1.0)


def centred(shape):
    """Voxel coordinates about the grid's centre, ``[*shape, n]`` float64."""
    axes = [np.arange(s) - (s - 1) / 2 for s in shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1)


def rotation_only(augment: Augment, ndim: int, angles) -> SampleParams:
    p = augment.draw(["rot"], ndim)[0]
    p.affine, p.rotation_deg = True, list(angles)
    p.scale, p.shear, p.translation = [1.0] * ndim, [0.0] * (ndim * (ndim - 1)), [0.0] * ndim
    return p


# -- geometry against analytic images ------------------------------------------------------


def test_rotating_a_plane_wave_matches_the_rotated_wave():
    shape = (40, 40, 40)
    u = centred(shape)
    k = np.array([1.0, 0.5, -0.7])
    k *= 2 * math.pi / 14 / np.linalg.norm(k)  # a 14-voxel wavelength
    image = torch.tensor(np.cos(u @ k), dtype=torch.float32)[None, None]
    augment = Augment(**NOTHING)
    p = rotation_only(augment, 3, [20.0, -10.0, 35.0])
    out = augment({"image": image}, params=[p])
    m, _ = sample_matrix(p, None)
    expected = np.cos(u @ (m.T @ k))  # output(u) = input(M u) = cos(k . M u)
    valid = out["valid"][0].numpy()
    error = np.abs(out["image"][0, 0].numpy() - expected)[valid]
    assert valid.mean() > 0.5  # the corners rotated out of the grid are invalid
    # linear interpolation of cos: error at most |k|^2 h^2 / 8 per axis, about 0.06
    assert error.max() < 0.08 and error.mean() < 0.03


def test_rotating_an_off_centre_blob_in_2d_moves_it_where_the_rotation_says():
    shape = (48, 48)
    u = centred(shape)
    centre = np.array([8.0, -5.0])
    blob = np.exp(-((u - centre) ** 2).sum(-1) / (2 * 4.0 ** 2))
    image = torch.tensor(blob, dtype=torch.float32)[None].repeat(3, 1, 1)[None]
    augment = Augment(**NOTHING)
    p = rotation_only(augment, 2, [30.0])
    out = augment({"image": image}, params=[p])
    m, _ = sample_matrix(p, None)
    moved = np.linalg.solve(m, centre)  # output(u) = input(M u): the blob is at M^-1 c
    expected = np.exp(-((u - moved) ** 2).sum(-1) / (2 * 4.0 ** 2))
    valid = out["valid"][0].numpy()
    for channel in out["image"][0]:  # 2.5D: every channel through the same 2D geometry
        # linear interpolation: at most h^2/8 |f''| per axis, 1/(8 sigma^2) = 0.008 here
        assert np.abs(channel.numpy() - expected)[valid].max() < 0.02


def test_identity_parameters_return_the_input():
    image = torch.randn(2, 1, 12, 13, 14)
    out = Augment(**NOTHING)({"image": image, "subject_id": ["a", "b"]})
    assert torch.equal(out["image"], image) and bool(out["valid"].all())


# -- labels and the valid mask ---------------------------------------------------------------


@pytest.mark.parametrize("label_mode", ["nearest", "linear"])
def test_labels_gain_no_new_values(label_mode):
    g = torch.Generator().manual_seed(0)
    values = torch.tensor([0, 3, 17, 42])
    label = values[torch.randint(0, 4, (2, 20, 20, 20), generator=g)]
    label = F.max_pool3d(label[:, None].float(), 3, 1, 1)[:, 0].long()  # some structure
    batch = {"image": torch.randn(2, 1, 20, 20, 20, generator=g), "label": label,
             "subject_id": ["a", "b"]}
    augment = Augment(**EVERYTHING, flip_prob=1.0, lateralised_labels=False,
                      label_mode=label_mode, elastic_magnitude=(2.0, 3.0))
    out = augment(batch)
    assert out["label"].dtype == torch.int64 and out["label"].shape == label.shape
    assert set(out["label"].unique().tolist()) <= set(label.unique().tolist())
    assert not torch.equal(out["label"], label)


def _masked_batch():
    g = torch.Generator().manual_seed(1)
    image = torch.randn(2, 1, 24, 24, 24, generator=g)
    valid = torch.ones(2, 24, 24, 24, dtype=torch.bool)
    valid[:, :, :, 10:13] = False  # a masked slab
    valid[1, 3:8, 3:8, 3:8] = False
    return image, valid


def test_no_valid_output_voxel_draws_on_an_invalid_input_voxel():
    image, valid = _masked_batch()
    config = dict(EVERYTHING, translation=6.0)
    garbage = image.clone()
    garbage[~valid[:, None]] = 1e6
    garbage[0, 0, 0, 0, 11] = float("nan")
    clean = torch.where(valid[:, None], image, 0.0)
    ids = ["a", "b"]
    out = Augment(**config)({"image": garbage, "valid": valid, "subject_id": ids})
    ref = Augment(**config)({"image": clean, "valid": valid, "subject_id": ids})
    # what the invalid voxels hold changes nothing at all, and nothing is non-finite
    assert torch.equal(out["image"], ref["image"]) and torch.equal(out["valid"], ref["valid"])
    assert bool(torch.isfinite(out["image"]).all())
    # and every valid output voxel has (almost) all its interpolation weight on valid input
    params = [SampleParams.from_dict(p) for p in out["augment"]]
    grid = sampling_grid(params, (24, 24, 24), 0, 5, "cpu")
    invalid_weight = F.grid_sample((~valid[:, None]).float(), grid, align_corners=True,
                                   padding_mode="border")[:, 0]
    outside = ~((grid.abs() <= 1).all(-1))
    assert float(invalid_weight[out["valid"]].max()) <= 1 - 0.999 + 1e-6
    assert not bool((out["valid"] & outside).any())  # out of the grid: invalid
    assert 0.2 < float(out["valid"].float().mean()) < float(valid.float().mean())


def test_weight_maps_follow_the_image_grid():
    image = torch.zeros(1, 1, 16, 16, 16)
    weight = torch.rand(1, 16, 16, 16, generator=torch.Generator().manual_seed(2))
    out = Augment(**dict(NOTHING, affine_prob=1.0))(
        {"image": image + weight[:, None], "weight": weight, "subject_id": ["w"]})
    v = out["valid"]
    assert torch.allclose(out["weight"][v], out["image"][:, 0][v], atol=1e-6)


def test_invalid_voxels_lend_nothing_not_even_a_nan_weight_and_constants_stay_constant():
    # A constant image and weight map, a slab invalid where the weights are NaN (a map
    # undefined outside the field of view): every valid output voxel keeps both
    # constants, to float32's rounding, as normalised interpolation promises.
    valid = torch.ones(1, 16, 16, 16, dtype=torch.bool)
    valid[:, :, :, :4] = False
    weight = torch.full((1, 16, 16, 16), 0.7)
    weight[~valid] = float("nan")
    out = Augment(**dict(NOTHING, affine_prob=1.0, rotation_deg=20.0))(
        {"image": torch.full((1, 1, 16, 16, 16), 3.0), "valid": valid, "weight": weight,
         "subject_id": ["w"]})
    v = out["valid"]
    assert 0 < int(v.sum()) < v.numel()
    assert torch.isfinite(out["weight"]).all()
    assert torch.allclose(out["weight"][v], torch.tensor(0.7), rtol=1e-6, atol=0.0)
    assert torch.allclose(out["image"][:, 0][v], torch.tensor(3.0), rtol=1e-6, atol=0.0)


def test_intensity_alone_leaves_the_callers_tensors_as_they_were():
    image = torch.rand(2, 3, 12, 12, generator=torch.Generator().manual_seed(4))
    valid = torch.ones(2, 12, 12, dtype=torch.bool)
    valid[1, :, :11] = False  # a sliver of valid voxels the statistics' stride may miss
    kept = image.clone()
    out = Augment(**dict(NOTHING, bias_prob=1.0, gamma_prob=1.0, noise_prob=1.0))(
        {"image": image, "valid": valid, "subject_id": ["a", "b"]})
    assert torch.equal(image, kept)
    assert not torch.equal(out["image"], image) and torch.isfinite(out["image"]).all()


# -- the left-right flip ---------------------------------------------------------------------


class Table:
    """A label table duck: what issue 29's FastSurfer table offers."""

    def lr_swap(self):
        return np.array([0, 2, 1, 3])


def _lateral_batch():
    label = torch.zeros(2, 8, 6, 5, dtype=torch.int64)
    label[:, :3], label[:, 5:], label[:, 3:5, :2] = 1, 2, 3  # left, right, midline
    return {"image": label[:, None].float(), "label": label, "subject_id": ["a", "b"]}


@pytest.mark.parametrize("gamma", [0.2, 0.74, 1.0, 1.45])
def test_gamma_maps_the_valid_range_onto_itself_as_the_power_law_says(gamma):
    # the fast path (exp(gamma log t), t floored) and pow below FAST_GAMMA_MIN alike
    image = torch.linspace(-3.0, 5.0, 4096).reshape(1, 1, 16, 16, 16)
    augment = Augment(**dict(NOTHING, gamma_prob=1.0), gamma=(gamma, gamma))
    out = augment({"image": image, "subject_id": ["a"]})["image"].double()
    t = (image.double() + 3.0) / 8.0
    expected = t ** gamma * 8.0 - 3.0
    assert (out - expected).abs().max() < 1e-5
    assert out.flatten()[0] == pytest.approx(-3.0, abs=1e-12)  # the minimum stays put
    assert out.flatten()[-1] == pytest.approx(5.0, abs=1e-5)


@pytest.mark.parametrize("swap", [Table(), torch.tensor([0, 2, 1, 3]), [0, 2, 1, 3]])
def test_a_flip_with_the_table_swaps_the_left_and_right_classes(swap):
    batch = _lateral_batch()
    out = Augment(**dict(NOTHING, flip_prob=1.0), lr_swap=swap)(batch)
    expected = torch.tensor([0, 2, 1, 3])[batch["label"].flip(1)]
    assert torch.equal(out["label"], expected)
    assert torch.equal(out["label"][:, :3], torch.ones_like(out["label"][:, :3]))  # L stays L
    assert torch.allclose(out["image"][:, 0], batch["image"][:, 0].flip(1), atol=1e-5)
    assert all(p["flip"] for p in out["augment"])


def test_a_flip_without_a_table_is_refused_for_labels():
    with pytest.raises(ValueError, match="lr_swap"):
        Augment(**dict(NOTHING, flip_prob=1.0))(_lateral_batch())
    # declared symmetric, or no labels: it flips, labels as they are
    batch = _lateral_batch()
    out = Augment(**dict(NOTHING, flip_prob=1.0), lateralised_labels=False)(_lateral_batch())
    assert torch.equal(out["label"], batch["label"].flip(1))
    assert torch.allclose(out["image"][:, 0], batch["image"][:, 0].flip(1), atol=1e-5)
    assert all(p["flip"] for p in out["augment"])
    del batch["label"]
    image = batch["image"].clone()
    out = Augment(**dict(NOTHING, flip_prob=1.0))(batch)
    assert torch.allclose(out["image"][:, 0], image[:, 0].flip(1), atol=1e-5)
    assert all(p["flip"] for p in out["augment"])
    with pytest.raises(ValueError, match="involution"):
        Augment(lr_swap=[1, 2, 0])


def test_sagittal_slices_are_not_flipped_and_axial_ones_along_x():
    image = torch.randn(2, 3, 8, 9)
    sagittal = torch.eye(4)[[1, 2, 0, 3]].T[None].repeat(2, 1, 1)  # in-plane: y, z
    augment = Augment(**dict(NOTHING, flip_prob=1.0))
    out = augment({"image": image, "affine": sagittal, "subject_id": ["a", "b"]})
    assert torch.equal(out["image"], image) and not any(p["flip"] for p in out["augment"])
    augment.set_epoch(1)
    axial = torch.eye(4)[None].repeat(2, 1, 1)  # in-plane: x, y
    out = augment({"image": image, "affine": axial, "subject_id": ["a", "b"]})
    assert torch.allclose(out["image"], image.flip(2), atol=1e-5)


# -- parameter distributions -------------------------------------------------------------------


def test_parameter_distributions_match_their_specification():
    config = AugmentConfig(seed=3, rotation_deg=12.0, scale=(0.8, 1.2), gamma=(0.5, 2.0),
                           affine_prob=0.7, lowres_prob=1.0, noise_prob=1.0,
                           noise_std=(0.0, 0.2), gamma_prob=1.0)
    augment = Augment(config)
    params = augment.draw([f"s{i}" for i in range(1500)], 3)
    alpha = 1e-3  # fixed seed: a deterministic test, failing only on a real mismatch

    def uniform(values, lo, hi):
        return stats.kstest(values, stats.uniform(lo, hi - lo).cdf).pvalue

    rotations = np.array([p.rotation_deg for p in params])
    assert all(uniform(rotations[:, k], -12, 12) > alpha for k in range(3))
    assert uniform(np.array([p.scale for p in params]).ravel(), 0.8, 1.2) > alpha
    assert uniform([p.noise_std for p in params], 0.0, 0.2) > alpha
    gammas = [p.gamma for p in params]
    assert uniform(np.log(gammas), math.log(0.5), math.log(2.0)) > alpha  # log-uniform
    applied = sum(p.affine for p in params)
    assert stats.binomtest(applied, len(params), 0.7).pvalue > alpha
    axes = np.bincount([p.lowres_axis for p in params], minlength=3)
    assert stats.chisquare(axes).pvalue > alpha
    # independent samples: rotation about axis 0 of one sample says nothing of the next
    assert abs(stats.pearsonr(rotations[:-1, 0], rotations[1:, 0])[0]) < 0.1


# -- reproducibility ------------------------------------------------------------------------


class Small(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        valid = torch.ones(10, 10, 10, dtype=torch.bool)
        valid[:, :, i] = False
        return {"image": torch.randn(1, 10, 10, 10, generator=g), "valid": valid,
                "label": torch.randint(0, 3, (10, 10, 10), generator=g),
                "subject_id": f"sub-{i}", "location": torch.tensor([i, 0, 0])}


def _augment():
    return Augment(**EVERYTHING, seed=7)


class AugmentInWorkers:
    def __init__(self):
        self.augment = _augment()

    def __call__(self, items):
        out = self.augment(default_collate(items))
        del out["augment"]
        return out


def _run(workers: int, in_workers: bool, batch_size: int = 2):
    collate = AugmentInWorkers() if in_workers else None
    loader = DataLoader(Small(), batch_size=batch_size, num_workers=workers,
                        collate_fn=collate)
    augment = _augment()
    out = []
    for batch in loader:
        if not in_workers:
            batch = augment(batch)
        out.append((batch["image"], batch["valid"], batch["label"]))
    return [torch.cat(t) for t in zip(*out)]


def test_runs_are_reproducible_bit_for_bit_across_0_1_and_2_workers():
    # augmenting in the main process after a loader of any worker count sees the same
    # batches in the same order; augmenting inside 1 or 2 workers is what could differ
    reference = _run(0, in_workers=False)
    for workers in (0, 1, 2):
        for a, b in zip(reference, _run(workers, in_workers=True)):
            assert torch.equal(a, b), workers
    # a sample's draw does not depend on its batch: batch size 3 gives the same
    for a, b in zip(reference, _run(0, in_workers=False, batch_size=3)):
        assert torch.equal(a, b)


def test_cpu_chunks_give_the_batch_result(monkeypatch):
    import mriprep.training.augment.module as module

    batch = default_collate([Small()[i] for i in range(5)])
    whole = _augment()(dict(batch))
    monkeypatch.setattr(module, "CPU_CHUNK_BYTES", 2 * 4 * 10 ** 3)  # 2 samples a chunk
    augment = _augment()
    chunked = augment(dict(batch))
    for key in ("image", "valid", "label"):
        assert torch.equal(whole[key], chunked[key]), key
    assert chunked["augment"] == whole["augment"] and len(augment.last_params) == 5
    assert chunked["subject_id"] == batch["subject_id"]


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_in_the_workers_gives_the_batch_result(monkeypatch, workers):
    import mriprep.training.augment.module as module

    batch = default_collate([Small()[i] for i in range(6)])
    expected = _augment()(dict(batch))
    monkeypatch.setattr(module, "CPU_CHUNK_BYTES", 2 * 4 * 10 ** 3)  # 2 samples a chunk
    augment = _augment()
    loader = DataLoader(Small(), batch_size=3, num_workers=workers,
                        collate_fn=augment.collate)
    got = list(loader)
    for key in ("image", "valid", "label", "location"):
        assert torch.equal(torch.cat([g[key] for g in got]), expected[key]), key
        assert all(g[key].dtype == expected[key].dtype for g in got)
    assert [p for g in got for p in g["augment"]] == expected["augment"]
    assert [s for g in got for s in g["subject_id"]] == batch["subject_id"]


def test_the_mirror_axis_comes_from_the_whole_batchs_affine(monkeypatch):
    # items carry their affine, whose world x runs along the item's last axis: chunks of
    # items, and rows of an un-batched [4, 4] affine in a batch of 4, must not change it
    import mriprep.training.augment.module as module

    affine = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0],
                           [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    items = [dict(Small()[i], affine=affine) for i in range(4)]

    def augment():
        return Augment(**{**NOTHING, "flip_prob": 0.5}, lateralised_labels=False, seed=3)

    expected = augment()(default_collate(items))
    assert {p["flip"] for p in expected["augment"]} == {True, False}
    monkeypatch.setattr(module, "CPU_CHUNK_BYTES", 4 * 10 ** 3)  # one sample a chunk
    collated = augment().collate(items)
    batch = default_collate(items)
    batch["affine"] = affine  # one affine for the batch
    chunked = augment()(batch)
    for out in (collated, chunked):
        assert out["augment"] == expected["augment"]
        for key in ("image", "valid", "label"):
            assert torch.equal(out[key], expected[key]), key


def test_collate_refuses_items_without_identity_and_ignores_autocast():
    with pytest.raises(ValueError, match="subject_id"):
        _augment().collate([{"image": torch.zeros(1, 4, 4, 4)}] * 2)
    items = [Small()[i] for i in range(3)]
    expected = _augment().collate(items)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _augment().collate(items)
    assert torch.equal(got["image"], expected["image"]) and got["image"].dtype == torch.float32


def test_epochs_differ_and_recorded_parameters_replay():
    batch = default_collate([Small()[i] for i in range(2)])
    augment = _augment()
    first = augment(dict(batch))
    augment.set_epoch(1)
    second = augment(dict(batch))
    assert not torch.equal(first["image"], second["image"])
    replayed = _augment()(dict(batch), params=first["augment"])
    assert torch.equal(first["image"], replayed["image"])
    assert first["augment"][0]["sample_id"] == "sub-0/0-0-0"


# -- numerics and interop -------------------------------------------------------------------


def test_outputs_are_clamped_to_float16_and_the_clamps_counted():
    image = torch.full((1, 1, 8, 8, 8), 1e5)
    image[..., :4] = 1e4
    augment = Augment(**dict(NOTHING, contrast_prob=1.0), contrast=(3.0, 3.0))
    out = augment({"image": image, "subject_id": ["x"]})
    assert float(out["image"].abs().max()) <= 65504.0
    assert out["augment"][0]["clamped"] > 0 and augment.clamp_count == out["augment"][0]["clamped"]
    assert bool(torch.isfinite(out["image"].half()).all())


def test_under_autocast_the_interpolation_runs_in_float32():
    image = torch.randn(1, 1, 12, 12, 12)
    augment = Augment(**dict(NOTHING, affine_prob=1.0))
    plain = augment({"image": image, "subject_id": ["x"]})["image"]
    augment.set_epoch(0)  # the same draw again
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = augment({"image": image, "subject_id": ["x"]})["image"]
    assert autocast.dtype == torch.float32 and torch.equal(plain, autocast)


def test_plain_tensors_and_channel_first_masks():
    augment = Augment(**EVERYTHING)
    out = augment(torch.randn(2, 7, 16, 16))
    assert out.shape == (2, 7, 16, 16) and len(augment.last_params) == 2
    batch = {"image": torch.randn(2, 1, 8, 8, 8),
             "valid": torch.ones(2, 1, 8, 8, 8, dtype=torch.bool),
             "label": torch.zeros(2, 1, 8, 8, 8, dtype=torch.int64), "subject_id": ["a", "b"]}
    out = augment(batch)
    assert out["valid"].shape == (2, 1, 8, 8, 8) and out["label"].shape == (2, 1, 8, 8, 8)


def test_monai_meta_tensors_come_back_as_meta_tensors():
    monai = pytest.importorskip("monai.data")
    affine = torch.diag(torch.tensor([2.0, 2.0, 2.0, 1.0]))
    image = monai.MetaTensor(torch.randn(2, 1, 8, 8, 8), affine=affine)
    label = monai.MetaTensor(torch.randint(0, 3, (2, 1, 8, 8, 8)).float(), affine=affine)
    out = Augment(**EVERYTHING)({"image": image, "label": label, "subject_id": ["a", "b"]})
    assert isinstance(out["image"], monai.MetaTensor) and isinstance(out["label"], monai.MetaTensor)
    assert torch.equal(out["image"].affine, affine)
    assert out["label"].dtype == torch.float32
    assert set(out["label"].unique().tolist()) <= {0.0, 1.0, 2.0}
    items = [{"image": image[i], "label": label[i], "subject_id": s}
             for i, s in enumerate("ab")]
    collated = Augment(**EVERYTHING).collate(items)
    assert isinstance(collated["image"], monai.MetaTensor)
    assert torch.equal(collated["image"].as_tensor(), out["image"].as_tensor())


def test_the_config_round_trips_through_yaml_and_refuses_unknown_options():
    config = AugmentConfig(seed=5, scale=(0.85, 1.15), flip_prob=0.5)
    assert AugmentConfig.from_yaml(config.to_yaml()) == config
    assert AugmentConfig.from_yaml("augment:\n  seed: 5\n  scale: [0.85, 1.15]\n"
                                   "  flip_prob: 0.5\n") == config
    with pytest.raises(ValueError, match="unknown option"):
        AugmentConfig.from_yaml("rotaton_deg: 10\n")
    with pytest.raises(ValueError, match="probability"):
        AugmentConfig(noise_prob=2.0)
    assert Augment({"seed": 5}, flip_prob=0.5).config.flip_prob == 0.5


def test_a_malformed_config_is_a_clear_error_not_a_crash(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        AugmentConfig.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="no mapping"):
        AugmentConfig.from_yaml("- rotation_deg\n- 10\n")
    with pytest.raises(ValueError, match="two numbers"):
        AugmentConfig.from_yaml("scale: 1.1\n")
    with pytest.raises(ValueError, match="lowres_axis"):
        AugmentConfig(lowres_axis=5)
    with pytest.raises(ValueError, match="not an axis of a 2D item"):
        Augment(**dict(NOTHING, lowres_prob=1.0), lowres_axis=2)(torch.randn(1, 1, 8, 8))


def test_an_overflow_inside_the_transforms_still_ends_finite():
    # float32's edge: the gamma's span overflows to Inf, Inf / Inf is NaN
    image = torch.full((1, 1, 8, 8, 8), 3e38)
    image[..., :4] = -3e38
    augment = Augment(**dict(NOTHING, gamma_prob=1.0, contrast_prob=1.0), contrast=(3.0, 3.0))
    out = augment({"image": image, "subject_id": ["x"]})
    assert bool(torch.isfinite(out["image"]).all()) and out["augment"][0]["clamped"] > 0
