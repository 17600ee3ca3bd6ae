"""The outcome bench's parts on small arrays: the planted defects, the event count of
guarded and unguarded training, Dice, and the NaN handlings of the ablation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from benchmarks.outcome import ablations
from benchmarks.outcome.arm_monai import nan_to_mean, nan_to_zero
from benchmarks.outcome.cohort import plant
from benchmarks.outcome.network import SliceNet, at_network_grid, full_size
from benchmarks.outcome.sampler import slice_batches, slice_pool
from benchmarks.outcome.training import PreparedArm, dice_of, predict, thick, train
from benchmarks.outcome.training import TestVolume as ScoredVolume  # not a test class


@pytest.fixture(scope="module")
def head():
    labels = np.zeros((40, 40, 40), np.int16)
    labels[8:32, 8:32, 8:32] = 2
    labels[10:20, 8:16, 8:14] = 8  # a "cerebellum" for the posterior fossa artifact
    image = np.where(labels > 0, 100.0, 5.0).astype(np.float32)
    return image, labels, np.eye(4)


def test_planted_defects_change_the_image_and_keep_the_labels(head):
    image, labels, affine = head
    rng = np.random.default_rng(0)
    out, out_labels, out_affine = plant(image, labels, affine,
                                        ("extreme(1e308)", "nan_blobs", "zero_slab",
                                         "posterior_fossa", "wrong_orientation"), rng)
    assert out.dtype == np.float64 and np.nanmax(out) == 1e308
    assert np.isnan(out).sum() > 0
    assert np.any(np.all(out == 0.0, axis=(0, 1)))  # a zero slab across the slice axis
    assert out_affine[1, 1] == -1.0  # the header's anterior-posterior is reversed
    assert np.array_equal(out_labels, labels)
    cerebellum = labels == 8
    finite = np.isfinite(out) & (out < 1e30) & (out > 0)
    assert np.median(out[cerebellum & finite]) < 0.5 * 100.0


def test_an_unknown_defect_is_refused(head):
    with pytest.raises(ValueError, match="unknown defect 'spike'"):
        plant(*head, ("spike",), np.random.default_rng(0))


def test_plant_keeps_float32_without_a_value_beyond_it(head):
    image, labels, affine = head
    out, _, _ = plant(image, labels, affine, ("extreme(1e30)",), np.random.default_rng(1))
    assert out.dtype == np.float32 and out.max() == np.float32(1e30)


def _arm(nan_at: set[int], guarded: bool) -> PreparedArm:
    def batches(seed):
        rng = np.random.default_rng(seed)
        for step in itertools.count():
            image = torch.from_numpy(rng.random((2, 7, 16, 16), dtype=np.float32))
            if step in nan_at:
                image[0, 3, 4, 4] = math.nan
            yield {"image": image, "classes": torch.zeros(2, 16, 16, dtype=torch.long),
                   "subject_id": ["a", "b"]}

    def loss(logits, batch):
        return torch.nn.functional.cross_entropy(logits, batch["classes"])
    return PreparedArm("test", batches, loss, test=[], guarded=guarded)


def test_an_unguarded_loop_steps_on_a_nan_and_carries_it_on():
    run = train(_arm({2}, guarded=False), steps=5)
    # The NaN input's step updates the weights with NaN: every later step is an event too.
    assert run.events["input"] == 1
    assert run.event_steps == 3
    assert run.events["skipped"] == 0
    assert "input is not finite" in run.first_cause and "step 2" in run.first_cause
    assert not all(torch.isfinite(p).all() for p in run.model.parameters())


def test_a_guarded_loop_skips_the_step_and_names_it():
    run = train(_arm({2}, guarded=True), steps=5)
    assert run.event_steps == 1 and run.events["skipped"] == 1
    assert "network's input at step 2, from subject(s) a" in run.first_cause
    assert all(torch.isfinite(p).all() for p in run.model.parameters())
    assert math.isnan(run.losses[2]) and all(math.isfinite(x) for i, x in
                                             enumerate(run.losses) if i != 2)


def test_thick_repeats_the_edge_slices():
    volume = np.arange(5)[:, None, None] * np.ones((5, 2, 2))
    assert thick(volume, 0)[:, 0, 0].tolist() == [0, 0, 0, 0, 1, 2, 3]
    assert thick(volume, 4)[:, 0, 0].tolist() == [1, 2, 3, 4, 4, 4, 4]


def test_dice_from_the_confusion_matrix():
    # rows: truth, columns: prediction
    confusion = np.array([[5, 1, 0], [1, 3, 1], [0, 2, 2]])
    assert dice_of(confusion, [1]) == pytest.approx(2 * 3 / (5 + 6))
    assert dice_of(confusion, [1, 2]) == pytest.approx(2 * 8 / (9 + 9))
    assert math.isnan(dice_of(np.zeros((3, 3), int), [1]))


def test_the_input_fixes_of_arm_a():
    x = torch.tensor([[1.0, math.nan], [3.0, math.inf]])
    assert nan_to_zero(x)[0].tolist() == [1.0, 0.0] and nan_to_zero(x)[1, 1] > 1e38
    # the mean of the finite voxels; an infinity is not NaN and stays
    assert nan_to_mean(x).tolist() == [[1.0, 2.0], [3.0, math.inf]]
    assert nan_to_mean(torch.full((2,), math.nan)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("share", [0.05, 0.3])
def test_nan_blobs_cover_the_share_asked(share):
    brain = np.zeros((40, 40, 40), bool)
    brain[5:35, 5:35, 5:35] = True
    holes = ablations.nan_blobs(brain, share, np.random.default_rng(3))
    covered = (holes & brain).sum() / brain.sum()
    assert share <= covered < share + 0.1


def test_the_three_nan_handlings():
    image = np.linspace(0, 1, 20 ** 3, dtype=np.float32).reshape(20, 20, 20)
    holes = np.zeros(image.shape, bool)
    holes[8:12, 8:12, 8:12] = True
    valid = np.ones(image.shape, bool)
    zero, zero_valid = ablations.handle(image, holes, valid, "zero")
    assert (zero[holes] == 0).all() and zero_valid.all()
    mean, _ = ablations.handle(image, holes, valid, "mean")
    # the head's mean: the other non-zero voxels (a conformed background is 0)
    assert np.allclose(mean[holes], image[~holes & (image > 0)].mean())
    local, local_valid = ablations.handle(image, holes, valid, "mriprep")
    # Filled from the neighbours: close to the true values, and no longer valid.
    assert np.abs(local[holes] - image[holes]).max() < 0.05
    assert not local_valid[holes].any() and local_valid[~holes].all()
    with pytest.raises(ValueError, match="handling"):
        ablations.handle(image, holes, valid, "median")


def test_a_refused_step_leaves_no_gradient_for_the_next_to_count():
    run = train(_arm({1, 2}, guarded=True), steps=4)
    assert run.events == {"input": 2, "loss": 0, "gradients": 0, "skipped": 2,
                          "scaler_skipped": 0}


# float16 autocast with a GradScaler: the path benchmarks/gpu_check.py --outcome runs on
# CUDA, here on the CPU.
@pytest.mark.parametrize("first", [0, 1])
def test_under_a_grad_scaler_a_guarded_loop_still_skips_and_names_the_step(first):
    run = train(_arm({first}, guarded=True), steps=3, amp=True)
    assert run.events["skipped"] == 1 and run.event_steps == 1
    assert f"step {first}" in run.first_cause
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_under_a_grad_scaler_an_unguarded_nan_is_counted_though_the_scaler_skips_it():
    run = train(_arm({1}, guarded=False), steps=3, amp=True)
    assert run.event_steps == 1 and run.events["input"] == 1
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_the_sampler_leaves_blank_slices_out_and_carries_valid_where_given():
    classes = np.zeros((6, 8, 8), np.int64)
    classes[2:4] = 1  # 64 voxels of class 1: above the blank threshold of 50
    image = np.random.default_rng(0).random((6, 8, 8), dtype=np.float32)
    valid = np.ones((6, 8, 8), bool)
    pool = slice_pool([("s", image, classes, valid)])
    assert pool == [(0, 2), (0, 3)]
    volumes = [("s", image, classes, valid)] * 4
    batch = next(slice_batches(volumes, slice_pool(volumes), seed=0))
    assert batch["image"].shape == (8, 7, 8, 8) and batch["valid"].shape == (8, 8, 8)
    assert "valid" not in next(slice_batches([v[:3] for v in volumes],
                                             slice_pool(volumes), seed=0))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int64])
@pytest.mark.parametrize("shape, classes, stride", [((4, 64, 64), 21, 2), ((3, 31, 33), 3, 2),
                                                    ((2, 30, 31), 4, 3)])
def test_the_cells_class_is_the_argmax_of_the_pooled_one_hot(shape, classes, stride, dtype):
    """The targets at the logits' grid: each cell's most frequent class, ties to the
    lowest, the trailing rows and columns that fill no cell dropped, as the average
    pooling of the one-hot classes gives them."""
    target = torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(1))
    one_hot = F.one_hot(target, classes).permute(0, 3, 1, 2).float()
    expected = F.avg_pool2d(one_hot, stride).argmax(1)
    assert torch.equal(at_network_grid(target.to(dtype), stride, "classes"), expected)


def test_predict_takes_the_first_maximal_class_as_argmax_does():
    """The test Dice's classes: the upsampled logits' first maximal class per voxel."""
    torch.manual_seed(0)
    model = SliceNet(5, width=4)
    image = np.random.default_rng(0).normal(size=(12, 32, 32)).astype(np.float32)
    volume = ScoredVolume("sub-x", image, np.zeros(image.shape, dtype=np.int64))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(np.stack([thick(image, k) for k in range(len(image))]))
        expected = full_size(model(x), x.shape[-2:]).argmax(1).numpy()
    assert np.array_equal(predict(model, volume), expected)
    # Exact ties, classes 1 and 3 above the rest everywhere: the lower one wins.
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0]))
    assert (predict(model, volume) == 1).all()
