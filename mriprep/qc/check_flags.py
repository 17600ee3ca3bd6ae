"""What the QC report shows of ``mriprep check``: each labelled subject's per-structure
table (:mod:`mriprep.qc.structures`) and the findings the last check kept for it
(:mod:`mriprep.cache.check_record`), read from the cache here, at the report's edge.

Structures are named from the label table the check used, else as the label mosaic's
legend names them. The voxels per structure come from the check's record when it judged the entry as it is
now (the tensor pass counted them), else from the label map itself. A record older than
an entry is not shown as the entry's findings: the page says it is stale and which
command checks again. Nothing here raises for a damaged cache: what cannot be read
becomes a note on the page.

Where the check kept the voxels of an entry's spatial label findings
(:mod:`mriprep.cache.check_regions`), :func:`draw_flags` draws them on the label map
(:mod:`mriprep.qc.flag_mosaic`) into the report's folder, for the entries the record is
fresh for; an entry with such findings and no picture says why (a stale record, a
record or archive without its regions, an unreadable tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.check_record import CheckRecord, KeptFinding, read_check_record
from mriprep.cache.check_regions import REGION_CODES, read_regions
from mriprep.core.atomic import atomic_path
from mriprep.core.errors import MriprepError
from mriprep.core.hashing import hash_json
from mriprep.qc.flag_mosaic import FlaggedRegion, code_order, flag_picture, legend_entry
from mriprep.qc.mosaic import label_legend
from mriprep.qc.structures import (StructureRow, cohort_medians, label_counts,
                                   structure_rows, volumes)


@dataclass
class SubjectCheck:
    """One cached subject's part of the report: ``structures`` (None without a label
    map), ``findings`` the check kept for it (warnings and errors that name it, alone or
    with others), and ``note``: why there are none to show (no record, a stale one, an
    unreadable map)."""

    structures: list[StructureRow] | None = None
    findings: list[KeptFinding] = field(default_factory=list)
    note: str = ""
    # The check's spatial findings of this entry as the record keeps them (code ->
    # voxels, kept, whole_map), the picture drawn of them (file name, size, legend),
    # or why none was drawn.
    regions: dict[str, Any] = field(default_factory=dict)
    flag_picture: dict[str, Any] | None = None
    flag_note: str = ""

    @property
    def codes(self) -> list[str]:
        return list(dict.fromkeys(f.code for f in self.findings))


@dataclass
class CohortCheck:
    """The check as the index page shows it: when it ran (None: no record), each
    subject's part by entry key, and a note for the whole report."""

    made: str | None
    subjects: dict[str, SubjectCheck]
    note: str = ""
    record: CheckRecord | None = None

    @property
    def flagged(self) -> int:
        return sum(1 for s in self.subjects.values() if s.findings)


def cohort_check(cache_root: str | Path, read_maps: bool = True) -> CohortCheck:
    """Every indexed entry's structures and kept findings.

    The structure table counts each label map's voxels from a fresh check record, else
    from the map itself (a read of every map); ``read_maps=False`` (the report at the
    end of a run, which must not become a second pass over the cohort) leaves the table
    out where no fresh record holds the counts, and says so."""
    root = Path(cache_root)
    cache = Cache(root)
    try:
        entries = cache.read_entries().entries
    except MriprepError as exc:  # the report shows the damaged index already
        return CohortCheck(None, {}, f"the check's findings cannot be shown: {exc}")
    note = ""
    try:
        record = read_check_record(root)
    except MriprepError as exc:
        record, note = None, str(exc)
    if record is None and not note:
        note = (f"no check has kept its findings for this cache: `mriprep check {root} "
                "--lut dkt` (or your label table) judges the label maps and keeps them")
    stale = record.stale(entries.values()) if record is not None else {}
    subjects = {key: SubjectCheck() for key in entries}
    counts: dict[str, dict[int, int]] = {}
    for key, entry in entries.items():
        part = subjects[key]
        if record is not None and key in stale:
            part.note = (f"the check record of {record.made} is stale for this entry "
                         f"({stale[key]}): `{record.again(root)}` judges it again")
        elif record is not None:
            part.findings = [f for f in record.findings_of(key) if f.at_least("warning")]
            part.regions = _spatial(record, key, part.findings)
        if entry.has_label:
            found = _counts(cache, entry, record if key not in stale else None, read_maps)
            if isinstance(found, str):
                part.note = "; ".join(filter(None, (part.note, found)))
            else:
                counts[key] = found
    voxel = {key: _voxel_mm3(entries[key]) for key in counts}
    medians = cohort_medians(volumes(c, voxel[key]) for key, c in counts.items())
    names = _names({v for c in counts.values() for v in c}, record)
    for key, found in counts.items():
        subjects[key].structures = structure_rows(found, voxel[key], medians, names)
    return CohortCheck(record.made if record is not None else None, subjects, note, record)


def _spatial(record: CheckRecord, key: str, findings: list[KeptFinding]) -> dict[str, Any]:
    """The kept regions of the entry's spatial findings; a finding of a spatial code
    without a kept region (a record written before regions were kept) maps to None."""
    kept = record.regions_of(key)
    return {f.code: kept.get(f.code) for f in findings if f.code in REGION_CODES}


def draw_flags(cache_root: str | Path, check: CohortCheck, out: Path) -> None:
    """Draw each entry's flagged regions into ``out/KEY/label_flags-STAMP.jpg`` (the
    report's folder) where the check kept them, and say on the entry why not where it
    could not.

    ``STAMP`` names the record and the entry's regions a picture was drawn from: a
    report that finds its picture there already (the record unchanged, and fresh for
    the entry, so its tensors too) shows it without drawing it again. Pictures an
    earlier report left, for another record or for an entry that has none now, are
    removed."""
    root = Path(cache_root)
    cache = Cache(root)
    wanted = {key: part for key, part in check.subjects.items() if part.regions}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    problem = ""
    if wanted and any(r is not None for p in wanted.values() for r in p.regions.values()):
        try:
            arrays = read_regions(root, check.record.regions)
        except MriprepError as exc:
            problem = str(exc)
    for key, part in check.subjects.items():
        folder = out / key
        name = ""
        why = ""
        if key in wanted:
            why = problem or _missing_regions(part.regions, root, check.record)
        if key in wanted and not why:
            name = f"{FLAG_PICTURE}-{_stamp(check.record, part.regions)}.jpg"
            try:
                part.flag_picture = _shown(folder / name, key, part.regions) \
                    or _draw(cache, key, part.regions, arrays.get(key, {}),
                             check.record.label_voxels(key), folder / name)
            except (MriprepError, OSError, ValueError) as exc:
                why, name = f"{type(exc).__name__}: {exc}", ""
        if why:
            part.flag_note = f"no picture of the flagged regions: {why}"
        for old in folder.glob(f"{FLAG_PICTURE}*.jpg") if folder.is_dir() else ():
            if old.name != name:
                old.unlink(missing_ok=True)


FLAG_PICTURE = "label_flags"


def _stamp(record: CheckRecord, regions: dict[str, Any]) -> str:
    return hash_json({"made": record.made, "archive": record.regions.get("sha256"),
                      "regions": regions})[:12]


def _legend(regions: dict[str, Any]) -> list[dict[str, Any]]:
    """The picture's legend from the record's summaries (as :func:`flag_picture` gives
    it), for a picture drawn by an earlier report."""
    return [legend_entry(code, kept["voxels"], kept["kept"], kept["whole_map"])
            for code, kept in sorted(regions.items(), key=lambda ck: code_order(ck[0]))]


def _shown(path: Path, key: str, regions: dict[str, Any]) -> dict[str, Any] | None:
    """What the page shows of a picture already drawn from these regions, if any."""
    if not path.is_file():
        return None
    return {"src": f"../{key}/{path.name}", "size": _size(path), "legend": _legend(regions)}


def _size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as opened:
        return opened.size


def _missing_regions(regions: dict[str, Any], root: Path,
                     record: CheckRecord | None) -> str:
    lost = [code for code, kept in regions.items() if kept is None]
    if not lost or record is None:
        return ""
    return (f"the check record of {record.made} keeps no region for {', '.join(lost)} "
            f"(it was written before regions were kept): `{record.again(root)}` keeps them")


def _draw(cache: Cache, key: str, regions: dict[str, Any], points: dict[str, np.ndarray],
          values: dict[int, int] | None, path: Path) -> dict[str, Any]:
    """Draw one entry's regions (the record's summaries, the archive's ``points``) into
    ``path``, the labels in the colours of the label mosaic's legend for the map's
    ``values`` (the record's counts; else counted here); what the page shows of it."""
    from mriprep.cache.sidecar import read_sidecar

    flagged = {}
    for code, kept in regions.items():
        if kept.get("whole_map"):
            flagged[code] = FlaggedRegion(code, int(kept["voxels"]), None)
        elif code in points:
            flagged[code] = FlaggedRegion(code, int(kept["voxels"]), points[code])
        else:
            raise ValueError(f"the regions' archive holds no {code} voxels for this entry; "
                             "check the cache again to write them")
    labels = np.asarray(cache.load_tensor(key, "label"))
    image = np.asarray(cache.load_tensor(key, "image"))
    affine = read_sidecar(cache, key).affine
    if affine is None:
        raise ValueError(f"{cache.entry_dir(key) / 'meta.json'} records no affine")
    legend = label_legend(values if values is not None else label_counts(labels))
    picture, shown = flag_picture(image, labels, affine, flagged,
                                  {e["value"]: e["colour"] for e in legend})
    with atomic_path(path) as tmp:
        tmp.write_bytes(picture)
    return {"src": f"../{key}/{path.name}", "size": _size(path), "legend": shown}


def _counts(cache: Cache, entry: IndexEntry, record: CheckRecord | None,
            read_maps: bool = True) -> dict[int, int] | str:
    """Voxels per label value (from a fresh record, else the map), or why not."""
    if record is not None:
        kept = record.label_voxels(entry.key)
        if kept is not None:
            return kept
    if not read_maps:
        return (f"no structure table: no fresh check record holds its label counts "
                f"(`mriprep check {cache.root} --lut dkt` keeps them, or `mriprep report "
                f"{cache.root}` counts them)")
    try:
        return label_counts(np.asarray(cache.load_tensor(entry.key, "label")))
    except (MriprepError, OSError, ValueError) as exc:
        return f"its label map cannot be read for the structure table ({exc})"


def _names(values: set[int], record: CheckRecord | None) -> dict[int, str]:
    """Value -> name: from the table the check judged with, else from the shipped DKT
    table where the maps are numbered as FreeSurfer numbers labels (the label mosaic's
    legend, :func:`mriprep.qc.mosaic.label_legend`)."""
    names = {e["value"]: e["name"] for e in label_legend(values) if e["in_table"]}
    if record is not None:
        names.update(record.label_names)
    return names


def _voxel_mm3(entry: IndexEntry) -> float:
    spacing = entry.spacing
    return float(np.prod(spacing)) if spacing else 1.0


def subject_context(part: SubjectCheck | None) -> dict[str, Any]:
    """The subject page's variables for its structure table and check findings."""
    if part is None:
        return dict(structures=None, check_findings=[], check_note="", flag_picture=None,
                    flag_note="")
    return dict(structures=part.structures, check_findings=part.findings,
                check_note=part.note, flag_picture=part.flag_picture,
                flag_note=part.flag_note)
