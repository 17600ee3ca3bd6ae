"""Training that names its NaN: an input guard, a first-non-finite locator, and gradient
clamping and clipping that count how often they act.

The folklore each replaces hides the cause: a guard that prints and zeroes, ``clamp``
hooks at +/-1e3 on every gradient, ``clip_grad_norm_(..., 1.0)`` whose return value is
dropped. Here:

* :class:`NaNGuard`, placed at a network's input, raises :class:`NonFiniteError` naming
  the batch's subjects, the count and the first positions (or fills and records, or
  warns). A finite input costs one reduction.
* :class:`NonFiniteLocator` watches every module of a model for one step and names the
  first module whose forward output, or backward gradient, is not finite, with the pass,
  the step and the subjects; after backward it checks every parameter gradient too (one
  fused reduction) and names the parameters whose gradient is not finite. It records
  one flag per module without synchronising and reads them once at the end of the step,
  so it costs far less than ``torch.autograd.detect_anomaly`` (``make bench`` measures
  both).
* :func:`clamp_gradients` and :class:`GradientClipper` act as their folklore does, and
  count the steps on which they acted: a run that clamps every step is visible.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field
from typing import Iterable, Literal, Sequence

import torch
from torch import nn

_SHOWN = 5  # positions and subjects named in one message


class NonFiniteError(FloatingPointError):
    """A NaN or Inf where training cannot survive it; the message names where."""


def _ids(subject_ids: Sequence[str] | None, items: Iterable[int]) -> str:
    items = sorted(set(items))
    if subject_ids is None:
        return "batch item(s) " + ", ".join(str(i) for i in items[:_SHOWN])
    named = [str(subject_ids[i]) if i < len(subject_ids) else f"item {i}" for i in items]
    more = f" and {len(named) - _SHOWN} more" if len(named) > _SHOWN else ""
    return "subject(s) " + ", ".join(named[:_SHOWN]) + more


class NaNGuard(nn.Module):
    """The network's input, checked: ``mode`` "raise" (default), "replace" or "warn".

    Give it the batch's subject ids before the forward pass (``guard.set_batch(ids)``;
    ``make_dataloader`` batches carry them as ``batch["subject_id"]``) so that a message
    names people, not batch positions. In "replace" mode non-finite values become
    ``fill`` and each event is kept in :attr:`events` (step, count, subjects).
    """

    def __init__(self, mode: Literal["raise", "replace", "warn"] = "raise",
                 fill: float = 0.0, name: str = "input"):
        super().__init__()
        if mode not in ("raise", "replace", "warn"):
            raise ValueError(f"NaNGuard mode must be 'raise', 'replace' or 'warn', got {mode!r}")
        self.mode, self.fill, self.name = mode, float(fill), name
        self.subject_ids: Sequence[str] | None = None
        self.step: int | None = None
        self.events: list[dict] = []

    def set_batch(self, subject_ids: Sequence[str] | None, step: int | None = None) -> None:
        self.subject_ids, self.step = subject_ids, step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(_all_finite(x)):
            return x
        bad = ~torch.isfinite(x)
        count = int(bad.sum())
        nan = int(torch.isnan(x).sum())
        items = bad.flatten(1).any(1).nonzero().flatten().tolist() if x.dim() > 1 else [0]
        first = [tuple(p) for p in bad.nonzero()[:_SHOWN].tolist()]
        where = f" at step {self.step}" if self.step is not None else ""
        message = (f"{count} non-finite value(s) ({nan} NaN, {count - nan} Inf) in the "
                   f"network's {self.name}{where}, from {_ids(self.subject_ids, items)}; "
                   f"first at index {first}. The cache is NaN-free when `mriprep check` "
                   "passes: look at what happens to the batch between the loader and the "
                   "model (augmentation, normalisation)")
        if self.mode == "raise":
            raise NonFiniteError(message)
        if self.mode == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return x
        self.events.append({"step": self.step, "count": count,
                            "subjects": [self.subject_ids[i] for i in items]
                            if self.subject_ids is not None else items})
        return torch.nan_to_num(x, nan=self.fill, posinf=self.fill, neginf=self.fill)


@dataclass
class _Flag:
    name: str
    finite: torch.Tensor


class NonFiniteLocator:
    """Name the first module of ``model`` whose output or gradient is not finite.

    ``with NonFiniteLocator(model): loss = ...; loss.backward()`` watches one step; a
    locator kept across steps is entered with the step's context:
    ``with locator(step=i, subject_ids=batch["subject_id"]): ...``. On leaving, it raises
    :class:`NonFiniteError` naming the module (its qualified name in the model), the
    pass ("forward": the first module, in execution order, whose output is not finite
    although its input was; "backward": the first module, in the order gradients flow,
    whose input gradient is not finite although its output gradient was), the step
    and the subjects. A non-finite model input or loss gradient is named as such.

    With ``parameters`` (default: as ``backward``) it then checks the parameter
    gradients as they stand on leaving (after ``backward()``, before the optimiser
    step): every activation gradient can be finite while a weight's gradient, a sum of
    products over the whole batch, overflows (float16 under autocast; what GradScaler's
    ``found_inf`` sees). Those are named by their qualified parameter name
    (``'enc.3.conv.weight'``). All gradients are reduced in one fused
    ``torch._foreach_norm`` (max-abs: NaN and Inf survive it, finite values cannot
    overflow it) and read with one synchronisation. Under a float16 GradScaler an Inf
    gradient is routine (the scaler skips that step): pass ``parameters=False`` there.
    """

    def __init__(self, model: nn.Module, backward: bool = True,
                 parameters: bool | None = None):
        self.model = model
        self.backward = backward
        self.parameters = backward if parameters is None else parameters
        self.step: int | None = None
        self.subject_ids: Sequence[str] | None = None
        self._handles: list = []
        self._forward: list[_Flag] = []
        self._backward: list[_Flag] = []  # output gradients, in the order they flow
        self._leaves: set[str] = set()
        self._seen: dict[int, weakref.ref] = {}
        self._input: torch.Tensor | None = None

    def __call__(self, step: int | None = None,
                 subject_ids: Sequence[str] | None = None) -> "NonFiniteLocator":
        self.step, self.subject_ids = step, subject_ids
        return self

    def __enter__(self) -> "NonFiniteLocator":
        self._forward, self._backward, self._leaves, self._seen = [], [], set(), {}
        self._input = None
        self._handles.append(self.model.register_forward_pre_hook(self._input_hook))
        for name, module in self.model.named_modules():
            label = name or type(module).__name__
            self._handles.append(module.register_forward_hook(self._forward_hook(label)))
        return self

    def __exit__(self, kind, value, traceback) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if kind is None:
            self.check()

    def check(self) -> None:
        """Raise :class:`NonFiniteError` for the first non-finite place seen, if any."""
        step = f" at step {self.step}" if self.step is not None else ""
        who = f" for {_ids(self.subject_ids, range(len(self.subject_ids)))}" \
            if self.subject_ids is not None else ""
        if self._input is not None and not bool(self._input):
            raise NonFiniteError(f"the model's input is not finite (forward pass, before "
                                 f"any module){step}{who}")
        first = _first_false(self._forward)
        if first is not None:
            raise NonFiniteError(f"module {self._forward[first].name!r} (forward pass) is the "
                                 f"first whose output is not finite{step}{who}")
        first = _first_false(self._backward)
        if first is not None:
            # The first gradient, in the order they flow, that is not finite is the one
            # at the output of module P: the module that took P's output made it so.
            produced = self._backward[first].name
            order = [f.name for f in self._forward]
            after = order.index(produced) + 1 if produced in order else len(order)
            consumer = next((n for n in order[after:] if n in self._leaves), None)
            if consumer is None:
                raise NonFiniteError(
                    f"the gradient reaching module {produced!r} from the loss is not finite "
                    f"(backward pass): the loss or its gradient is{step}{who}")
            raise NonFiniteError(
                f"module {consumer!r} (backward pass) is the first whose input gradient is "
                f"not finite although its output gradient was (the gradient at the output "
                f"of {produced!r} is the first non-finite one){step}{who}")
        if self.parameters:
            bad = non_finite_gradients(self.model)
            if bad:
                shown = ", ".join(repr(n) for n in bad[:_SHOWN])
                more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
                raise NonFiniteError(
                    f"the gradient of parameter(s) {shown}{more} is not finite although "
                    f"every activation and activation gradient was (backward pass, "
                    f"parameter gradients){step}{who}: the weight gradient, summed over the "
                    "batch, overflowed (float16 under autocast: use a GradScaler) or a "
                    "stale gradient was kept (call optimizer.zero_grad() every step)")

    def _input_hook(self, module, inputs):
        if self._input is None:
            self._input = _all_finite(inputs)

    def _forward_hook(self, name: str):
        def hook(module, inputs, output):
            if not any(True for _ in module.children()):
                self._leaves.add(name)
            for tensor in _tensors(output):
                # A parent's output is mostly its last child's, checked already. Weak
                # references, as an id alone is reused once a tensor is freed.
                if not tensor.is_floating_point():
                    continue
                known = self._seen.get(id(tensor))
                if known is not None and known() is tensor:
                    continue
                self._seen[id(tensor)] = weakref.ref(tensor)
                self._forward.append(_Flag(name, _all_finite(tensor)))
                if self.backward and tensor.requires_grad and torch.is_grad_enabled():
                    # A hook on the output tensor, not a full module backward hook:
                    # those refuse models with in-place layers (ReLU(inplace=True)).
                    tensor.register_hook(self._gradient_hook(name))
        return hook

    def _gradient_hook(self, name: str):
        def hook(grad):
            self._backward.append(_Flag(name, _all_finite(grad)))
        return hook


def non_finite_gradients(model: nn.Module) -> list[str]:
    """The qualified names of ``model``'s parameters whose gradient holds a NaN or Inf,
    in the model's order: one fused max-abs reduction per device and dtype
    (``torch._foreach_norm``, no host synchronisation per parameter) and one read."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return []
    groups: dict[tuple, list[int]] = {}
    for i, (_, grad) in enumerate(named):
        groups.setdefault((grad.device, grad.dtype, grad.is_sparse), []).append(i)
    device = named[0][1].device
    flags = torch.empty(len(named), dtype=torch.bool, device=device)
    for (_, _, sparse), members in groups.items():
        grads = [named[i][1] for i in members]
        if sparse:
            grads = [g.coalesce().values() for g in grads]
        norms = torch._foreach_norm(grads, float("inf"))
        index = torch.tensor(members, device=device)
        flags[index] = torch.isfinite(torch.stack(norms)).to(device)
    finite = flags.cpu()
    if bool(finite.all()):
        return []
    return [named[i][0] for i in (~finite).nonzero().flatten().tolist()]


def _first_false(flags: list[_Flag]) -> int | None:
    """The position of the first flag that is False (one synchronisation), or None."""
    if not flags:
        return None
    device = flags[0].finite.device
    finite = torch.stack([f.finite.to(device) for f in flags]).cpu()
    return None if bool(finite.all()) else int((~finite).nonzero()[0])


def _all_finite(value) -> torch.Tensor:
    """One 0-d bool tensor: every floating tensor in ``value`` is finite, without
    synchronising. Read off the tensor's minimum and maximum (one fused pass, no mask
    allocated: a tenth of the time of ``isfinite(t).all()`` on the CPU): NaN propagates
    into both, +Inf is the maximum, -Inf the minimum, and finite values cannot overflow
    them as they can a sum."""
    flags = [torch.isfinite(torch.stack(torch.aminmax(_in_memory_order(t)))).all()
             for t in _tensors(value) if t.is_floating_point() and t.numel()]
    if not flags:
        return torch.tensor(True)
    out = flags[0]
    for flag in flags[1:]:
        out = out & flag
    return out


def _in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a view in the order they lie in memory, where ``t`` is a dense
    permutation of a contiguous tensor (channels-last activations, a transpose); else
    ``t``. A whole-tensor reduction over a permuted layout walks memory by strides, at
    several times the cost of the same reduction in memory order."""
    if t.is_contiguous():
        return t
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d)), reverse=True)
    view = t.permute(order)
    return view if view.is_contiguous() else t


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


@dataclass
class GradientClamp:
    """The hooks of :func:`clamp_gradients`: ``remove()`` them; :attr:`acted` counts the
    gradients (parameter and step) that had a value beyond the limit."""

    limit: float
    handles: list = field(default_factory=list)
    _acted: list = field(default_factory=list)
    calls: int = 0

    @property
    def acted(self) -> int:
        return int(sum(int(a) for a in self._acted))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def clamp_gradients(model: nn.Module, limit: float) -> GradientClamp:
    """Clamp every parameter gradient of ``model`` to ``[-limit, limit]`` as it is
    computed; the returned handle counts how often a gradient needed it."""
    if not limit > 0:
        raise ValueError(f"clamp limit must be positive, got {limit}")
    clamp = GradientClamp(float(limit))

    def hook(grad: torch.Tensor) -> torch.Tensor:
        clamp.calls += 1
        clamp._acted.append((grad.abs() > clamp.limit).any())
        return grad.clamp(-clamp.limit, clamp.limit)

    for parameter in model.parameters():
        if parameter.requires_grad:
            clamp.handles.append(parameter.register_hook(hook))
    return clamp


@dataclass
class GradientClipper:
    """``clip_grad_norm_`` that keeps what it saw: ``clip(parameters)`` returns the total
    norm before clipping (non-finite when a gradient is: then it raises, naming it,
    rather than scaling NaN into every weight); :attr:`clipped` counts the steps it
    scaled, of :attr:`steps`."""

    max_norm: float
    steps: int = 0
    clipped: int = 0
    last_norm: float = 0.0
    norms: list = field(default_factory=list, repr=False)

    def clip(self, parameters) -> float:
        parameters = [p for p in parameters if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(parameters, self.max_norm))
        self.steps += 1
        self.last_norm = norm
        if norm != norm or norm == float("inf"):
            raise NonFiniteError(
                f"the gradient norm is {norm} at clipping step {self.steps}: a gradient "
                "is not finite; run the step under NonFiniteLocator to find the module")
        if norm > self.max_norm:
            self.clipped += 1
        return norm

    def summary(self) -> str:
        share = self.clipped / self.steps if self.steps else 0.0
        return (f"gradient norm clipped at {self.max_norm:g} on {self.clipped} of "
                f"{self.steps} steps ({share:.0%}); last norm {self.last_norm:.3g}")
