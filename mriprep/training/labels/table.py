"""FreeSurfer label values to contiguous classes, per view, as FastSurfer trains on them.

A :class:`LabelTable` is built from a lookup table (:func:`~.lut.read_lut`): class ``c``
of the axial and coronal views is the table's ``c``-th row. The sagittal view cannot
tell left from right, so its classes merge each lateralised pair, following FastSurfer:

* rows whose name starts with one of ``sag_mask`` (default ``Left-`` and ``ctx-rh``) are
  not sagittal classes;
* a ``Left-X`` voxel takes the class of ``Right-X``; a ``ctx-rh-X`` voxel that of
  ``ctx-lh-X`` (FreeSurfer numbers them 1000 apart).

Every masked row must have its partner in the table: FastSurfer would send an unpartnered
one to background without a word, here it is an error naming the row.

:meth:`LabelTable.map` rewrites a label map (:mod:`.aparc` rules) and looks it up. A value
the table does not list is an error naming the values and the subject, or with
``unknown="background"`` becomes class 0 and is counted. :meth:`to_freesurfer` maps a
prediction's classes back to FreeSurfer numbers. :meth:`lr_swap` gives the class
permutation of a left-right mirror (for augmentation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from mriprep.core.errors import InputError
from mriprep.core.hashing import hash_json
from mriprep.training.labels.aparc import Prepared, prepare_labels, rewritten_values
from mriprep.training.labels.lut import Lut, read_lut

VIEWS = ("axial", "coronal", "sagittal")
UNKNOWN = ("error", "background")
DKT_TABLE = "fastsurfer_dkt.tsv"


@dataclass
class Mapped:
    """A label map as classes of one view, how many voxels had no class, and what the
    rules before the lookup rewrote (rule -> voxels, :attr:`.aparc.Prepared.moved`)."""

    classes: np.ndarray   # uint8 (int16 past 255 classes)
    unknown_voxels: int
    unknown_values: tuple[int, ...]
    moved: dict[str, int] = field(default_factory=dict)


class LabelTable:
    """Classes of a lookup table for the three views (module docstring).

    Parameters
    ----------
    lut : Lut, path, or None
        The table; None is the shipped FastSurfer DKT table (79 classes, 51 sagittal).
    processing, cortex
        The rewrites before the lookup (:func:`~.aparc.prepare_labels`); FastSurfer's
        ``generate_hdf5`` defaults are ``aparc`` and ``fuse``.
    unknown : {"error", "background"}
        What a value that is not in the table does.
    sag_mask, combi
        Name prefixes left out of the sagittal classes, and the left/right prefix pair
        merged there (FastSurfer's ``--sag_mask`` and ``--combi``).
    """

    def __init__(self, lut: Lut | str | os.PathLike | None = None, *,
                 processing: str = "aparc", cortex: str = "fuse", unknown: str = "error",
                 sag_mask: tuple[str, ...] = ("Left-", "ctx-rh"),
                 combi: tuple[str, str] = ("Left-", "Right-")):
        if lut is None:
            lut = read_lut(resources.files("mriprep.training.labels") / DKT_TABLE)
        elif not isinstance(lut, Lut):
            lut = read_lut(lut)
        if unknown not in UNKNOWN:
            raise ValueError(f"unknown={unknown!r}; choose one of {UNKNOWN}")
        prepare_labels(np.zeros((1, 1, 1), np.int32), processing, cortex)  # checks both
        self.lut, self.processing, self.cortex, self.unknown = lut, processing, cortex, unknown
        self.sag_mask, self.combi = tuple(sag_mask), tuple(combi)
        self.ids = lut.ids
        self.names = lut.names
        self.sagittal_rows = np.flatnonzero(
            [not n.startswith(self.sag_mask) for n in self.names])
        self.sagittal_of_class = self._merge_for_sagittal()

    # -- class lists ---------------------------------------------------------------------

    def num_classes(self, view: str = "axial") -> int:
        return len(self.class_ids(view))

    def class_ids(self, view: str = "axial") -> np.ndarray:
        """FreeSurfer value of each class of ``view`` (class c -> ``class_ids[c]``)."""
        return self.ids[self.sagittal_rows] if _view(view) == "sagittal" else self.ids

    def class_names(self, view: str = "axial") -> tuple[str, ...]:
        rows = self.sagittal_rows if _view(view) == "sagittal" else range(len(self.ids))
        return tuple(self.names[r] for r in rows)

    def class_of_name(self, name: str, view: str = "axial") -> int:
        """The class of ``view`` that voxels labelled ``name`` get (merged in sagittal)."""
        if name not in self.names:
            raise InputError(f"region {name!r} is not in the label table {self.lut.source}; "
                             f"names look like {self.names[1]!r}")
        row = self.names.index(name)
        return int(self.sagittal_of_class[row]) if _view(view) == "sagittal" else row

    def _merge_for_sagittal(self) -> np.ndarray:
        """Sagittal class of every axial/coronal class (module docstring)."""
        index = {name: row for row, name in enumerate(self.names)}
        sag_index = {int(r): s for s, r in enumerate(self.sagittal_rows)}
        out = np.zeros(len(self.names), dtype=np.int64)
        for row, name in enumerate(self.names):
            partner = _partner(name, self.combi)
            if row in sag_index:
                out[row] = sag_index[row]
            elif partner in index and index[partner] in sag_index:
                out[row] = sag_index[index[partner]]
            else:
                raise InputError(
                    f"label table {self.lut.source}: {name!r} is left out of the sagittal "
                    f"classes but its counterpart {partner!r} is not a sagittal class; add "
                    "it to the table or change sag_mask")
        return out

    # -- mapping ------------------------------------------------------------------------

    def map(self, labels: np.ndarray, view: str = "axial", subject: str = "") -> Mapped:
        """Classes of ``view`` for a FreeSurfer-numbered label map.

        Raises
        ------
        InputError
            The map holds negative values, or cortex without parcels that the rules
            would send to background, or (``unknown="error"``) values the table does
            not list; each named with the subject.
        """
        return self.lookup(self.prepare(labels, subject), view, subject)

    def rewritten_values(self) -> frozenset[int]:
        """The values this table's rules rewrite before the lookup
        (:func:`~.aparc.rewritten_values`)."""
        return rewritten_values(self.processing, self.ids)

    def prepare(self, labels: np.ndarray, subject: str = "") -> Prepared:
        """The rules before the lookup (:func:`~.aparc.prepare_labels`), the same for
        every view: map several views of one subject from one :class:`Prepared`."""
        who = f"subject {subject}: " if subject else ""
        labels = np.asarray(labels)
        if labels.size and labels.min() < 0:
            raise InputError(f"{who}label map holds negative values (e.g. "
                             f"{int(labels.min())}); FreeSurfer labels are >= 0")
        result = prepare_labels(labels, self.processing, self.cortex, known=self.ids)
        if result.cortex_lost:
            raise InputError(
                f"{who}the label map has {' and '.join(result.cortex_lost)} cerebral "
                "cortex (3/42) but no cortical parcel (1000-2999), and the "
                f"{self.processing!r} rules would send all of it to background. It looks "
                "like aseg.mgz: use a segmentation with parcels (aparc.DKTatlas+aseg or "
                "aparc+aseg; `mriprep manifest from-freesurfer --seg`), or train an "
                "aseg table with processing='aseg' (--processing aseg)")
        return result

    def lookup(self, prepared: Prepared, view: str = "axial", subject: str = "") -> Mapped:
        """Classes of ``view`` for a map :meth:`prepare` made ready."""
        who = f"subject {subject}: " if subject else ""
        values = prepared.labels
        top = max(int(values.max(initial=0)), int(self.ids.max())) + 1
        # One lookup array over the value range (FreeSurfer's end below 15000): a gather
        # per voxel, no sort of the volume.
        row_of = np.full(top, -1, dtype=np.int64)
        row_of[self.ids] = np.arange(len(self.ids))
        counts = np.bincount(values.ravel(), minlength=top)
        missing = tuple(int(v) for v in np.flatnonzero((counts > 0) & (row_of < 0)))
        unknown_voxels = int(counts[list(missing)].sum()) if missing else 0
        if missing and self.unknown == "error":
            raise InputError(
                f"{who}label values {list(missing)} ({unknown_voxels} voxels) are not "
                f"in the label table {self.lut.source or '(in memory)'}; add them to "
                "the table, or count them as background: LabelTable(..., "
                "unknown='background') in Python, --unknown background on the command "
                "line")
        lookup = np.where(row_of < 0, 0, row_of)
        if _view(view) == "sagittal":
            lookup = np.where(row_of < 0, 0, self.sagittal_of_class[lookup])
        dtype = np.uint8 if self.num_classes(view) <= 256 else np.int16
        out = lookup.astype(dtype)[values]
        return Mapped(out, unknown_voxels, missing, dict(prepared.moved))

    def to_freesurfer(self, classes: np.ndarray, view: str = "axial") -> np.ndarray:
        """FreeSurfer values (int32) of a prediction's classes of ``view``."""
        ids = self.class_ids(view)
        classes = np.asarray(classes)
        if classes.size and (classes.min() < 0 or classes.max() >= len(ids)):
            raise ValueError(f"classes {int(classes.min())}..{int(classes.max())} lie "
                             f"outside the {view} view's 0..{len(ids) - 1}")
        return ids.astype(np.int32)[classes]

    def lr_swap(self, view: str = "axial") -> np.ndarray:
        """``perm[c]`` = the class of the mirrored structure (identity on the midline, on
        fused parcels, and in the sagittal view, whose classes are already merged)."""
        n = self.num_classes(view)
        perm = np.arange(n, dtype=np.int64)
        if _view(view) == "sagittal":
            return perm
        index = {name: row for row, name in enumerate(self.names)}
        for row, name in enumerate(self.names):
            for pair in (self.combi, ("ctx-lh-", "ctx-rh-")):
                mirrored = _swap_prefix(name, pair)
                if mirrored is not None and mirrored in index:
                    perm[row] = index[mirrored]
        return perm

    # -- identity -------------------------------------------------------------------------

    def describe(self) -> dict:
        """What decides the classes: recorded with an export and hashed."""
        return {"ids": self.ids.tolist(), "names": list(self.names),
                "processing": self.processing, "cortex": self.cortex,
                "unknown": self.unknown, "sag_mask": list(self.sag_mask),
                "combi": list(self.combi)}

    def hash(self) -> str:
        return hash_json(self.describe())

    @classmethod
    def from_description(cls, description: dict, source: str = "",
                         sha256: str | None = None) -> "LabelTable":
        """The table a :meth:`describe` recorded (in an export), checked against its
        recorded :meth:`hash` when ``sha256`` is given."""
        try:
            lut = Lut(np.asarray(description["ids"], dtype=np.int64),
                      tuple(description["names"]),
                      np.zeros((len(description["ids"]), 4), np.uint8), source)
            table = cls(lut, processing=description["processing"],
                        cortex=description["cortex"], unknown=description["unknown"],
                        sag_mask=tuple(description["sag_mask"]),
                        combi=tuple(description["combi"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{source}: the recorded label table is incomplete or "
                             f"malformed ({exc!r}); export again with this mriprep") from None
        if sha256 is not None and table.hash() != sha256:
            raise InputError(f"{source}: the recorded label table does not match its "
                             f"recorded SHA-256 {sha256[:12]}… (it hashes to "
                             f"{table.hash()[:12]}…); the file was edited after export, "
                             "export it again")
        return table


def _view(view: str) -> str:
    if view not in VIEWS:
        raise ValueError(f"view {view!r} is unknown; choose one of {VIEWS}")
    return view


def _partner(name: str, combi: tuple[str, str]) -> str:
    """The sagittal partner of a masked name: Left-X -> Right-X, ctx-rh-X -> ctx-lh-X."""
    if name.startswith(combi[0]):
        return combi[1] + name[len(combi[0]):]
    if name.startswith("ctx-rh-"):
        return "ctx-lh-" + name[len("ctx-rh-"):]
    return name


def _swap_prefix(name: str, pair: tuple[str, str]) -> str | None:
    for a, b in (pair, pair[::-1]):
        if name.startswith(a):
            return b + name[len(a):]
    return None


def dkt_table(**options) -> LabelTable:
    """The shipped FastSurfer DKT table (79 classes; 51 in the sagittal view)."""
    return LabelTable(None, **options)


def load_table(path: str | os.PathLike | None, **options) -> LabelTable:
    return LabelTable(None if path is None else Path(path), **options)
