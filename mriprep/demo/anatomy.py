"""People who are not the template: anatomies built from MNI152, or read from real scans.

A registration template is the average of many people; a real subject is one person,
with other folds, another head size, a scalp, a neck and another scanner's contrast. The
first build calibrated its checks on copies of the template, and refused every real scan.
This module makes the anatomies everything else is calibrated and tested on:

* :func:`synthetic_person` warps the MNI152 template (and its tissue maps) by a smooth
  random nonlinear displacement of several mm and a head-size scale, remaps its tissue
  intensities to a random T1 contrast profile (or to a T2-like one, as a failure case),
  and wraps the brain in synthesized CSF, skull, scalp and a neck;
* :func:`real_anatomy` wraps a real scan (Colin27 and the macaque of Debian's
  ``mricron-data``, see :mod:`mriprep.demo.real_scans`) in the same type.

An :class:`Anatomy` lives in its own world ("anatomy space", RAS+ mm). For a synthetic
person the rigid truth is known: ``template_to_anatomy`` is the least-squares rigid fit,
over the template's brain, of where each template point went. A scanner
(:mod:`mriprep.demo.scanner`) then moves the anatomy by a known pose and samples it.

Everything is determined by the random generator passed in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from nibabel.affines import apply_affine, voxel_sizes
from scipy import ndimage

# Canvas: the template grid extended downwards, so that a neck fits below the brain
# (the MNI152 grid ends at the brainstem, 72 mm below the AC).
NECK_EXTENSION_MM = 90
# Tissue classes of the label map; non-brain head tissue is background (0).
CSF, GM, WM = 1, 2, 3

Contrast = Literal["t1", "t2"]


@dataclass(frozen=True)
class Anatomy:
    """One person's head on a voxel grid in anatomy space.

    Attributes
    ----------
    image : ndarray (float32)
        Noise-free intensities, white matter near 1 (synthetic) or as scanned (real).
    labels : ndarray (uint8) or None
        0 background and non-brain tissue, 1 CSF, 2 GM, 3 WM (synthetic people only).
    affine : ndarray, shape (4, 4)
        Voxel indices to anatomy-space RAS+ mm.
    template_to_anatomy : ndarray, shape (4, 4) or None
        The rigid map from template space to anatomy space that best explains the
        anatomy (least squares over the template brain); None for a real scan, whose
        rigid truth is only known relative to its own poses.
    name : str
    details : dict
        How it was made (warp size, head scale, contrast levels...).
    mni_frame : ndarray, shape (4, 4)
        An approximate map from anatomy space to MNI152's world, for placing edits that
        are defined in the template's frame (the defacing plane); never a truth to score
        against. The identity for synthetic people (their anatomy space is MNI152's,
        warped) and Colin27; see :mod:`mriprep.demo.real_scans` for the other real heads.
    """

    image: np.ndarray
    labels: np.ndarray | None
    affine: np.ndarray
    template_to_anatomy: np.ndarray | None
    name: str
    details: dict = field(default_factory=dict)
    mni_frame: np.ndarray = field(default_factory=lambda: np.eye(4))

    def head_points(self, step: int = 4) -> np.ndarray:
        """Anatomy-space points (mm) of the head, every ``step``-th voxel per axis."""
        image = self.image[::step, ::step, ::step]
        ijk = np.argwhere(image > 0.05 * np.percentile(image[image > 0], 99)) * step
        return apply_affine(self.affine, ijk)


@dataclass(frozen=True)
class _Template:
    """MNI152 on the canvas: intensities, brain mask, tissue labels and class levels."""

    t1: np.ndarray
    brain: np.ndarray
    labels: np.ndarray
    affine: np.ndarray
    levels: dict  # median template intensity of CSF, GM and WM


@functools.lru_cache(maxsize=1)
def _template_on_canvas() -> _Template:
    from mriprep.stages.registration.template import template_brain_mask
    from mriprep.inputs.templates import load_mni152_tissue, load_template

    template = load_template("mni152")
    tissue = load_mni152_tissue()
    brain = template_brain_mask("mni152")
    gm, wm = tissue["gm"], tissue["wm"]
    labels = np.zeros(template.shape, dtype=np.uint8)
    labels[brain] = CSF
    labels[brain & (gm >= 0.5) & (gm >= wm)] = GM
    labels[brain & (wm >= 0.5) & (wm > gm)] = WM
    levels = {c: float(np.median(template.data[labels == c])) for c in (CSF, GM, WM)}
    pad = ((0, 0), (0, 0), (NECK_EXTENSION_MM, 0))
    affine = template.affine.copy()
    affine[:3, 3] -= affine[:3, 2] * NECK_EXTENSION_MM
    return _Template(
        t1=np.pad(template.data, pad), brain=np.pad(brain, pad), labels=np.pad(labels, pad),
        affine=affine, levels=levels,
    )


def contrast_levels(rng: np.random.Generator, contrast: Contrast = "t1") -> dict:
    """Tissue intensities relative to white matter: a random scanner's T1 contrast.

    T1 (MPRAGE to SPGR): GM 0.55-0.82 of WM, CSF 0.12-0.35, scalp fat 0.7-1.1. The
    T2-like profile inverts brain contrast (CSF brightest, WM darkest), as a T2 scan or
    a mislabeled sequence does.
    """
    if contrast == "t1":
        return {"csf": rng.uniform(0.12, 0.35), "gm": rng.uniform(0.55, 0.82), "wm": 1.0,
                "fat": rng.uniform(0.7, 1.1), "muscle": rng.uniform(0.35, 0.55),
                "bone": rng.uniform(0.03, 0.1), "marrow": rng.uniform(0.25, 0.5)}
    if contrast == "t2":
        return {"csf": 1.0, "gm": rng.uniform(0.5, 0.65), "wm": rng.uniform(0.3, 0.45),
                "fat": rng.uniform(0.4, 0.6), "muscle": rng.uniform(0.15, 0.25),
                "bone": rng.uniform(0.02, 0.06), "marrow": rng.uniform(0.2, 0.35)}
    raise ValueError(f"contrast must be 't1' or 't2', got {contrast!r}")


def synthetic_person(
    rng: np.random.Generator,
    warp_rms_mm: float = 2.5,
    head_scale: float | tuple[float, float, float] | None = None,
    contrast: Contrast = "t1",
    name: str = "person",
) -> Anatomy:
    """A person made from MNI152: warped, rescaled, recontrasted, with scalp and neck.

    Parameters
    ----------
    rng : numpy.random.Generator
        Every random choice comes from it.
    warp_rms_mm : float
        Root-mean-square displacement over the brain of the smooth nonlinear warp (its
        rigid part removed); maxima reach about three times this. Between adult brains
        registered affinely, residual displacements of 2-4 mm RMS are typical.
    head_scale : float or 3 floats, optional
        Linear size relative to the template, per axis (default: random 0.9-1.08 per
        axis, adult human heads). A macaque brain is about 0.45.
    contrast : {"t1", "t2"}
        Tissue contrast profile (see :func:`contrast_levels`).
    name : str

    Returns
    -------
    Anatomy
        On the MNI152 grid extended by :data:`NECK_EXTENSION_MM` below, with labels and
        the rigid truth ``template_to_anatomy``.
    """
    base = _template_on_canvas()
    levels = contrast_levels(rng, contrast)
    head = _synthesize_head(base, levels, rng)
    if head_scale is None:
        head_scale = rng.uniform(0.9, 1.08, size=3)
    scale = np.broadcast_to(np.asarray(head_scale, dtype=float), (3,))

    # phi: anatomy point -> template point. A smooth random field u, a head-size scaling
    # about the brain's centre, and then its best rigid fit removed, so that the warp
    # carries no pose of its own.
    shape = base.t1.shape
    centre = apply_affine(base.affine, np.argwhere(base.brain).mean(axis=0))
    u = _smooth_field(shape, rng, spacing_mm=24.0)
    brain_ijk = np.argwhere(base.brain[::3, ::3, ::3]) * 3
    brain_mm = apply_affine(base.affine, brain_ijk)
    u_brain = u[:, brain_ijk[:, 0], brain_ijk[:, 1], brain_ijk[:, 2]].T
    gain = warp_rms_mm / np.sqrt(np.mean(np.sum(u_brain**2, axis=1)))
    u *= gain
    u_brain *= gain
    targets = centre + (brain_mm - centre) / scale + u_brain
    correction = rigid_fit(brain_mm, targets)  # anatomy -> template, rigid part
    # phi(x) = inverse(correction) applied to (centre + (x - centre)/scale + u(x)) makes
    # the rigid part of phi the identity; in voxel terms for the canvas:
    inverse = np.linalg.inv(correction)
    image, labels = _warp(head, base, u, scale, centre, inverse)

    # The rigid truth: fit template points phi(x) -> x over the brain.
    warped_targets = apply_affine(inverse, targets)
    template_to_anatomy = rigid_fit(warped_targets, brain_mm)
    displacement = np.linalg.norm(warped_targets - brain_mm, axis=1)
    details = {
        "contrast": contrast,
        "levels": {k: round(float(v), 4) for k, v in levels.items()},
        "head_scale": [round(float(s), 4) for s in scale],
        "warp_rms_mm": round(float(warp_rms_mm), 3),
        "warp_max_mm": round(float(displacement.max()), 3),
    }
    return Anatomy(image, labels, base.affine.copy(), template_to_anatomy, name, details)


def _synthesize_head(base: _Template, levels: dict, rng: np.random.Generator) -> np.ndarray:
    """The template brain in ``levels``' contrast, inside CSF, skull, scalp and a neck.

    Layers follow the distance from the brain, each with a smoothly varying thickness;
    below the brain, an elliptical neck of muscle under subcutaneous fat, around a
    spinal cord. Intensities relative to white matter.
    """
    t = base.levels
    # Brain: a piecewise-linear map through the template's class levels keeps the
    # texture (partial volumes, deep grey nuclei) while changing the contrast.
    brain = np.interp(base.t1[base.brain], [0.0, t[CSF], t[GM], t[WM], 1.0],
                      [levels["csf"] * 0.8, levels["csf"], levels["gm"], levels["wm"],
                       levels["wm"] * 1.08]).astype(np.float32)
    distance = _distance_outside_brain()
    shape = base.t1.shape
    # One smooth field in [0, 1] sets every layer's thickness: a thick skull goes with
    # a thick scalp, which is also how heads differ.
    field = _smooth_field(shape, rng, spacing_mm=40.0, components=1)[0]
    field -= field.min()
    field /= max(float(field.max()), 1e-6)
    csf_out = 1.0 + 2.0 * field
    skull_out = csf_out + rng.uniform(3.5, 5.0) + 3.0 * field
    scalp_out = skull_out + rng.uniform(3.5, 5.0) + 3.0 * field
    head = np.zeros(shape, dtype=np.float32)
    head[distance <= scalp_out] = levels["fat"]
    skull = (distance > csf_out) & (distance <= skull_out)
    head[skull] = levels["bone"]
    marrow = skull & (np.abs(distance - (csf_out + skull_out) / 2)
                      < 0.2 * (skull_out - csf_out))
    head[marrow] = levels["marrow"]
    head[(distance > 0) & (distance <= csf_out)] = levels["csf"]

    # Neck: from the bottom of the canvas up to the skull base, behind the face.
    ijk = np.indices(shape, sparse=True)
    x = base.affine[0, 0] * ijk[0] + base.affine[0, 3]
    y = base.affine[1, 1] * ijk[1] + base.affine[1, 3]
    z = base.affine[2, 2] * ijk[2] + base.affine[2, 3]
    rx, ry, cy = rng.uniform(48, 60), rng.uniform(52, 64), rng.uniform(-28, -15)
    top = -45.0  # the neck merges into the head under the temporal lobes
    radial = np.sqrt((x / rx) ** 2 + ((y - cy) / ry) ** 2)
    neck = (radial <= 1.0) & (z <= top) & (distance > 0)
    head[neck] = levels["muscle"]
    head[neck & (radial > 1.0 - 6.0 / rx)] = levels["fat"]
    cord = np.sqrt(x**2 + (y - (cy - 12)) ** 2) <= 5.0
    head[cord & (z <= -60) & (distance > 0)] = levels["wm"] * 0.9
    head *= 1.0 + 0.04 * _smooth_field(shape, rng, spacing_mm=8.0, components=1)[0]
    head[base.brain] = brain
    return head


@functools.lru_cache(maxsize=1)
def _distance_outside_brain() -> np.ndarray:
    """Distance (mm) of every canvas voxel from the template brain (0 inside)."""
    base = _template_on_canvas()
    return ndimage.distance_transform_edt(
        ~base.brain, sampling=voxel_sizes(base.affine)).astype(np.float32)


def _smooth_field(shape, rng: np.random.Generator, spacing_mm: float,
                  components: int = 3) -> np.ndarray:
    """Smooth random fields on a 1 mm grid of ``shape``, each component of unit RMS.

    Unit Gaussian knots every ``spacing_mm`` are interpolated by cubic splines onto a
    grid of about a fifth of the knot spacing, then linearly onto ``shape``: the field
    varies on the knots' scale, so the last, cheap step changes nothing visible (a cubic
    spline straight onto a 1 mm head grid was slow: docs/benchmarks.md, "Demo data").
    """
    coarse = tuple(max(2, int(np.ceil(n / spacing_mm)) + 1) for n in shape)
    step = max(3.0, spacing_mm / 5.0)
    middle = tuple(max(2, int(np.ceil(n / step)) + 1) for n in shape)
    out = np.empty((components, *shape), dtype=np.float32)
    for c in range(components):
        knots = rng.standard_normal(coarse)
        field = ndimage.zoom(knots, [(m - 1) / (k - 1) for m, k in zip(middle, coarse)],
                             order=3, grid_mode=False).astype(np.float32)
        # The spline's grid comes out a little larger than ``middle``: stretched by
        # (n - 1) / (m - 1) it reaches at least ``shape``, and only ``shape`` is kept.
        stretched = tuple(int(round(f * ((n - 1) / (m - 1))))
                          for f, n, m in zip(field.shape, shape, middle))
        field = _linear_zoom(field, stretched, shape)
        out[c] = field / max(float(np.sqrt(np.mean(field**2))), 1e-6)
    return out


def _linear_zoom(field: np.ndarray, stretched: tuple[int, ...],
                 shape: tuple[int, ...]) -> np.ndarray:
    """The first ``shape`` voxels of ``field`` linearly zoomed onto ``stretched``, corner
    to corner (``ndimage.zoom(order=1, grid_mode=False)`` then a crop, to rounding).

    One axis at a time, and only the voxels kept: a fourth of the CPU of a 3D zoom, which
    had been half of building a person (docs/benchmarks.md, "Demo data")."""
    for axis, (size, stretch) in enumerate(zip(shape, stretched)):
        n_in = field.shape[axis]
        position = np.arange(size) * ((n_in - 1) / (stretch - 1))
        below = np.minimum(np.floor(position).astype(np.intp), n_in - 2)
        weight = (position - below).astype(np.float32)
        weight = weight.reshape([-1 if a == axis else 1 for a in range(field.ndim)])
        low = np.take(field, below, axis=axis)
        step = np.take(field, below + 1, axis=axis)
        step -= low
        step *= weight
        low += step
        field = low
    return field


def _warp(head, base: _Template, u, scale, centre, inverse) -> tuple[np.ndarray, np.ndarray]:
    """Pull the head and labels back through phi(x) = inverse(c + (x - c)/s + u(x)).

    The canvas affine is diagonal, so each voxel coordinate is a sum of per-axis terms
    and the smooth field: no grid of coordinates is built.
    """
    shape = head.shape
    to_voxel = np.linalg.inv(base.affine) @ inverse
    axes = []  # anatomy mm of each axis, scaled about the centre
    for axis in range(3):
        mm = base.affine[axis, axis] * np.arange(shape[axis]) + base.affine[axis, 3]
        view = [1, 1, 1]
        view[axis] = shape[axis]
        axes.append((centre[axis] + (mm - centre[axis]) / scale[axis]).reshape(view))
    coords = np.empty((3, *shape), dtype=np.float32)
    for k in range(3):
        m = to_voxel[k, :3]
        coords[k] = m[0] * u[0]
        coords[k] += m[1] * u[1]
        coords[k] += m[2] * u[2]
        coords[k] += (m[0] * axes[0] + m[1] * axes[1] + m[2] * axes[2]
                      + to_voxel[k, 3]).astype(np.float32)
    image = ndimage.map_coordinates(head, coords, order=1, mode="constant", cval=0.0,
                                    output=np.float32)
    labels = ndimage.map_coordinates(base.labels, coords, order=0, mode="constant",
                                     cval=0, output=np.uint8)
    return image, labels


def rigid_fit(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The rigid 4x4 that best maps ``source`` points onto ``target`` points (least
    squares, Kabsch), both of shape (n, 3)."""
    src_mean, tgt_mean = source.mean(axis=0), target.mean(axis=0)
    h = (source - src_mean).T @ (target - tgt_mean)
    u, _, vt = np.linalg.svd(h)
    d = np.sign(np.linalg.det(vt.T @ u.T))
    rotation = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    matrix = np.eye(4)
    matrix[:3, :3] = rotation
    matrix[:3, 3] = tgt_mean - rotation @ src_mean
    return matrix


def real_anatomy(path, name: str | None = None, brain_mask=None,
                 mni_frame: np.ndarray | None = None) -> Anatomy:
    """A real scan as an anatomy: its voxels and affine, no labels, no rigid truth.

    The file is read as ``mriprep run`` reads it (:func:`~mriprep.inputs.readers.load_volume`:
    a 4-D file with one volume is a 3-D volume), in RAS+ voxel order. ``brain_mask``, an
    image on the same grid, keeps only the voxels it marks (a skull-stripped copy, with
    exact zeros elsewhere, as a brain extraction writes them); ``mni_frame`` is the
    anatomy's approximate frame in MNI152 space (identity when None).
    """
    from mriprep.inputs.readers import load_volume
    from mriprep.stages.reorient import reoriented

    volume = reoriented(load_volume(path), "RAS", contiguous=True)
    image = volume.data
    if brain_mask is not None:
        mask = reoriented(load_volume(brain_mask), "RAS", contiguous=True)
        if mask.shape != volume.shape or not np.allclose(mask.affine, volume.affine,
                                                          atol=1e-4):
            raise ValueError(f"brain mask {brain_mask} is not on the grid of {path}")
        image = np.where(mask.data > 0.5, image, np.float32(0.0))
    frame = np.eye(4) if mni_frame is None else np.asarray(mni_frame, dtype=float)
    return Anatomy(image.astype(np.float32), None, volume.affine.copy(), None,
                   name or str(path), mni_frame=frame)
