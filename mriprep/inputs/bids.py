"""Turn a BIDS dataset folder into manifest rows, through pybids.

Why pybids rather than bids2table: pybids is the BIDS project's own library (what
fMRIPrep and MRIQC index datasets with), it knows the entity grammar, the derivatives
layout and ``dataset_description.json``, and returns files with their parsed entities,
which is all a manifest needs. bids2table indexes very large datasets faster, but a
manifest is written once per cohort, where pybids' indexing time does not matter, and its
derivatives handling is what pairing label maps needs.

pybids indexes the dataset as BIDS defines it (``sourcedata/``, ``code/``, ``derivatives/``
and hidden folders are not scanned), so only the dataset's own
``sub-*/[ses-*/]anat/*_T1w.nii[.gz]`` become rows. The subject id is ``sub-01`` (as in
``participants.tsv``), the session id ``ses-1``. When one subject and session hold several
T1w images (``acq-``, ``run-``, ... entities), each gets the session id made of its own
entities (for example ``ses-1_run-2``; without a session, ``run-2``, and ``""`` for the
file with no extra entity), so every row stays unique and is cached separately. Rows come
out sorted by path: the same folder always gives the same manifest.

Metadata columns, so that ``mriprep splits --stratify site`` works on the manifest:

- ``bids_entities``: the file's full entity string (``sub-01_ses-1_run-2``);
- one column per entity the T1w file names use besides ``sub`` (``ses``, ``acq``,
  ``run``, ...), holding the value as written (``run-02`` gives ``02``), empty for a file
  without that entity;
- every column of ``participants.tsv`` but ``participant_id``, read as text exactly as
  written. BIDS writes a missing value ``n/a``; it becomes an empty cell, the manifest's
  one spelling of "missing", which a subject that ``participants.tsv`` does not list gets
  too, so both fall in the same ``(empty)`` stratum. A column whose name a manifest or
  entity column already uses is renamed ``participants_<name>``. The file is read here,
  not through pybids, whose pandas reading turns ``007`` into ``7``.

Label maps are optional: ``labels="NAME"`` pairs images with label maps under
``derivatives/NAME/``, in either of two layouts (a folder may hold both):

- BIDS derivatives (fMRIPrep, or any tool naming its outputs the BIDS way): a
  ``*_dseg.nii[.gz]`` in the image's folder (``derivatives/NAME/sub-01/ses-1/anat/``)
  whose entities are the image's, plus an optional ``desc-``:
  ``sub-01_ses-1_desc-aseg_dseg.nii.gz``. A file with any other entity (``space-``,
  ``res-``) never matches: in BIDS derivatives only a file without them is in the source
  image's space, the one grid a manifest label may lie on. Among several
  matches the rule is: the only one; else ``desc-aseg``; else an error listing them.
  ``labels_desc`` (``--labels-desc``) picks one ``desc-`` value instead (``""`` the file
  without ``desc-``); an image without that one is then reported as unlabelled.
- FastSurfer / FreeSurfer subject folders, used when no dseg matches: ``<sub>_<ses>``,
  ``<sub>`` or ``<entities>`` (``sub-01_ses-1``, ``sub-01``, ``sub-01_run-2``) holding
  ``mri/orig.mgz`` and a segmentation, chosen by ``seg`` (``--seg``) with the rule of
  :func:`mriprep.inputs.freesurfer.choose_segmentation`: by default
  ``aparc.DKTatlas+aseg.deep.mgz`` (FastSurfer's), else ``aparc.DKTatlas+aseg.mgz``, else
  ``aparc+aseg.mgz`` (Desikan, mapped to DKT at training), never ``aseg.mgz`` (no cortical
  parcels); ``seg="aseg"``, ``"aparc+aseg"``, ``"aparc.DKTatlas+aseg"`` or a file name of
  ``mri/`` choose instead. These lie on the conformed grid (1 mm, 256^3, LIA), not on the
  T1w's grid, and a label map must lie on its image's exact grid (see
  :func:`mriprep.inputs.labels.check_same_grid`): paired with the T1w, every such row
  would fail validation and preprocessing. So the row's image is that folder's
  ``mri/orig.mgz``, the conformed T1w the segmentation was computed on, the very pair
  FastSurfer trains on; ``bids_entities`` still names the source T1w, and a
  ``segmentation`` column names the chosen file (empty on the other rows). A folder that
  two images would share is refused (its orig.mgz is one image); so is a folder with a
  segmentation but no ``mri/orig.mgz`` (an error: a partial copy). A folder whose
  segmentation the choice refuses (``aseg.mgz`` only, by default) leaves its image
  without a label map, with a warning giving the reason and the fix. ``seg`` does not
  apply to BIDS ``*_dseg`` files.

A ``derivatives/NAME`` that is missing or holds no label map at all, or whose label maps
match no image, is an :class:`InputError`; some images without a label map while others
have one is a warning listing them.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mriprep.core.errors import InputError
from mriprep.inputs.freesurfer import (
    CONFORMED_IMAGE,
    DEFAULT_SEG,
    SEGMENTATION_COLUMN,
    FreeSurferSubject,
    group_refusals,
    segmentation_files,
    subject_segmentation,
)
from mriprep.inputs.manifest import KNOWN_COLUMNS, ManifestRow

IMAGE_EXTENSIONS = (".nii.gz", ".nii")
DEFAULT_DESC = "aseg"
DESCRIPTION_FIELDS = ("Name", "BIDSVersion")
_DESCRIPTION_FIX = (
    'it must be a JSON object with at least "Name" and "BIDSVersion", e.g. '
    '{"Name": "My study", "BIDSVersion": "1.9.0"}'
)
_LISTED = 20
# FreeSurfer's subject subfolders hold hundreds of files and never a BIDS dseg: not
# indexing them keeps a derivatives layout of a large cohort quick to build.
_FREESURFER_FOLDERS = re.compile(
    r"^/[^/]+/(mri|surf|label|stats|scripts|touch|tmp|trash|bem)(/|$)"
)


@dataclass(frozen=True)
class _Scan:
    """One T1w file: its ids, its entity string and where it lies."""

    subject: str
    session: str
    entities: str
    image: Path

    @property
    def pairs(self) -> dict[str, str]:
        return _entity_pairs(self.entities) or {}


def manifest_from_bids(
    bids_root: str | os.PathLike,
    labels: str | None = None,
    labels_desc: str | None = None,
    seg: str | None = None,
) -> list[ManifestRow]:
    """Manifest rows for every T1w image of a BIDS dataset.

    Parameters
    ----------
    bids_root : path-like
        The dataset folder (the one holding ``dataset_description.json`` and ``sub-*``).
    labels : str, optional
        Name of a folder under ``derivatives/`` holding label maps, as BIDS
        ``*_dseg.nii[.gz]`` or FastSurfer/FreeSurfer subject folders (module docstring).
    labels_desc : str, optional
        The ``desc-`` value of the dseg to take (``""``: the one without ``desc-``);
        by default the only match, else ``desc-aseg``.
    seg : str, optional
        Which segmentation of a FastSurfer/FreeSurfer subject folder is the label map:
        ``"auto"`` (None: FastSurfer's DKT, else DKT, else Desikan; never ``aseg.mgz``),
        ``"aparc.DKTatlas+aseg"``, ``"aparc+aseg"``, ``"aseg"`` or a file name in
        ``mri/`` (:mod:`mriprep.inputs.freesurfer`). Not used for BIDS dseg files.

    Returns
    -------
    list of ManifestRow
        Sorted by image path; absolute paths; ``split`` empty; ``row`` numbered as they
        would be written (header = 1). Metadata as described in the module docstring;
        ``segmentation`` only when a FastSurfer/FreeSurfer folder gave a label map.

    Raises
    ------
    InputError
        The folder does not exist, has no ``sub-*`` folders, no valid
        ``dataset_description.json`` or no T1w image; ``participants.tsv`` is malformed;
        the ``labels`` folder is missing, holds no label map, or none matches an image;
        ``seg`` is not a valid choice; a FastSurfer/FreeSurfer folder lacks ``orig.mgz``.

    Warns
    -----
    UserWarning
        Images left without a label map while others have one (with the reason when
        their FastSurfer/FreeSurfer folder's segmentation is refused); subjects that
        ``participants.tsv`` does not list; ``seg`` given for a folder without
        FastSurfer/FreeSurfer subject folders.
    """
    for name, value in (("labels_desc", labels_desc), ("seg", seg)):
        if value is not None and not labels:
            raise InputError(
                f"{name}={value!r} is given without labels=NAME: name the derivatives "
                "folder too"
            )
    segmentation_files(DEFAULT_SEG if seg is None else seg)  # refuse a bad choice first
    root = _dataset_root(bids_root)
    scans = _t1w_scans(root)
    pairs = _pair_labels(root, labels, labels_desc, seg, scans) if labels else {}
    entity_columns = list(dict.fromkeys(k for s in scans for k in s.pairs if k != "sub"))
    # Which file of a FastSurfer/FreeSurfer folder is the label: a column only when used.
    seg_columns = [SEGMENTATION_COLUMN] if any(p[2] for p in pairs.values()) else []
    taken = set(KNOWN_COLUMNS) | {"bids_entities", *entity_columns, *seg_columns}
    participants = _participants(root, taken, sorted({s.subject for s in scans}))
    per_scan = Counter((s.subject, s.session) for s in scans)
    rows = []
    for number, scan in enumerate(scans, start=2):
        session = scan.session
        if per_scan[(scan.subject, scan.session)] > 1:
            # Several T1w in one session: the entities after sub- tell them apart.
            session = scan.entities.split("_", 1)[1] if "_" in scan.entities else ""
        image, label, segmentation = pairs.get(scan.image, (scan.image, None, ""))
        metadata = {"bids_entities": scan.entities}
        metadata.update({k: scan.pairs.get(k, "") for k in entity_columns})
        metadata.update(dict.fromkeys(seg_columns, segmentation))
        metadata.update(participants.get(scan.subject, {}))
        rows.append(
            ManifestRow(
                row=number,
                subject_id=scan.subject,
                session_id=session,
                image=image,
                label=label,
                metadata=metadata,
            )
        )
    return rows


# --------------------------------------------------------------------------- the dataset


def _dataset_root(bids_root: str | os.PathLike) -> Path:
    root = Path(bids_root).expanduser().absolute()
    if not root.is_dir():
        raise InputError(f"BIDS folder {root} does not exist or is not a folder")
    if not any(p.is_dir() for p in root.glob("sub-*")):
        raise InputError(
            f"{root} has no sub-* folders, so it is not a BIDS dataset root; point at the "
            "folder that holds sub-01/, sub-02/, ..."
        )
    _check_description(root / "dataset_description.json")
    return root


def _check_description(path: Path) -> None:
    """pybids without validation indexes a folder lacking it, but such a folder is
    usually a copied part of a dataset or a half-made one: say so before indexing."""
    if not path.is_file():
        raise InputError(
            f"{path} does not exist; every BIDS dataset root has one: write it "
            f"({_DESCRIPTION_FIX})"
        )
    try:
        description = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason}); {_DESCRIPTION_FIX}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            f"fix it: {_DESCRIPTION_FIX}"
        ) from exc
    if not isinstance(description, dict):
        raise InputError(f"{path} holds a {type(description).__name__}; {_DESCRIPTION_FIX}")
    missing = [name for name in DESCRIPTION_FIELDS if not description.get(name)]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}; {_DESCRIPTION_FIX}")


def _t1w_scans(root: Path) -> list[_Scan]:
    from bids import BIDSLayout
    from bids.layout import BIDSLayoutIndexer

    # The description was checked above; sidecar metadata is not needed, and reading
    # every JSON of a large dataset is what makes indexing slow.
    layout = BIDSLayout(
        root, validate=False, indexer=BIDSLayoutIndexer(validate=False, index_metadata=False)
    )
    scans = []
    # A broken symlink is indexed too (an un-fetched DataLad/git-annex file): the
    # manifest's validation then reports it as missing instead of dropping it.
    for file in layout.get(suffix="T1w", datatype="anat", extension=list(IMAGE_EXTENSIONS)):
        entities = file.filename[: -len("_T1w" + file.entities["extension"])]
        session = file.entities.get("session")
        scans.append(
            _Scan(
                subject=f"sub-{file.entities['subject']}",
                session=f"ses-{session}" if session else "",
                entities=entities,
                image=Path(file.path),
            )
        )
    if not scans:
        raise InputError(
            f"no T1w image found under {root} (looked for sub-*/anat/*_T1w.nii[.gz] and "
            "sub-*/ses-*/anat/*_T1w.nii[.gz]); check the folder and the file names"
        )
    return sorted(scans, key=lambda s: s.image)


def _entity_pairs(entities: str) -> dict[str, str] | None:
    """``sub-01_run-2`` -> ``{"sub": "01", "run": "2"}``; None when not BIDS-named."""
    pairs = {}
    for token in entities.split("_"):
        key, dash, value = token.partition("-")
        if not (key and dash and value) or key in pairs:
            return None
        pairs[key] = value
    return pairs


# --------------------------------------------------------------------------- participants


def _participants(
    root: Path, taken: set[str], subjects: list[str]
) -> dict[str, dict[str, str]]:
    """participants.tsv as ``{"sub-01": {"site": "A", ...}}``; empty when there is none."""
    path = root / "participants.tsv"
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason}); save it as UTF-8") from exc
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    header = [name.strip() for name in next(reader, [])]
    if "participant_id" not in header:
        raise InputError(
            f"{path} has no participant_id column (its columns: "
            f"{', '.join(repr(h) for h in header) or 'none'}); BIDS requires it first, "
            "tab-separated"
        )
    names = {h: f"participants_{h}" if h in taken else h for h in header if h != "participant_id"}
    table: dict[str, dict[str, str]] = {}
    for cells in reader:
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise InputError(
                f"{path} line {reader.line_num} has {len(cells)} cells but the header has "
                f"{len(header)} columns; participants.tsv is tab-separated, one cell per column"
            )
        values = dict(zip(header, (c.strip() for c in cells)))
        subject = values["participant_id"]
        # BIDS writes sub-01; some exports drop the prefix.
        subject = subject if subject.startswith("sub-") else f"sub-{subject}"
        if subject in table:
            raise InputError(
                f"{path} lists {subject} twice (line {reader.line_num}); keep one row per "
                "participant"
            )
        table[subject] = {
            new: "" if values[old] == "n/a" else values[old] for old, new in names.items()
        }
    if names:
        unlisted = [s for s in subjects if s not in table]
        if unlisted:
            warnings.warn(
                f"{path} does not list {len(unlisted)} subject(s) ({_listed(unlisted)}); "
                f"their {', '.join(names.values())} cells are left empty",
                stacklevel=3,
            )
        empty = dict.fromkeys(names.values(), "")
        table = {s: table.get(s, empty) for s in subjects}
    return table


# --------------------------------------------------------------------------- label maps


def _pair_labels(
    root: Path, name: str, desc: str | None, seg: str | None, scans: list[_Scan]
) -> dict[Path, tuple[Path, Path, str]]:
    """``{T1w path: (image, label, segmentation)}`` for every scan that has a label map;
    ``segmentation`` is the chosen file's name for a FastSurfer/FreeSurfer folder, else
    ``""``."""
    folder = root / "derivatives" / name
    if not folder.is_dir():
        present = sorted(p.name for p in (root / "derivatives").glob("*") if p.is_dir())
        holds = (
            f"derivatives/ holds {', '.join(present)}"
            if present
            else "there is no pipeline folder under derivatives/"
        )
        raise InputError(
            f"labels={name!r}: label folder {folder} does not exist ({holds}); name the "
            "folder of derivatives/ that holds the label maps"
        )
    choice = DEFAULT_SEG if seg is None else seg
    dsegs = _dseg_files(folder)
    subject_dirs = _freesurfer_subjects(folder, choice)
    if not dsegs and not subject_dirs:
        looked = segmentation_files(choice)
        raise InputError(
            f"labels={name!r}: {folder} holds no label map: looked for BIDS derivatives "
            "sub-*/[ses-*/]anat/*_dseg.nii[.gz] and FastSurfer/FreeSurfer subject folders "
            f"<subject>/mri/{' or mri/'.join(looked)} beside mri/{CONFORMED_IMAGE}"
        )
    if seg is not None and not subject_dirs:
        warnings.warn(
            f"seg={seg!r} chooses among the files of FastSurfer/FreeSurfer subject folders, "
            f"and {folder} holds none (only BIDS dseg files): it is not used",
            stacklevel=3,
        )
    pairs: dict[Path, tuple[Path, Path, str]] = {}
    claimed: dict[Path, list[str]] = {}
    unlabelled = []
    refused: dict[str, str] = {}
    for scan in scans:
        key = (scan.image.parent.relative_to(root), frozenset(scan.pairs.items()))
        candidates = dsegs.get(key, [])
        subject = None if candidates else _freesurfer_subject(scan, subject_dirs)
        if candidates:
            label = _choose_dseg(scan, candidates, desc)
            if label:
                pairs[scan.image] = (scan.image, label, "")
            else:
                unlabelled.append(scan.entities)
        elif subject is None:
            unlabelled.append(scan.entities)
        else:
            # Shared or not is a matter of names, whatever the segmentation choice.
            claimed.setdefault(subject.image, []).append(scan.entities)
            if subject.label is None:
                refused[f"{scan.entities} ({subject.folder})"] = subject.refusal
            else:
                pairs[scan.image] = (subject.image, subject.label, subject.label.name)
    shared = {image: names for image, names in claimed.items() if len(names) > 1}
    if shared:
        image, names = next(iter(shared.items()))
        raise InputError(
            f"{image.parent.parent} would be the label map of {len(names)} T1w images "
            f"({', '.join(names)}), but its {CONFORMED_IMAGE} is one image; name each "
            f"FastSurfer/FreeSurfer subject folder after its image's entities ({names[0]}/, ...)"
        )
    reasons = "\n".join(f"  - {line}" for line in group_refusals(refused))
    if not pairs and refused:
        raise InputError(
            f"labels={name!r}: no image could be paired with a label map in {folder}: the "
            f"segmentation of every matching FastSurfer/FreeSurfer folder is refused:\n{reasons}"
        )
    if not pairs:
        raise InputError(
            f"labels={name!r}: none of the label maps in {folder} matches a T1w image; "
            f"expected for {scans[0].image.name}: {_expected(root, folder, choice, scans[0])}"
        )
    for line in group_refusals(refused):
        warnings.warn(
            "image(s) written without a label map, the segmentation of their "
            f"FastSurfer/FreeSurfer folder refused: {line}",
            stacklevel=3,
        )
    if unlabelled:
        warnings.warn(
            f"{len(unlabelled)} of {len(scans)} image(s) have no label map in {folder} and "
            f"are written without one: {_listed(unlabelled)}",
            stacklevel=3,
        )
    return pairs


def _dseg_files(folder: Path) -> dict[tuple[Path, frozenset], list[tuple[str | None, Path]]]:
    """The folder's dseg maps by (folder, entities without desc): ``[(desc, path)]``."""
    from bids import BIDSLayout
    from bids.layout import BIDSLayoutIndexer
    from bids.layout.validation import DEFAULT_LOCATIONS_TO_IGNORE

    ignore = [*DEFAULT_LOCATIONS_TO_IGNORE, re.compile(r"/\."), _FREESURFER_FOLDERS]
    # is_derivative without validation: hand-made label folders rarely carry a
    # dataset_description.json, and nothing here needs one.
    layout = BIDSLayout(
        folder,
        validate=False,
        is_derivative=True,
        indexer=BIDSLayoutIndexer(validate=False, index_metadata=False, ignore=ignore),
    )
    found: dict[tuple[Path, frozenset], list[tuple[str | None, Path]]] = {}
    for file in layout.get(suffix="dseg", extension=list(IMAGE_EXTENSIONS)):
        path = Path(file.path)
        pairs = _entity_pairs(file.filename[: -len("_dseg" + file.entities["extension"])])
        if pairs is None or "sub" not in pairs:
            continue  # not named the BIDS way: it cannot be matched to an image
        file_desc = pairs.pop("desc", None)
        key = (path.parent.relative_to(folder), frozenset(pairs.items()))
        found.setdefault(key, []).append((file_desc, path))
    return {key: sorted(files, key=lambda f: f[1]) for key, files in found.items()}


def _choose_dseg(
    scan: _Scan, candidates: list[tuple[str | None, Path]], desc: str | None
) -> Path | None:
    if desc is not None:
        chosen = [path for d, path in candidates if (d or "") == desc]
        if not chosen:
            return None  # reported with the other unlabelled images
    elif len(candidates) == 1:
        chosen = [candidates[0][1]]
    else:
        chosen = [path for d, path in candidates if d == DEFAULT_DESC]
    if len(chosen) == 1:
        return chosen[0]
    names = ", ".join(path.name for _, path in candidates)
    if desc is None:
        problem = f"none is desc-{DEFAULT_DESC}"
    else:  # the same name as .nii and as .nii.gz
        problem = f"{len(chosen)} are {f'desc-{desc}' if desc else 'without desc-'}"
    raise InputError(
        f"{scan.image.name} has {len(candidates)} label maps in {candidates[0][1].parent} "
        f"({names}) and {problem}; choose one with labels_desc=DESC "
        "('' takes the one without desc-), or remove the extra files"
    )


def _freesurfer_subjects(folder: Path, seg: str) -> dict[str, FreeSurferSubject]:
    """``{folder name: its segmentation or refusal}`` for every FastSurfer/FreeSurfer
    subject folder (one with ``mri/orig.mgz`` or a segmentation)."""
    found = {}
    for subject_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        subject = subject_segmentation(subject_dir, seg)
        if subject is not None:
            found[subject_dir.name] = subject
    return found


def _freesurfer_subject(
    scan: _Scan, subject_dirs: dict[str, FreeSurferSubject]
) -> FreeSurferSubject | None:
    names = [scan.entities, f"{scan.subject}_{scan.session}" if scan.session else "", scan.subject]
    for name in filter(None, names):
        if name in subject_dirs:
            subject = subject_dirs[name]
            if not subject.has_image:
                # A partial copy, not a choice the user can make: an error, as before.
                raise InputError(f"{subject.folder}/{subject.refusal}")
            return subject
    return None


def _expected(root: Path, folder: Path, seg: str, scan: _Scan) -> str:
    relative = scan.image.parent.relative_to(root)
    dseg = folder / relative / f"{scan.entities}_desc-{DEFAULT_DESC}_dseg.nii.gz"
    session = f"{scan.subject}_{scan.session}" if scan.session else scan.subject
    looked = segmentation_files(seg)[0]
    fastsurfer = folder / session / "mri" / looked
    return f"{dseg} or {fastsurfer}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names) - _LISTED} more)" if len(names) > _LISTED else "")
