"""The tensor cache: content-addressed, atomic, checksummed, memory-mappable, no pickle.

Layout of a cache folder::

    CACHE/
      mriprep-cache.json          marker: format name and version
      index.json                  the live entries (one per subject/session) and their split
      entries/<key>/image.npy     float32, float16 or uint8 [X, Y, Z], C order (.b2nd when
                                  compressed: the suffix names the format, cache.formats)
      entries/<key>/valid.npy     bool [X, Y, Z]: False where a voxel was filled or masked
      entries/<key>/label.npy     int16 [X, Y, Z] (only when the subject has a label map)
      entries/<key>/meta.json     sidecar: geometry, inputs, checksums, provenance
      entries/<key>/transform.tfm registration transform, ITK format (registered entries)
      entries/.tmp/               entries being written (never read)
      reports/latest.json|csv     the last run's per-subject report (+ timestamped copies)
      quarantine/<key>/           damaged entries moved aside by mriprep.maintenance.repair

Identity. ``<key>`` is the SHA-256 of the subject and session ids, the SHA-256 of every
input file's bytes, the pipeline hash and the NIfTI form (qform or sform) the input was
read with, when one was chosen (a manifest row's ``header``; :func:`entry_key`). Changing an input byte or a
parameter gives a new key, so a rerun recomputes exactly what changed and skips the rest.

Atomicity. An entry is written into a private folder under ``entries/.tmp``, every file
is fsynced, ``meta.json`` is written last, and the folder is renamed into place in one
``rename(2)``. A reader therefore sees either no entry or a complete one; a crash leaves
only a stale temporary folder, which is never read and is swept by the next writer. Once
on disk, a tensor's pages leave the page cache (:func:`drop_written_pages`).

Index. ``index.json`` maps each live key to its entry (:class:`IndexEntry`: the sidecar
without provenance, and the split). Several runs may share a cache: every update is a
read-modify-write under an exclusive ``flock`` on ``.lock``, written atomically. An index
keeps one entry per (subject_id, session_id): indexing a new key for a subject retires the
old one from the index (its folder stays on disk until a clean-up).

Checksums. Each tensor file's bytes are hashed with XXH3-128 (``xxhash``): not a security
hash, but it detects flipped bits at memory speed, which is what a pre-training check needs.

Trust. An index may be written by anyone who can write one file of a shared cache: every
document is checked on reading (:mod:`~mriprep.cache.safety`: the key is a digest, a file
record a plain file name, the ids obey the manifest's rules) and one that fails is
refused, named, and followed by nobody.

Modules: :mod:`~mriprep.cache.store` (the folder, :class:`Cache`), :mod:`~mriprep.cache.entry`
(an entry as the index lists it, :class:`IndexEntry`), :mod:`~mriprep.cache.index_reader`
(the index's documents as entries or refusals), :mod:`~mriprep.cache.safety` (what an
entry must be before it is followed), :mod:`~mriprep.cache.files` (how a file of an entry
is recorded), :mod:`~mriprep.cache.formats` (how a tensor is stored: one module per
format, and the registry every reader and writer goes through),
:mod:`~mriprep.cache.sidecar` (an entry's ``meta.json`` as a typed record),
:mod:`~mriprep.cache.run_report` (a run's rows, and the one reader of run reports).
"""

from mriprep.cache.entry import FileRecord, IndexEntry, MalformedEntry, UnsafeEntry
from mriprep.cache.files import drop_written_pages, file_record
from mriprep.cache.formats.npy import npy_checksum, npy_header
from mriprep.cache.index_reader import IndexReading, RefusedEntry, read_entries
from mriprep.cache.safety import is_key
from mriprep.cache.store import (
    FORMAT_NAME,
    FORMAT_VERSION,
    DERIVED_DIR,
    QC_DIR,
    QUARANTINE_DIR,
    REPORTS_DIR,
    REQUIRED_META,
    TENSOR_NAMES,
    Cache,
    entry_key,
)

__all__ = [
    "DERIVED_DIR", "FORMAT_NAME", "FORMAT_VERSION", "QC_DIR", "QUARANTINE_DIR", "REPORTS_DIR", "REQUIRED_META",
    "TENSOR_NAMES", "Cache",
    "FileRecord", "IndexEntry", "IndexReading", "MalformedEntry", "RefusedEntry",
    "UnsafeEntry", "drop_written_pages", "entry_key", "file_record", "is_key",
    "npy_checksum", "npy_header", "read_entries",
]
