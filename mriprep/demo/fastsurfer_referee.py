"""A referee for the FastSurfer training data: FastSurfer's rules, restated independently.

This module shares no code with :mod:`mriprep.training.labels` or
:mod:`mriprep.outputs.fastsurfer_hdf5`; it restates, step by step and in the order
FastSurfer's ``generate_hdf5.py`` applies them, what that script does to one subject
(``orig.mgz`` and ``aparc.DKTatlas+aseg.mgz`` in their voxel order):

1. read the LUT (tab-separated with a header, or FreeSurfer's whitespace text);
   the classes are its rows; the sagittal classes the rows not named ``Left-*`` or
   ``ctx-rh*``; the left/right pairs are ``Left-X``/``Right-X`` by name;
2. ``aparc`` processing: fixed rewrites (80->77, 85->0, 62->41, 30->2, 72->24, 29/61/3/42
   ->0), unknown parcels 1000/2000 filled from the blurred neighbouring parcels, right
   parcels moved to the left (minus 1000) except those FastSurfer keeps, chosen by the
   values *before* the rewrites;
3. the lookup to class indices; for the sagittal view first every 2xxx minus 1000 and
   every ``Left-X`` to ``Right-X``;
4. the weight mask: median frequency balancing capped at ``max_w``, plus ``edge_w``
   where ``numpy.gradient`` is non-zero. FastSurfer looks the class weights up by
   position among the classes present (``weights_by="position"``, the default): the
   same as by class on a map holding every class up to its highest, an IndexError on
   one that lacks a class below it, as FastSurfer's ``create_weight_mask`` raises.
   ``weights_by="class"`` looks them up by class, the rule as its code means it and as
   mriprep computes it;
5. the view's transpose (``moveaxis``), thick slices by edge padding and a sliding
   window, and the blank-slice filter on the sum of class values.

Used by the tests (voxel-for-voxel comparison) and by ``make bench`` (fastsurfer) as the
serial ``generate_hdf5`` loop.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.ndimage import binary_dilation, gaussian_filter, generate_binary_structure

FASTSURFER_KEEPS_RIGHT = [2014, 2028, 2012, 2016, 2002, 2023, 2017, 2024, 2010, 2013, 2025,
                          2022, 2021, 2005]


def read_lut_rows(path) -> list[tuple[int, str]]:
    path = Path(path)
    rows = []
    if path.suffix == ".tsv":
        with open(path, newline="") as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                rows.append((int(rec["ID"]), rec["LabelName"]))
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            parts = line.split()
            rows.append((int(parts[0]), parts[1]))
    return rows


def class_lists(rows, sag_mask=("Left-", "ctx-rh")):
    labels = np.array([i for i, _ in rows])
    labels_sag = np.array([i for i, n in rows if not n.startswith(sag_mask)])
    left = {n[len("Left-"):]: i for i, n in rows if n.startswith("Left-")}
    right = {n[len("Right-"):]: i for i, n in rows if n.startswith("Right-")}
    pairs = {left[k]: right[k] for k in left if k in right}
    return labels, labels_sag, pairs


def _fill(gt, unknown_label, cortex_stop):
    unknown = gt == unknown_label
    ring = binary_dilation(unknown, generate_binary_structure(3, 2)) ^ unknown
    parcels = np.unique(gt[ring])
    parcels = parcels[(parcels > unknown_label) & (parcels < cortex_stop)]
    if len(parcels) == 0:
        return gt
    blur = np.stack([gaussian_filter(1000 * (gt == p).astype(float), sigma=5)
                     for p in parcels], axis=-1)
    nearest = parcels[np.argmax(blur, axis=-1)]
    gt[unknown] = nearest[unknown]
    return gt


def aparc_processing(aseg):
    before = aseg.copy()
    for a, b in [(80, 77), (85, 0), (62, 41), (30, 2), (72, 24), (29, 0), (61, 0), (3, 0),
                 (42, 0)]:
        aseg[aseg == a] = b
    if np.any(aseg == 1000):
        aseg = _fill(aseg, 1000, 2000)
    if np.any(aseg == 2000):
        aseg = _fill(aseg, 2000, 3000)
    right = (aseg >= 2000) & (aseg <= 2999)
    aseg[right] = aseg[right] - 1000
    for v in FASTSURFER_KEEPS_RIGHT:
        aseg[before == v] = v
    return aseg


def map_to_classes(aseg, labels, labels_sag, pairs):
    """FastSurfer's ``map_aparc_aseg2label`` with ``aparc`` processing: (full, sagittal)."""
    aseg = aparc_processing(np.array(aseg, dtype=np.int64))
    missing = set(np.unique(aseg).tolist()) - set(labels.tolist())
    if missing:
        raise ValueError(f"values {sorted(missing)} are not listed in the LUT")
    lut = np.zeros(labels.max() + 1, dtype=int)
    for idx, value in enumerate(labels):
        lut[value] = idx
    full = lut[aseg]
    ctx = (aseg >= 2000) & (aseg <= 2999)
    aseg[ctx] -= 1000
    for left, right in pairs.items():
        aseg[aseg == left] = right
    lut_sag = np.zeros(labels_sag.max() + 1, dtype=int)
    for idx, value in enumerate(labels_sag):
        lut_sag[value] = idx
    return full, lut_sag[aseg]


def weight_mask(mapped, max_w=5, edge_w=5, gradient=True, by="position"):
    """FastSurfer's ``create_weight_mask`` without its hires and cortex options; ``by``:
    how the class weights are looked up (module doc, step 4)."""
    values, counts = np.unique(mapped, return_counts=True)
    per_class = np.minimum(np.median(counts) / counts, max_w)
    if by == "position":
        weights = per_class[mapped]  # FastSurfer's indexing: the i-th class present
    elif by == "class":
        by_class = np.zeros(int(values.max()) + 1)
        by_class[values] = per_class
        weights = by_class[mapped]
    else:
        raise ValueError(f"weights by 'position' or 'class', not {by!r}")
    if gradient:
        gx, gy, gz = np.gradient(mapped)
        weights = weights + edge_w * (np.sqrt(gx ** 2 + gy ** 2 + gz ** 2) > 0)
    return weights


def to_plane(vol, plane):
    if plane == "sagittal":
        return np.moveaxis(vol, [0, 1, 2], [2, 1, 0])
    if plane == "axial":
        return np.moveaxis(vol, [0, 1, 2], [1, 2, 0])
    return vol


def plane_zoom(zoom, plane):
    zoom = tuple(zoom)
    return {"sagittal": zoom[::-1][:2], "axial": zoom[1:], "coronal": zoom[:2]}[plane]


def referee_subject(orig, aseg, zoom, lut_path, plane="coronal", thickness=3, blt=50,
                    max_w=5, edge_w=5, weights_by="position"):
    """One subject as ``generate_hdf5`` would store it: (orig [N,H,W,2t+1] uint8,
    aseg [N,H,W] uint8, weight [N,H,W] float64, zoom pair); ``weights_by`` as
    :func:`weight_mask`'s ``by``."""
    labels, labels_sag, pairs = class_lists(read_lut_rows(lut_path))
    full, sag = map_to_classes(aseg, labels, labels_sag, pairs)
    mapped = sag if plane == "sagittal" else full
    weights = weight_mask(mapped, max_w, edge_w, by=weights_by)
    orig, mapped, weights = (to_plane(v, plane) for v in (orig, mapped, weights))
    padded = np.pad(orig, ((0, 0), (0, 0), (thickness, thickness)), mode="edge")
    thick = sliding_window_view(padded, 2 * thickness + 1, axis=2)
    keep = np.sum(mapped, axis=(0, 1)) > blt
    thick, mapped, weights = thick[:, :, keep, :], mapped[:, :, keep], weights[:, :, keep]
    return (np.transpose(thick, (2, 0, 1, 3)).astype(np.uint8),
            np.transpose(mapped, (2, 0, 1)).astype(np.uint8),
            np.transpose(weights, (2, 0, 1)).astype(float),
            plane_zoom(zoom, plane))
