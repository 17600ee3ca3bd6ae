"""Turn a BIDS dataset folder into manifest rows.

Scans ``sub-*/anat/*_T1w.nii[.gz]`` and ``sub-*/ses-*/anat/*_T1w.nii[.gz]``. The subject id
is the ``sub-`` folder name (``sub-01``, as in BIDS ``participants.tsv``), the session id the
``ses-`` folder name. When one subject and session hold several T1w images (``acq-``,
``run-``, ... entities), each gets the session id made of its own entities (for example
``ses-1_run-2``; without a session folder, ``run-2``, and ``""`` for the file with no
extra entity), so every row stays unique and is cached separately. Rows come out sorted
by path: the same folder always gives the same manifest.

Label maps are optional: with ``labels="NAME"``, a T1w image
``sub-01/ses-1/anat/sub-01_ses-1_T1w.nii.gz`` is paired with
``derivatives/NAME/sub-01/ses-1/anat/sub-01_ses-1_dseg.nii.gz`` (or ``.nii``) when it
exists, following the BIDS derivatives naming of discrete segmentations.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mriprep.core.errors import InputError
from mriprep.inputs.manifest import ManifestRow

_T1W = re.compile(r"^(?P<entities>sub-[^_]+(?:_[a-zA-Z0-9]+-[^_]+)*)_T1w\.nii(?:\.gz)?$")
_NIFTI_SUFFIXES = (".nii.gz", ".nii")


def manifest_from_bids(
    bids_root: str | os.PathLike, labels: str | None = None
) -> list[ManifestRow]:
    """Manifest rows for every T1w image of a BIDS dataset.

    Parameters
    ----------
    bids_root : path-like
        The dataset folder (the one holding ``sub-*`` folders).
    labels : str, optional
        Name of a folder under ``derivatives/`` holding ``*_dseg.nii[.gz]`` label maps
        named after the T1w images.

    Returns
    -------
    list of ManifestRow
        Sorted by image path; absolute paths; ``split`` empty; ``row`` numbered as they
        would be written (header = 1). ``metadata["bids_entities"]`` keeps the full entity
        string of the file (``sub-01_ses-1_run-2``).

    Raises
    ------
    InputError
        The folder does not exist, has no ``sub-*`` folders, or has no T1w image.
    """
    root = Path(bids_root).expanduser().absolute()
    if not root.is_dir():
        raise InputError(f"BIDS folder {root} does not exist or is not a folder")
    subjects = sorted(p for p in root.glob("sub-*") if p.is_dir())
    if not subjects:
        raise InputError(
            f"{root} has no sub-* folders, so it is not a BIDS dataset root; point at the "
            "folder that holds sub-01/, sub-02/, ..."
        )
    found = []
    for subject in subjects:
        for anat in _anat_folders(subject):
            for image in sorted(anat.iterdir()):
                match = _T1W.match(image.name)
                # A broken symlink is kept (an un-fetched DataLad/git-annex file): the
                # manifest's validation then reports it as missing instead of dropping it.
                if match and (image.is_file() or image.is_symlink()):
                    session = anat.parent.name if anat.parent != subject else ""
                    found.append((subject.name, session, match["entities"], image))
    if not found:
        raise InputError(
            f"no T1w image found under {root} (looked for sub-*/anat/*_T1w.nii[.gz] and "
            "sub-*/ses-*/anat/*_T1w.nii[.gz]); check the folder and the file names"
        )
    per_scan = {}
    for subject, session, _, _ in found:
        per_scan[(subject, session)] = per_scan.get((subject, session), 0) + 1
    rows = []
    for number, (subject, session, entities, image) in enumerate(found, start=2):
        if per_scan[(subject, session)] > 1:
            # Several T1w in one session: the entities after sub- tell them apart.
            session = entities.split("_", 1)[1] if "_" in entities else ""
        label = _label_for(root, labels, image, entities) if labels else None
        rows.append(
            ManifestRow(
                row=number,
                subject_id=subject,
                session_id=session,
                image=image,
                label=label,
                metadata={"bids_entities": entities},
            )
        )
    return rows


def _anat_folders(subject: Path) -> list[Path]:
    folders = [subject / "anat"]
    folders += [s / "anat" for s in sorted(subject.glob("ses-*")) if s.is_dir()]
    return [f for f in folders if f.is_dir()]


def _label_for(root: Path, labels: str, image: Path, entities: str) -> Path | None:
    folder = root / "derivatives" / labels / image.parent.relative_to(root)
    for suffix in _NIFTI_SUFFIXES:
        candidate = folder / f"{entities}_dseg{suffix}"
        if candidate.is_file():
            return candidate
    return None
