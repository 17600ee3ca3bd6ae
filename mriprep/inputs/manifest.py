"""Cohort manifests: one row per scan, read from CSV or TSV, validated all at once.

A manifest lists the scans of a cohort: ``subject_id`` and ``image`` (required), ``label``,
``split``, ``session_id`` and ``header`` (optional); any other column is kept as per-row
metadata. ``header`` (``qform``, ``sform`` or empty) says which form of a NIfTI header
gives the scan's geometry, overriding the pipeline's ``header:`` for that scan.
Paths are relative to the manifest's folder unless absolute, so a cohort folder can be
moved with its manifest. The schema, with examples, is in ``data_manifests/README.md``.

Validation collects every problem before raising, each with its line number in the file
(the header is line 1), so one run of ``mriprep manifest validate`` lists everything to fix.
Subject and session ids must also be safe as file names: mriprep never puts an id in an
output path (cache entries are named by content hash), but an id with a path separator,
``..``, a control character or a leading dot is almost always a broken export, and ids
often end up in file names downstream.
"""

from __future__ import annotations

import csv
import difflib
import io
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from mriprep.core.atomic import atomic_path
from mriprep.core.errors import ManifestError
from mriprep.core.ids import MAX_ID_BYTES, id_problems  # noqa: F401 - the ids' rule, re-exported

REQUIRED_COLUMNS = ("subject_id", "image")
OPTIONAL_COLUMNS = ("session_id", "label", "split", "header")
KNOWN_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
SPLITS = ("train", "val", "test")
# What the ``header`` column accepts (empty: the pipeline's ``header:`` decides).
HEADER_FORMS = ("qform", "sform")
_NIFTI_SUFFIXES = (".nii", ".nii.gz")
_DELIMITERS = {".csv": ",", ".tsv": "\t"}


@dataclass(frozen=True)
class ManifestRow:
    """One scan of the cohort.

    ``row`` is the line number in the manifest file (header = line 1; 0 for rows made in
    code). ``image`` and ``label`` are absolute paths. ``split`` is ``"train"``, ``"val"``,
    ``"test"`` or ``""`` (not assigned). ``header`` is ``"qform"`` or ``"sform"`` when the
    manifest chooses the NIfTI form for this scan, ``""`` to leave it to the pipeline.
    ``metadata`` holds the extra columns as strings.
    """

    row: int
    subject_id: str
    session_id: str
    image: Path
    label: Path | None = None
    split: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    header: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(subject_id, session_id)``: unique within a manifest and a cache."""
        return (self.subject_id, self.session_id)

    @property
    def name(self) -> str:
        """How reports refer to the scan: ``sub-01`` or ``sub-01/ses-1``."""
        return f"{self.subject_id}/{self.session_id}" if self.session_id else self.subject_id

    @property
    def ref(self) -> str:
        """How findings identify the row: its line in the manifest."""
        return f"line {self.row}"

    @property
    def finding_name(self) -> str:
        """How messages name the row: ``sub-01/ses-1 (line 12)``."""
        return f"{self.name} (line {self.row})"


@dataclass(frozen=True)
class Manifest:
    """A validated manifest: its file and its rows, in file order."""

    path: Path
    rows: tuple[ManifestRow, ...]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ManifestRow]:
        return iter(self.rows)

    def by_split(self) -> dict[str, list[ManifestRow]]:
        """Rows grouped by split, in the order train, val, test, then ``""`` (unassigned).

        Only splits that have rows appear.
        """
        groups: dict[str, list[ManifestRow]] = {}
        for split in SPLITS + ("",):
            rows = [r for r in self.rows if r.split == split]
            if rows:
                groups[split] = rows
        return groups

    def subjects(self, split: str | None = None) -> list[str]:
        """Sorted unique subject ids, of one split when ``split`` is given."""
        return sorted({r.subject_id for r in self.rows if split is None or r.split == split})

    def metadata_columns(self) -> list[str]:
        """Names of the extra columns, in the order they first appear."""
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row.metadata))
        return list(seen)


def read_manifest(path: str | os.PathLike, check_files: bool = True) -> Manifest:
    """Read and validate a cohort manifest.

    Parameters
    ----------
    path : path-like
        A ``.csv`` or ``.tsv`` file (another extension: the delimiter is sniffed).
    check_files : bool
        Also require every image and label file to exist and be non-empty.

    Returns
    -------
    Manifest

    Raises
    ------
    ManifestError
        Listing every problem found, each with its line number.
    """
    path = Path(path)
    rows, problems = _parse(path, check_files)
    if problems:
        raise ManifestError(path, problems)
    return Manifest(path=path, rows=tuple(rows))


def validate_manifest(path: str | os.PathLike, check_files: bool = True) -> list[str]:
    """Every problem :func:`read_manifest` would raise, as a list (empty when clean)."""
    return _parse(Path(path), check_files)[1]


def write_manifest(rows: Iterable[ManifestRow], path: str | os.PathLike) -> Path:
    """Write rows as a manifest (TSV for ``.tsv``, CSV otherwise), atomically.

    Image and label paths are written relative to the manifest's folder when they lie under
    it (so the folder can be moved), absolute otherwise. Columns: the known ones (``header``
    only when a row sets it), then the metadata columns in order of first appearance.
    """
    path = Path(path)
    rows = list(rows)
    folder = Path(os.path.abspath(path.parent))
    extra: dict[str, None] = {}
    for row in rows:
        extra.update(dict.fromkeys(k for k in row.metadata if k not in KNOWN_COLUMNS))
    with_header = any(row.header for row in rows)
    columns = ["subject_id", "session_id", "image", "label", "split",
               *(["header"] if with_header else []), *extra]
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(
                [
                    row.subject_id,
                    row.session_id,
                    _relative(row.image, folder),
                    "" if row.label is None else _relative(row.label, folder),
                    row.split,
                    *([row.header] if with_header else []),
                    *(row.metadata.get(k, "") for k in extra),
                ]
            )
    return path


def _relative(file: Path, folder: Path) -> str:
    # abspath, not resolve: a symlinked scan (DataLad, git-annex) keeps its own name.
    file = Path(os.path.abspath(file))
    if file.is_relative_to(folder):
        return file.relative_to(folder).as_posix()
    return str(file)


# --------------------------------------------------------------------------- parsing


def _parse(path: Path, check_files: bool) -> tuple[list[ManifestRow], list[str]]:
    text = _read_text(path)
    if not text.strip():
        raise ManifestError(
            path, ["the file is empty; it needs a header line such as 'subject_id,image'"]
        )
    delimiter = _delimiter(path, text)
    # newline="": the csv module handles line ends itself, inside quoted cells too.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    problems: list[str] = []
    try:
        header = [name.strip() for name in next(reader)]
        columns, header_problems = _columns(header, delimiter)
        problems.extend(header_problems)
        if any(name not in columns for name in REQUIRED_COLUMNS):
            return [], problems
        rows = []
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue  # blank line
            line = reader.line_num
            row, row_problems = _row(line, cells, header, columns, path.parent, check_files)
            problems.extend(row_problems)
            if row is not None:
                rows.append(row)
    except csv.Error as exc:
        problems.append(f"line {reader.line_num}: not valid {_format_name(delimiter)} ({exc})")
        return [], problems
    if not rows and not problems:
        problems.append("the manifest has a header but no rows")
    problems.extend(_duplicates(rows))
    return rows, problems


def _read_text(path: Path) -> str:
    if not path.exists():
        raise ManifestError(path, ["the file does not exist; check the path"])
    if not path.is_file():
        raise ManifestError(path, ["the path is a folder, not a CSV or TSV file"])
    try:
        # utf-8-sig: spreadsheets often start a CSV with a byte-order mark.
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            path,
            [
                f"the file is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as "
                "UTF-8 CSV or TSV"
            ],
        ) from exc


def _delimiter(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in _DELIMITERS:
        return _DELIMITERS[suffix]
    first_line = text.splitlines()[0]
    try:
        return csv.Sniffer().sniff(first_line, delimiters=",\t;").delimiter
    except csv.Error:
        return ","


def _format_name(delimiter: str) -> str:
    return "TSV" if delimiter == "\t" else "CSV"


def _columns(header: list[str], delimiter: str) -> tuple[dict[str, int], list[str]]:
    """Map column names to positions; known names are matched case-insensitively."""
    problems = []
    columns: dict[str, int] = {}
    for index, name in enumerate(header):
        key = name.lower() if name.lower() in KNOWN_COLUMNS else name
        if not key:
            problems.append(f"line 1: column {index + 1} has no name")
            continue
        if key in columns:
            problems.append(f"line 1: column {key!r} appears twice")
            continue
        columns[key] = index
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        hint = ""
        other = "\t" if delimiter != "\t" else ","
        if len(header) == 1 and other in header[0]:
            hint = (
                f"; the header looks {_format_name(other)}-separated: name the file "
                f"*.{_format_name(other).lower()}"
            )
        # A typo ('subjet_id') is the usual cause: name the found column closest to each.
        unknown = [h for h in header if h and h.lower() not in KNOWN_COLUMNS]
        guesses = [f"{close[0]!r} for {name}" for name in missing
                   for close in [difflib.get_close_matches(name, unknown, 1, 0.6)] if close]
        if guesses:
            hint += f"; did you mean {', '.join(guesses)}? rename the column"
        problems.append(
            f"line 1: missing required column(s) {', '.join(missing)} (found: "
            f"{', '.join(repr(h) for h in header)}){hint}"
        )
    return columns, problems


def _row(line, cells, header, columns, folder, check_files):
    problems = []
    where = f"line {line}"
    if len(cells) != len(header):
        problems.append(
            f"{where}: has {len(cells)} cells but the header has {len(header)} columns "
            "(a stray or missing delimiter, or an unquoted delimiter inside a value)"
        )
        return None, problems
    values = {name: cells[index].strip() for name, index in columns.items()}
    subject_id = values["subject_id"]
    session_id = values.get("session_id", "")
    problems += [f"{where}: {p}" for p in id_problems(subject_id, "subject_id")]
    if session_id:
        problems += [f"{where}: {p}" for p in id_problems(session_id, "session_id")]
    split = values.get("split", "").lower()
    if split and split not in SPLITS:
        problems.append(
            f"{where}: split {values['split']!r} is not one of {', '.join(SPLITS)} "
            "(leave it empty for an unassigned scan)"
        )
    header = values.get("header", "").lower()
    if header and header not in HEADER_FORMS:
        problems.append(
            f"{where}: header {values['header']!r} is not one of {', '.join(HEADER_FORMS)} "
            "(which form of the NIfTI header gives the scan's geometry; leave it empty for "
            "the pipeline's `header:`, by default FastSurfer's rule)"
        )
        header = ""
    image = _resolve(values["image"], folder)
    if header and image is not None and not image.name.lower().endswith(_NIFTI_SUFFIXES):
        problems.append(
            f"{where}: header {values['header']!r} is set but image {values['image']!r} is "
            "not NIfTI; only NIfTI holds a qform and an sform: leave the cell empty"
        )
    if image is None:
        problems.append(f"{where}: image is empty")
    elif check_files:
        problems += [f"{where}: {p}" for p in _file_problems(image, values["image"], "image")]
    label = _resolve(values.get("label", ""), folder)
    if label is not None and check_files:
        problems += [f"{where}: {p}" for p in _file_problems(label, values["label"], "label")]
    if image is not None and label is not None and image == label:
        problems.append(f"{where}: image and label are the same file {image}")
    if image is None:
        return None, problems
    metadata = {name: values[name] for name in columns if name not in KNOWN_COLUMNS}
    row = ManifestRow(
        row=line,
        subject_id=subject_id,
        session_id=session_id,
        image=image,
        label=label,
        split=split,
        metadata=metadata,
        header=header,
    )
    return row, problems


def _resolve(value: str, folder: Path) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = folder / path
    # Normalise without resolving symlinks, so duplicates written differently still match.
    return Path(os.path.abspath(path))


def _file_problems(path: Path, written: str, what: str) -> list[str]:
    shown = f"{what} {written!r}" + ("" if written == str(path) else f" ({path})")
    if not path.exists():
        return [f"{shown} does not exist"]
    if not path.is_file():
        return [f"{shown} is not a file"]
    if path.stat().st_size == 0:
        return [f"{shown} is empty (0 bytes)"]
    return []


def _duplicates(rows: list[ManifestRow]) -> list[str]:
    problems = []
    for key, lines in _repeats(rows, lambda r: r.key).items():
        subject, session = key
        what = f"subject_id {subject!r}" + (f" session_id {session!r}" if session else "")
        problems.append(
            f"lines {_join(lines)}: {what} appears {len(lines)} times; each (subject_id, "
            "session_id) must be unique: add a session_id or remove the repeats"
        )
    # resolve(): the same file reached through a symlink is still the same scan.
    for image, lines in _repeats(rows, lambda r: r.image.resolve()).items():
        listed = [r for r in rows if r.row in set(lines)]
        who = "; ".join(_who(r) for r in listed)
        splits = {r.split for r in listed}
        risk = ("so one scan is in two splits (a leak)" if len(splits) > 1
                else "a scan listed twice can land in two splits (a leak)")
        problems.append(
            f"lines {_join(lines)}: the same image {image} is listed {len(lines)} times "
            f"({who}); {risk}: keep one row"
        )
    return problems


def _who(row: ManifestRow) -> str:
    """How a duplicate's message names a row's person: ids and split."""
    ids = row.subject_id + (f"/{row.session_id}" if row.session_id else "")
    return f"{ids} in {row.split!r}" if row.split else f"{ids}, no split"


def _repeats(rows, key) -> dict:
    counts = Counter(key(r) for r in rows)
    repeated: dict = {}
    for row in rows:
        if counts[key(row)] > 1:
            repeated.setdefault(key(row), []).append(row.row)
    return repeated


def _join(lines: list[int]) -> str:
    return ", ".join(str(n) for n in lines)
