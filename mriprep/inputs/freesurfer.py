"""Turn a FreeSurfer/FastSurfer ``SUBJECTS_DIR`` into manifest rows, and the one rule that
picks a subject's segmentation.

A subject folder is one holding ``mri/orig.mgz``: the conformed T1w (1 mm, 256^3, LIA)
that FreeSurfer and FastSurfer compute their segmentations on, and so the grid every one
of them lies on. A row is that pair: ``image`` = ``<id>/mri/orig.mgz``, ``label`` = the
chosen segmentation in the same ``mri/`` folder, ``subject_id`` = the folder's name.

The choice, ``seg`` (``--seg``), is made per subject by :func:`choose_segmentation`, the
same rule :mod:`mriprep.inputs.bids` applies to FastSurfer/FreeSurfer subject folders
under ``derivatives/NAME``:

- ``"auto"`` (the default): ``aparc.DKTatlas+aseg.deep.mgz`` (FastSurfer's network
  output, what its models learn), else ``aparc.DKTatlas+aseg.mgz`` (FreeSurfer's or
  FastSurfer's surface-based DKT), else ``aparc+aseg.mgz`` (FreeSurfer's default, the
  Desikan atlas: training maps its 3 extra parcels per hemisphere into DKT's neighbours,
  see :mod:`mriprep.training.labels.aparc`). ``aseg.mgz`` is never taken by default: it
  holds no cortical parcels (all cortex is one label, 3/42), so training with the DKT
  table on it would silently lose the cortex. A subject with only ``aseg.mgz`` is refused,
  with the fix.
- ``"aparc.DKTatlas+aseg"``: the ``.deep`` file when there is one, else the plain one.
- ``"aparc+aseg"``: ``aparc+aseg.mgz``; ``"aseg"``: ``aseg.mgz`` (train it with an aseg
  label table and ``processing="aseg"``).
- any file name in ``mri/`` ending in ``.mgz``, ``.mgh``, ``.nii.gz`` or ``.nii``
  (``aparc.a2009s+aseg.mgz``, ``mylabels.mgz``), taken as it is.

An explicit choice a subject lacks refuses that subject, naming what it does have.

What :func:`manifest_from_freesurfer` does with the folders of ``SUBJECTS_DIR``:

- FreeSurfer's own templates and atlases (``fsaverage*``, ``lh.EC_average``,
  ``rh.EC_average``, ``cvs_avg35*``, ``V1_average``), hidden folders and folders without
  ``mri/orig.mgz`` or any segmentation are skipped: not people. Every skipped folder is
  named in the result (:attr:`FreeSurferManifest.skipped`).
- A folder with a segmentation but no ``mri/orig.mgz`` (a partial copy), or whose
  segmentation the choice refuses, is refused with its reason: it gets no row, the others
  still do, and a warning lists the refusals, grouped by reason. No usable subject at all
  is an :class:`InputError`.
- Longitudinal processing (``recon-all -base``/``-long``) leaves three kinds of folder
  for one person: each time point cross-sectionally (``tp1``), the within-subject
  template (``bert``, holding a ``base-tps`` file that lists its time points) and each
  time point again in the template's space (``tp1.long.bert``). They are the same scans,
  so rows from them under different subject ids would let one person land in two splits.
  Each such folder stays a row of its own, but they share one ``subject_id``, the
  template's name, and each takes its folder name as ``session_id``; the template's
  time points come from the ``.long.`` folder names and its ``base-tps``. A time point
  claimed by two templates stays with the first in sorted order. Any other folder (a
  session processed as ``sub-01_ses-1``) is its own subject: nothing in a cross-sectional
  folder's name says reliably which person it belongs to.

Rows are sorted by folder name, with absolute paths; the manifest's ``segmentation``
metadata column holds the chosen file's name. The same folder always gives the same rows.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from mriprep.core.errors import InputError
from mriprep.inputs.manifest import ManifestRow

CONFORMED_IMAGE = "orig.mgz"
DEEP_DKT = "aparc.DKTatlas+aseg.deep.mgz"
DKT = "aparc.DKTatlas+aseg.mgz"
DESIKAN = "aparc+aseg.mgz"
ASEG = "aseg.mgz"
DEFAULT_SEG = "auto"
# Each named choice and the files it takes, in order of preference.
SEG_CHOICES = {
    DEFAULT_SEG: (DEEP_DKT, DKT, DESIKAN),
    "aparc.DKTatlas+aseg": (DEEP_DKT, DKT),
    "aparc+aseg": (DESIKAN,),
    "aseg": (ASEG,),
}
KNOWN_SEGMENTATIONS = (DEEP_DKT, DKT, DESIKAN, ASEG)
SEGMENTATION_COLUMN = "segmentation"
# What a summary adds to a file's name: what training will do with it.
_NOTES = {
    DESIKAN: "Desikan; mapped to DKT at training",
    ASEG: "no cortical parcels: train it with an aseg table",
}
_FILE_SUFFIXES = (".mgz", ".mgh", ".nii.gz", ".nii")
# FreeSurfer ships these in $FREESURFER_HOME/subjects, and SUBJECTS_DIRs link them in:
# templates and atlases (fsaverage even has an orig.mgz and an aparc+aseg.mgz), not people.
_NOT_PEOPLE = (
    (re.compile(r"fsaverage.*"), "FreeSurfer's average subject"),
    (re.compile(r"[lr]h\.EC_average"), "FreeSurfer's entorhinal-cortex atlas"),
    (re.compile(r"cvs_avg35.*"), "FreeSurfer's CVS template"),
    (re.compile(r"V1_average"), "FreeSurfer's V1 atlas"),
)
# A file in mri/ that looks like a label map, to tell a user what a subject does have.
_LABEL_LIKE = re.compile(r"aseg|aparc|parc|seg", re.IGNORECASE)
_LISTED = 20
_FIX_ASEG = (
    "run the cortical parcellation (FastSurfer, or FreeSurfer's recon-all to its end) to "
    f"get mri/{DKT}, or pass seg=aseg and train with an aseg table "
    "(mriprep export --processing aseg --lut TABLE)"
)


@dataclass(frozen=True)
class FreeSurferSubject:
    """One subject folder: its segmentation, or why it has none it can use.

    ``label`` is the chosen segmentation (None when refused). ``refusal`` starts with a
    path relative to ``folder`` (``mri/aseg.mgz only ...``) and ends with the fix, so
    ``f"{folder}/{refusal}"`` names the file. ``has_image`` is False when ``mri/orig.mgz``
    is missing.
    """

    folder: Path
    label: Path | None
    refusal: str = ""
    has_image: bool = True

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def image(self) -> Path:
        """``mri/orig.mgz``: the grid the segmentation lies on, so the row's image."""
        return self.folder / "mri" / CONFORMED_IMAGE


@dataclass(frozen=True)
class FreeSurferManifest:
    """What :func:`manifest_from_freesurfer` made of a ``SUBJECTS_DIR``.

    ``rows`` are the manifest rows; ``refused`` maps each refused folder's name to its
    reason (relative to the folder, with the fix); ``skipped`` maps each folder that is
    not a subject to why.
    """

    subjects_dir: Path
    seg: str
    rows: list[ManifestRow]
    refused: dict[str, str]
    skipped: dict[str, str]

    def summary(self) -> list[str]:
        """The lines a command prints after the rows: labels, refusals, skipped folders."""
        lines = [f"labels: {describe_segmentations(self.rows)}"]
        if self.refused:
            lines.append(
                f"refused {len(self.refused)} subject folder(s), without a row: "
                f"{_listed(list(self.refused))} (reasons in the warnings)"
            )
        if self.skipped:
            named = [f"{name} ({why})" for name, why in self.skipped.items()]
            lines.append(
                f"skipped {len(self.skipped)} folder(s) that are not subjects: {_listed(named)}"
            )
        return lines


# --------------------------------------------------------------------------- the rule


def segmentation_files(seg: str = DEFAULT_SEG) -> tuple[str, ...]:
    """The file names in ``mri/`` that ``seg`` accepts, in order of preference.

    Raises
    ------
    InputError
        ``seg`` is neither a named choice nor a file name.

    Examples
    --------
    >>> segmentation_files("aparc.DKTatlas+aseg")
    ('aparc.DKTatlas+aseg.deep.mgz', 'aparc.DKTatlas+aseg.mgz')
    >>> segmentation_files("aparc.a2009s+aseg.mgz")
    ('aparc.a2009s+aseg.mgz',)
    """
    if seg in SEG_CHOICES:
        return SEG_CHOICES[seg]
    is_name = seg and "/" not in seg and "\\" not in seg and seg not in (".", "..")
    if is_name and seg.lower().endswith(_FILE_SUFFIXES):
        return (seg,)
    raise InputError(
        f"seg={seg!r} is neither one of {', '.join(SEG_CHOICES)} nor the name of a file in "
        f"a subject's mri/ folder ending in {', '.join(_FILE_SUFFIXES)} (for example "
        "aparc.a2009s+aseg.mgz); pass one of those"
    )


def choose_segmentation(present: Iterable[str], seg: str = DEFAULT_SEG,
                        where: str = "mri/") -> str:
    """The file ``seg`` takes among the file names ``present`` in a subject's ``mri/``.

    Parameters
    ----------
    present : iterable of str
        The names of the files in the folder.
    seg : str
        ``"auto"``, ``"aparc.DKTatlas+aseg"``, ``"aparc+aseg"``, ``"aseg"`` or a file name
        (module docstring).
    where : str
        How the refusal names the folder (``"mri/"``, or its path).

    Returns
    -------
    str
        The chosen file's name.

    Raises
    ------
    InputError
        Nothing ``seg`` accepts is present (the message names what is, and the fix), or
        ``seg`` is not a valid choice.

    Examples
    --------
    >>> choose_segmentation(["orig.mgz", "aseg.mgz", "aparc+aseg.mgz"])
    'aparc+aseg.mgz'
    >>> choose_segmentation(["orig.mgz", "aseg.mgz"], seg="aseg")
    'aseg.mgz'
    >>> choose_segmentation(["orig.mgz", "aseg.mgz"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mriprep.core.errors.InputError: mri/aseg.mgz only ...
    """
    names = set(present)
    candidates = segmentation_files(seg)
    for name in candidates:
        if name in names:
            return name
    raise InputError(_refusal(names, seg, candidates, where.rstrip("/") + "/"))


def _refusal(names: set[str], seg: str, candidates: tuple[str, ...], where: str) -> str:
    have = _label_files(names)
    if seg == DEFAULT_SEG and ASEG in names:
        return (
            f"{where}{ASEG} only (no {', '.join(candidates)}): no cortical parcels (cortex "
            f"is one label, 3/42), so a DKT table would lose all cortex; {_FIX_ASEG}"
        )
    if seg == DEFAULT_SEG:
        holds = f"; it has {', '.join(have)}" if have else ""
        return (
            f"{where} holds no segmentation (looked for {', '.join(candidates)}, {ASEG}"
            f"{holds}); segment it with FastSurfer or FreeSurfer's recon-all, or name its "
            "label map with seg=FILE"
        )
    holds = f"it has {', '.join(have)}" if have else "it holds no segmentation"
    return (
        f"{where} has no {' or '.join(candidates)} (seg={seg}); {holds}: choose one of "
        f"those with seg=FILE or seg={DEFAULT_SEG}, or segment it with the tool that writes "
        f"{candidates[-1]}"
    )


def _label_files(names: Iterable[str]) -> list[str]:
    """The names that look like label maps, known ones first."""
    known = [n for n in KNOWN_SEGMENTATIONS if n in names]
    other = sorted(n for n in names if n not in known and n.lower().endswith(_FILE_SUFFIXES)
                   and _LABEL_LIKE.search(n))
    return known + other


def subject_segmentation(folder: str | os.PathLike,
                         seg: str = DEFAULT_SEG) -> FreeSurferSubject | None:
    """A FreeSurfer/FastSurfer subject folder's chosen segmentation, or its refusal.

    Parameters
    ----------
    folder : path-like
        The subject's folder (holding ``mri/``).
    seg : str
        The choice (module docstring).

    Returns
    -------
    FreeSurferSubject or None
        None when the folder is not a subject folder: no ``mri/orig.mgz`` and no file
        the choice (or ``"auto"``, or ``aseg.mgz``) would look at.
    """
    folder = Path(folder)
    names = _file_names(folder / "mri")
    if CONFORMED_IMAGE not in names:
        found = [n for n in (*segmentation_files(seg), *KNOWN_SEGMENTATIONS) if n in names]
        if not found:
            return None
        return FreeSurferSubject(
            folder, None, has_image=False,
            refusal=(
                f"mri/{found[0]} has no {CONFORMED_IMAGE} beside it: it is the conformed "
                "image the label map lies on, and the row's image; copy the subject's "
                "whole mri/ folder"
            ),
        )
    try:
        name = choose_segmentation(names, seg)
    except InputError as exc:
        return FreeSurferSubject(folder, None, refusal=str(exc))
    return FreeSurferSubject(folder, folder / "mri" / name)


def _file_names(folder: Path) -> set[str]:
    # Names, not is_file(): an un-fetched DataLad/git-annex file (a broken symlink) is
    # still the subject's, and the manifest's validation reports it as missing.
    try:
        return set(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def group_refusals(refused: Mapping[str, str]) -> list[str]:
    """``{name: reason}`` as one line per reason, in order of first appearance:
    ``"2 (sub-a, sub-b): mri/aseg.mgz only ..."``; a cohort of hundreds stays readable."""
    groups: dict[str, list[str]] = {}
    for name, reason in refused.items():
        groups.setdefault(reason, []).append(name)
    return [f"{len(names)} ({_listed(names)}): {reason}" for reason, names in groups.items()]


def describe_segmentations(rows: Iterable[ManifestRow]) -> str:
    """How many rows take each segmentation, known ones in order of preference.

    >>> row = ManifestRow(0, "s", "", Path("orig.mgz"), metadata={"segmentation": DESIKAN})
    >>> describe_segmentations([row])
    'aparc+aseg.mgz (Desikan; mapped to DKT at training) for 1 row(s)'
    """
    counts = Counter(r.metadata.get(SEGMENTATION_COLUMN) for r in rows)
    counts.pop(None, None)
    counts.pop("", None)
    order = [n for n in KNOWN_SEGMENTATIONS if n in counts] + sorted(
        n for n in counts if n not in KNOWN_SEGMENTATIONS)
    parts = []
    for name in order:
        note = f" ({_NOTES[name]})" if name in _NOTES else ""
        parts.append(f"{name}{note} for {counts[name]}")
    if not parts:
        return "none"
    return ", ".join(parts) + " row(s)"


# --------------------------------------------------------------------------- SUBJECTS_DIR


def manifest_from_freesurfer(subjects_dir: str | os.PathLike,
                             seg: str = DEFAULT_SEG) -> FreeSurferManifest:
    """Manifest rows for every subject folder of a FreeSurfer/FastSurfer ``SUBJECTS_DIR``.

    Parameters
    ----------
    subjects_dir : path-like
        The folder holding one folder per subject (``<id>/mri/orig.mgz``).
    seg : str
        Which segmentation is each row's label: ``"auto"`` (FastSurfer's DKT, else DKT,
        else Desikan; never ``aseg.mgz``), ``"aparc.DKTatlas+aseg"``, ``"aparc+aseg"``,
        ``"aseg"`` or a file name in ``mri/`` (module docstring).

    Returns
    -------
    FreeSurferManifest
        ``rows`` sorted by folder name, absolute paths, ``split`` empty, ``row`` numbered
        as they would be written (header = 1), the chosen file's name in the
        ``segmentation`` metadata column; the refused and skipped folders with reasons.

    Raises
    ------
    InputError
        The folder does not exist, holds no subject folder, ``seg`` is not a valid choice,
        or every subject folder is refused (the message lists why).

    Warns
    -----
    UserWarning
        Refused subject folders, one warning per reason, naming them and the fix.
    """
    root = _subjects_dir(subjects_dir)
    segmentation_files(seg)  # a bad choice is refused before anything is read
    subjects: list[FreeSurferSubject] = []
    skipped: dict[str, str] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        why = _not_a_person(folder.name)
        subject = None if why else subject_segmentation(folder, seg)
        if subject is None:
            skipped[folder.name] = why or f"no mri/{CONFORMED_IMAGE}"
        else:
            subjects.append(subject)
    refused = {s.name: s.refusal for s in subjects if s.label is None}
    usable = [s for s in subjects if s.label is not None]
    if not subjects:
        raise InputError(_no_subjects(root, skipped))
    if not usable:
        lines = "\n".join(f"  - {line}" for line in group_refusals(refused))
        raise InputError(
            f"no usable subject in {root} (seg={seg}): every subject folder is refused:\n"
            f"{lines}"
        )
    for line in group_refusals(refused):
        warnings.warn(f"subject folder(s) of {root} refused, without a row: {line}",
                      stacklevel=2)
    rows = _rows(usable, _people([root / s.name for s in subjects]))
    return FreeSurferManifest(root, seg, rows, refused, skipped)


def _subjects_dir(subjects_dir: str | os.PathLike) -> Path:
    root = Path(subjects_dir).expanduser().absolute()
    if not root.is_dir():
        raise InputError(
            f"SUBJECTS_DIR {root} does not exist or is not a folder; point at the folder "
            "holding one folder per subject (<id>/mri/orig.mgz)"
        )
    return root


def _not_a_person(name: str) -> str:
    """Why a folder of SUBJECTS_DIR is never a subject, by its name ("" when it may be)."""
    if name.startswith("."):
        return "hidden folder"
    for pattern, why in _NOT_PEOPLE:
        if pattern.fullmatch(name):
            return why
    return ""


def _no_subjects(root: Path, skipped: dict[str, str]) -> str:
    if (root / "mri" / CONFORMED_IMAGE).exists():
        hint = f"; {root} is itself a subject folder: point at its parent {root.parent}"
    else:
        hint = "; point at SUBJECTS_DIR, the folder holding one folder per subject"
    named = [f"{name} ({why})" for name, why in skipped.items()]
    seen = f" (skipped: {_listed(named)})" if skipped else ""
    return (
        f"{root} holds no FreeSurfer/FastSurfer subject folder <id>/mri/{CONFORMED_IMAGE} "
        f"with a segmentation{seen}{hint}"
    )


def _people(folders: list[Path]) -> dict[str, str]:
    """``{folder name: template name}`` for the folders of longitudinal processing."""
    person: dict[str, str] = {}
    for folder in folders:  # sorted: a time point claimed twice stays with the first
        point, sep, template = folder.name.partition(".long.")
        if sep and point and template:
            for name in (folder.name, point, template):
                person.setdefault(name, template)
        listed = folder / "base-tps"  # recon-all -base writes the template's time points
        if listed.is_file():
            person.setdefault(folder.name, folder.name)
            for point in listed.read_text(errors="replace").split():
                person.setdefault(point, folder.name)
    return person


def _rows(subjects: list[FreeSurferSubject], person: dict[str, str]) -> list[ManifestRow]:
    rows = []
    for number, subject in enumerate(subjects, start=2):
        grouped = subject.name in person
        rows.append(
            ManifestRow(
                row=number,
                subject_id=person.get(subject.name, subject.name),
                session_id=subject.name if grouped else "",
                image=subject.image,
                label=subject.label,
                metadata={SEGMENTATION_COLUMN: subject.label.name},
            )
        )
    return rows


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names) - _LISTED} more)" if len(names) > _LISTED else "")
