"""What ``mriprep check`` keeps of a check: its record in the cache
(:mod:`mriprep.cache.check_record`), built from the report and the entries it judged.

:func:`check_record` builds the record (pure); :func:`keep_record` writes the voxels of
the spatial label findings (:mod:`mriprep.cache.check_regions`) and then the record that
names them, and says where, or why it could not (a read-only cache: the check's verdict
stands, and the report says that ``--exclude-flagged`` and the QC report's flags have
nothing new to read).
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
from pathlib import Path
from typing import Any, Mapping

import mriprep
from mriprep.cache import IndexEntry
from mriprep.cache.check_record import (CheckRecord, KeptFinding, entry_state,
                                        write_check_record)
from mriprep.cache.check_regions import write_regions
from mriprep.check.label_regions import Region
from mriprep.check.report import CheckReport
from mriprep.core.hashing import hash_json
from mriprep.splits.near_duplicates import NEAR_DUPLICATE_THRESHOLD


def check_record(report: CheckReport, index: Mapping[str, IndexEntry],
                 label_counts: Mapping[str, Mapping[int, int] | None],
                 options: Mapping[str, Any], label_table: Any = None) -> CheckRecord:
    """The record of ``report``: its findings, ``options``, and every entry of ``index``
    as it was judged (its files' checksums, and ``label_counts`` of its map).

    ``label_table`` (a :class:`~mriprep.check.label_table.ClassTable`) names the label
    values the cohort holds; ``options`` holds the check's options as recorded, with
    ``label_table`` described by :func:`table_options`."""
    present: set[int] = set()
    entries = {}
    for key, entry in index.items():
        state = entry_state(entry)
        counts = label_counts.get(key)
        if counts is not None:
            state["label_voxels"] = {str(v): int(c) for v, c in sorted(counts.items())}
            present.update(int(v) for v in counts)
        entries[key] = state
    names = {}
    if label_table is not None:
        listed = dict(zip((int(i) for i in label_table.lut.ids), label_table.lut.names))
        names = {v: listed[v] for v in sorted(present) if v in listed}
    return CheckRecord(
        made=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        version=mriprep.__version__, ok=report.ok, options=dict(options),
        flags_again=again_flags(options), entries=entries,
        findings=tuple(KeptFinding.from_json(f.to_json()) for f in report.findings),
        label_names=names)


def table_options(table: Any, source: str) -> dict[str, Any]:
    """How the record names the label table a check used: its file, rules and hash."""
    return {"source": source, "sha256": hash_json(table.describe()),
            "processing": table.processing,
            "cortex": table.cortex, "unknown": table.unknown}


# The shipped DKT table (mriprep.training.labels.DKT_TABLE; check sits below training
# and does not import it), named by its short name rather than a path into site-packages.
_SHIPPED_DKT = Path(__file__).resolve().parents[1] / "training" / "labels" / "fastsurfer_dkt.tsv"


def again_flags(options: Mapping[str, Any]) -> str:
    """The options of ``mriprep check`` that check a cache again with the same manifest,
    label table (or label values), identity threshold and cast dtype. A table that was
    never a file (made in Python) is written ``--lut TABLE``: the user's to fill in."""
    words = []
    if options.get("manifest") and options["manifest"] != "the manifest":
        words += ["--manifest", str(options["manifest"])]
    table = options.get("label_table")
    if table:
        source = Path(table["source"])
        if source == _SHIPPED_DKT or (source.is_file() and source.resolve() == _SHIPPED_DKT):
            lut = "dkt"
        elif table["source"].startswith("("):  # "(in memory)": no file to name
            lut = "TABLE"
        else:
            lut = str(source)
        words += ["--lut", lut]
        defaults = {"processing": "aparc", "cortex": "fuse", "unknown": "error"}
        for name, default in defaults.items():
            if table.get(name) not in (None, default):
                words += [f"--{name}", str(table[name])]
        if options.get("absent_classes") not in (None, "error"):
            words += ["--absent-classes", str(options["absent_classes"])]
    elif options.get("allowed_labels"):
        words += ["--labels", ",".join(str(v) for v in options["allowed_labels"])]
    threshold = options.get("near_duplicate_threshold")
    if threshold is not None and threshold != NEAR_DUPLICATE_THRESHOLD:
        words += ["--near-threshold", str(threshold)]
    if options.get("dtype") not in (None, "float16"):
        words += ["--dtype", str(options["dtype"])]
    return " ".join(w if w == "TABLE" else shlex.quote(w) for w in words)


def keep_record(root: Path, record: CheckRecord,
                regions: Mapping[str, Mapping[str, Region]] | None = None) -> dict[str, Any]:
    """Write ``regions`` (key -> code -> :class:`~mriprep.check.label_regions.Region`)
    and then ``record``, naming them, into the cache; what the report says of it:
    ``{"kept": True, "path": ...}``, or ``{"kept": False, "path": ..., "reason": ...}``
    when the cache cannot be written (the check's findings stand; only the record is
    missing)."""
    from mriprep.cache.check_record import record_path

    regions = regions or {}
    try:
        # The archive first: the record that names it is the one readers go by.
        where, sha256 = write_regions(root, {key: {code: r.points for code, r in found.items()
                                                   if not r.whole_map}
                                             for key, found in regions.items()})
        record = dataclasses.replace(record, regions={
            "file": where.name if where is not None else None, "sha256": sha256,
            "entries": {key: {code: r.to_json() for code, r in sorted(found.items())}
                        for key, found in sorted(regions.items())}})
        path = write_check_record(root, record)
    except OSError as exc:
        return {"kept": False, "path": str(record_path(root)),
                "reason": (f"cannot write {record_path(root)} ({exc.strerror or exc}); the "
                           "findings stand, but leaving out flagged entries "
                           "(exclude_flagged=) and the QC report's flags read the last "
                           "record kept, if any: check a writable copy of the cache to "
                           "keep them")}
    return {"kept": True, "path": str(path)}
