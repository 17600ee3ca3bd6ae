"""NaNGuard, NonFiniteLocator and the gradient helpers name what went non-finite."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mriprep.training.guards import (
    GradientClipper,
    NaNGuard,
    NonFiniteError,
    NonFiniteLocator,
    clamp_gradients,
)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv3d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 3, 1))


def _batch():
    return torch.randn(2, 1, 8, 8, 8)


def test_guard_passes_a_finite_batch_untouched_and_names_a_bad_one():
    guard = NaNGuard()
    x = _batch()
    assert guard(x) is x
    x[1, 0, 2, 3, 4] = float("nan")
    x[1, 0, 5, 5, 5] = float("inf")
    guard.set_batch(["sub-01", "sub-07"], step=40)
    with pytest.raises(NonFiniteError) as caught:
        guard(x)
    text = str(caught.value)
    assert isinstance(caught.value, FloatingPointError)
    assert "2 non-finite value(s) (1 NaN, 1 Inf)" in text and "step 40" in text
    assert "sub-07" in text and "sub-01" not in text and "(1, 0, 2, 3, 4)" in text


def test_guard_replaces_and_records_or_warns():
    x = _batch()
    x[0, 0, 0, 0, :3] = float("nan")
    guard = NaNGuard("replace", fill=0.0)
    guard.set_batch(["sub-03", "sub-04"], step=2)
    out = guard(x)
    assert torch.isfinite(out).all() and out[0, 0, 0, 0, :3].eq(0).all()
    assert guard.events == [{"step": 2, "count": 3, "subjects": ["sub-03"]}]
    with pytest.warns(RuntimeWarning, match="3 non-finite"):
        assert NaNGuard("warn")(x) is x


def test_locator_names_the_layer_with_poisoned_weights():
    model = _net()
    with torch.no_grad():
        model[2].weight[0, 0, 0, 0, 0] = float("inf")
    with pytest.raises(NonFiniteError) as caught:
        with NonFiniteLocator(model)(step=12, subject_ids=["sub-01", "sub-02"]):
            model(_batch()).sum().backward()
    text = str(caught.value)
    assert "module '2' (forward pass)" in text and "step 12" in text and "sub-02" in text


def test_locator_names_a_nan_planted_in_the_batch_as_the_input():
    model = _net()
    x = _batch()
    x[0, 0, 1, 1, 1] = float("nan")
    with pytest.raises(NonFiniteError, match="the model's input is not finite"):
        with NonFiniteLocator(model):
            model(x)


@pytest.mark.parametrize("layout", ["channels_last", "channels_last_n1", "transposed",
                                    "overlapping"])
def test_finite_check_reads_every_layout(layout):
    """The check reduces a permuted tensor in memory order: the same verdict, NaN, +Inf
    and -Inf found wherever they lie, and a layout it cannot view so falls back."""
    from mriprep.training.guards import _all_finite, _in_memory_order

    base = torch.randn(2, 3, 5, 7)
    if layout == "channels_last":
        t = base.contiguous(memory_format=torch.channels_last)
    elif layout == "channels_last_n1":  # one item, and a 1 x 1 plane: strides tie
        t = torch.randn(1, 3, 1, 1).contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        t = base.transpose(1, 3)
    else:  # a broadcast view: every element read more than once
        t = torch.randn(1, 3, 1, 7).expand(2, 3, 5, 7)
    view = _in_memory_order(t)
    assert view.is_contiguous() or layout == "overlapping"
    assert sorted(view.flatten().tolist()) == sorted(t.flatten().tolist())
    assert bool(_all_finite(t))
    for bad in (float("nan"), float("inf"), -float("inf")):
        if layout == "overlapping":  # poisoned in the base: the view holds it many times
            base = torch.randn(1, 3, 1, 7)
            base[0, 2, 0, 6] = bad
            poisoned = base.expand(2, 3, 5, 7)
            assert _in_memory_order(poisoned) is poisoned
        else:
            poisoned = t.clone(memory_format=torch.preserve_format)
            poisoned[tuple(n - 1 for n in poisoned.shape)] = bad
            assert poisoned.stride() == t.stride()
        assert not bool(_all_finite(poisoned)), (layout, bad)


def test_locator_names_the_poisoned_layer_of_a_channels_last_network():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(7, 4, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(4, 3, 1)).to(memory_format=torch.channels_last)
    with torch.no_grad():
        model[2].weight[1, 2] = float("nan")
    x = torch.randn(2, 7, 16, 16).contiguous(memory_format=torch.channels_last)
    with pytest.raises(NonFiniteError, match="module '2' \\(forward pass\\)"):
        with NonFiniteLocator(model):
            model(x).sum().backward()


class _Sqrt(nn.Module):
    def forward(self, x):
        return torch.sqrt(x)  # finite at 0, but its gradient there is infinite


def test_locator_names_the_module_whose_gradient_turns_non_finite():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), _Sqrt(), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()  # ReLU(0) = 0: sqrt's gradient is inf
    with pytest.raises(NonFiniteError, match="module '2' \\(backward pass\\)"):
        with NonFiniteLocator(model):
            model(torch.ones(3, 4)).sum().backward()


def test_locator_is_silent_on_a_clean_step_and_removes_its_hooks():
    model = _net()
    locator = NonFiniteLocator(model)
    for step in range(2):
        with locator(step=step):
            model(_batch()).sum().backward()
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               and not m._backward_pre_hooks for m in model.modules())


def test_clamp_counts_what_it_clamped_and_can_be_removed():
    model = nn.Linear(3, 1)
    handle = clamp_gradients(model, 0.5)
    (model(torch.full((1, 3), 100.0)) * 10).sum().backward()
    assert model.weight.grad.abs().max() <= 0.5 and handle.acted >= 1
    handle.remove()
    model.zero_grad()
    (model(torch.full((1, 3), 100.0)) * 10).sum().backward()
    assert model.weight.grad.abs().max() > 0.5


def test_clipper_reports_the_norm_before_clipping():
    model = nn.Linear(3, 1)
    clipper = GradientClipper(max_norm=1.0)
    (model(torch.full((1, 3), 10.0))).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    assert clipper.clip(model.parameters()) == pytest.approx(expected)
    assert clipper.clipped == 1 and "1 of 1 steps" in clipper.summary()
    model.weight.grad[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="NonFiniteLocator"):
        clipper.clip(model.parameters())


class _Gain(nn.Module):
    def __init__(self, gain: float):
        super().__init__()
        self.gain = gain

    def forward(self, x):
        return x * self.gain


def _overflowing_weight_model():
    """Every activation and activation gradient finite, the first weight's gradient not:
    inputs of 1e20 times output gradients of 1e20 overflow float32 in the weight's
    gradient only (its forward product, with weights of 1e-25, is about 1e-5)."""
    model = nn.Sequential(nn.Linear(4, 4), _Gain(1e20), nn.Linear(4, 1, bias=False))
    with torch.no_grad():
        model[0].weight.fill_(1e-25)
        model[0].bias.zero_()
        model[2].weight.fill_(1.0)
    return model, torch.full((2, 4), 1e20)


def test_locator_names_a_parameter_whose_gradient_alone_is_not_finite():
    model, x = _overflowing_weight_model()
    with pytest.raises(NonFiniteError) as caught:
        with NonFiniteLocator(model)(step=3, subject_ids=["sub-01", "sub-02"]):
            model(x).sum().backward()
    text = str(caught.value)
    assert "'0.weight'" in text and "parameter" in text and "step 3" in text
    assert "'0.bias'" not in text and "'2.weight'" not in text  # those stayed finite
    assert not torch.isfinite(model[0].weight.grad).all()


def test_locator_parameter_check_can_be_turned_off_and_is_silent_when_clean():
    model, x = _overflowing_weight_model()
    with NonFiniteLocator(model, parameters=False):
        model(x).sum().backward()  # the activations alone are finite: no error
    assert not torch.isfinite(model[0].weight.grad).all()  # what it was told to overlook
    model.zero_grad(set_to_none=True)
    with NonFiniteLocator(model, backward=False):  # forward only: parameters off too
        model(x).sum().backward()
    assert not torch.isfinite(model[0].weight.grad).all()
    clean = _net()
    with NonFiniteLocator(clean):
        clean(_batch()).sum().backward()


def test_non_finite_gradients_names_parameters_in_model_order():
    from mriprep.training.guards import non_finite_gradients

    model = _net()
    model(_batch()).sum().backward()
    assert non_finite_gradients(model) == []
    model[4].weight.grad[0, 0, 0, 0, 0] = float("nan")
    model[0].bias.grad[1] = float("-inf")
    assert non_finite_gradients(model) == ["0.bias", "4.weight"]
