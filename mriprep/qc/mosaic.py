"""Mosaics: three planes of tiles, grey levels with coloured overlays, as JPEG bytes.

Drawn with numpy on the display grid of :mod:`mriprep.qc.views` and encoded by Pillow
(matplotlib's own image backend), not with ``nilearn.plotting``: a nilearn mosaic
resamples the whole volume and builds a matplotlib figure, about a second each, and the
report must cost a small share of a run (``make bench`` measures it). matplotlib lends
its colour tables; the legends are HTML, next to the picture. Label maps are drawn in
FreeSurfer's colours and named from the shipped FastSurfer DKT table
(:func:`label_legend`); the legend records the colours the picture was painted in.
"""

from __future__ import annotations

import csv
import functools
import io
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from PIL import Image
from scipy import ndimage

from mriprep.qc.causes import cause_table

# The causes of invalid voxels and their colours are those of mriprep.qc.causes (what
# the stages declare, and the QC's own).
OUTLINE_COLOUR = "#ff2020"
# FreeSurfer's label names and colours (see label_table).
_DKT_TABLE = Path(__file__).parents[1] / "training" / "labels" / "fastsurfer_dkt.tsv"
LABEL_TABLE_NAME = "FastSurfer's DKT table"
_GAP = 2  # pixels between tiles


def grey(tiles: dict[str, list[np.ndarray]], low: float | None = None,
         high: float | None = None) -> dict[str, list[np.ndarray]]:
    """Tiles of intensities as RGB floats in [0, 1], windowed on their own 0.5-99.5th
    percentiles of the finite values (NaN and -Inf show black, +Inf white; a constant
    image shows mid-grey)."""
    values = np.concatenate([t[np.isfinite(t)].ravel() for ts in tiles.values() for t in ts])
    if low is None or high is None:
        if values.size:
            low, high = (float(v) for v in np.percentile(values, [0.5, 99.5]))
        else:
            low, high = 0.0, 1.0
    flat = not high > low  # a constant image: mid-grey, not black, so it reads as flat
    span = high - low if not flat else 1.0
    out = {}
    for plane, ts in tiles.items():
        out[plane] = []
        for t in ts:
            with np.errstate(invalid="ignore"):
                g = np.clip((np.nan_to_num(t, nan=low, posinf=high, neginf=low) - low) / span,
                            0.0, 1.0)
            if flat:
                g = np.where(np.isfinite(t), 0.5, 0.0)
            out[plane].append(np.repeat(g[..., None], 3, axis=-1).astype(np.float32))
    return out


def paint(rgb: np.ndarray, where: np.ndarray, colour: str, alpha: float) -> None:
    """Blend ``colour`` into ``rgb`` (in place) where ``where`` is True."""
    if where.any():
        rgb[where] = (1 - alpha) * rgb[where] + alpha * np.asarray(to_rgb(colour), np.float32)


def paint_causes(rgb: np.ndarray, causes: np.ndarray, alpha: float = 0.6) -> None:
    """Each cause code of ``causes`` in its cause's colour (:mod:`mriprep.qc.causes`)."""
    table = cause_table()
    for code in np.unique(causes):
        if code in table:
            paint(rgb, causes == code, table[code].colour, alpha)



def paint_outline(rgb: np.ndarray, mask: np.ndarray, colour: str = OUTLINE_COLOUR) -> None:
    """Draw the edge of ``mask`` (its voxels with a neighbour outside)."""
    edge = mask & ~ndimage.binary_erosion(mask, border_value=0)
    paint(rgb, edge, colour, 1.0)


def paint_labels(rgb: np.ndarray, label: np.ndarray, colours: dict[int, str] | None = None,
                 alpha: float = 0.45) -> None:
    """Each non-zero label value in its colour of ``colours`` (value -> colour, as
    :func:`label_legend` gives them), else of matplotlib's tab20 table."""
    for value in np.unique(label):
        if value != 0:
            colour = colours.get(int(value)) if colours is not None else None
            paint(rgb, label == value, colour or label_colour(int(value)), alpha)


def label_colour(value: int) -> str:
    """The colour of a label value no table names (matplotlib's tab20, by value)."""
    table = colormaps["tab20"].colors
    return _hex(table[int(value) % len(table)])


@functools.lru_cache(maxsize=1)
def label_table() -> dict[int, tuple[str, str]]:
    """Value -> (name, colour) of the shipped FastSurfer DKT table, in FreeSurfer's
    numbering and colours (``mriprep/training/labels/fastsurfer_dkt.tsv``).

    Read here as the plain TSV it is, not through :func:`mriprep.training.labels.read_lut`:
    importing the training package loads torch into every run worker that draws a label
    map (about 180 MB and 2 s each, measured 2026-12-06).
    """
    table = {}
    with open(_DKT_TABLE, newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            rgb = (int(row["R"]) / 255, int(row["G"]) / 255, int(row["B"]) / 255)
            table[int(row["ID"])] = (row["LabelName"], _hex(rgb))
    return table


# When a map's values are FreeSurfer's (label_legend): an aseg alone has about 40.
FREESURFER_MIN_NAMED = 10
FREESURFER_SHARE = 0.8


def label_legend(values, map_values=None) -> list[dict]:
    """The legend of the label values a picture shows: value, name and colour each, and
    whether the table names it (``in_table``).

    The table's names and colours are used when the map is numbered as FreeSurfer numbers
    its labels: when the table names at least :data:`FREESURFER_MIN_NAMED` of its values
    and :data:`FREESURFER_SHARE` of them (an aparc+aseg map has a few the DKT table lacks,
    such as the corpus callosum; a map of a few classes, tissue classes 1-4 say, would
    pass a share alone, with 2 named white matter). A value the table lacks, or every
    value of a map numbered otherwise, is "label N" in a colour of tab20, with
    ``in_table`` False. ``map_values``: every value of the map, when the picture shows
    some of them only (the numbering is the map's, not its tiles').
    """
    table = label_table()
    values = sorted({int(v) for v in values if int(v) != 0})
    numbering = values if map_values is None else {int(v) for v in map_values if int(v)}
    named = sum(v in table for v in numbering)
    freesurfer = (named >= FREESURFER_MIN_NAMED
                  and named >= FREESURFER_SHARE * len(numbering))
    out = []
    for value in values:
        if freesurfer and value in table:
            name, colour = table[value]
            out.append(dict(value=value, name=name, colour=colour, in_table=True))
        else:
            out.append(dict(value=value, name=f"label {value}", colour=label_colour(value),
                            in_table=False))
    return out


def compose(tiles: dict[str, list[np.ndarray]]) -> np.ndarray:
    """One uint8 RGB picture: a row of tiles per plane, tiles centred in equal cells."""
    height = max(t.shape[0] for ts in tiles.values() for t in ts)
    width = max(t.shape[1] for ts in tiles.values() for t in ts)
    n_cols = max(len(ts) for ts in tiles.values())
    out = np.zeros((len(tiles) * (height + _GAP) - _GAP, n_cols * (width + _GAP) - _GAP, 3),
                   dtype=np.float32)
    for r, ts in enumerate(tiles.values()):
        for c, t in enumerate(ts):
            top = r * (height + _GAP) + (height - t.shape[0]) // 2
            left = c * (width + _GAP) + (width - t.shape[1]) // 2
            out[top:top + t.shape[0], left:left + t.shape[1]] = t
    return (out * 255 + 0.5).astype(np.uint8)


def encode_jpeg(picture: np.ndarray, quality: int = 85) -> bytes:
    """JPEG bytes; full chroma resolution, so that one-pixel coloured outlines stay sharp.

    JPEG over PNG: fast, and a fraction of PNG's size on anatomy (docs/benchmarks.md,
    "QC"), where 1,000 subjects of four mosaics each must stay a few hundred MB at most.
    """
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, "JPEG", quality=quality, subsampling=0)
    return buffer.getvalue()


def _hex(rgb) -> str:
    return "#" + "".join(f"{int(round(c * 255)):02x}" for c in rgb[:3])
