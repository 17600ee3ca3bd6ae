"""Every finding code: its severity, what it means and how to fix it.

A :class:`~mriprep.core.findings.Finding` takes its severity from this registry, and
refuses a code that is not in it, so that every code a command can print is explained by
``mriprep check --explain CODE`` and listed in docs/qc.md (rendered by
:mod:`mriprep.check.codes`, and a test keeps the two equal). No code has a severity
that depends on its context: where the context decides (one person in two splits or
in one), the finding takes another code.

``found_by`` names the commands that report the code: ``check`` (``mriprep check``),
``cache verify`` (its integrity part) and ``splits`` (``mriprep splits``, on a
manifest). A new code is added here, with its meaning and its fix, before any check
emits it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(str, enum.Enum):
    """How bad a finding is: an error fails the gate, a warning is reported (and fails
    only ``--strict``), an info is reported so that nothing happens unseen and never
    fails anything (what the label table's rules rewrite, ``lut-rewrites``).

    A member equals its string (``Severity.ERROR == "error"``), so a finding's severity
    compares with the plain strings of JSON reports and tests.
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        # as 3.11's StrEnum (3.10 has none): f-strings show "error", not "Severity.ERROR"
        return self.value


CHECK = "check"
VERIFY = "cache verify"
SPLITS = "splits"


@dataclass(frozen=True)
class FindingCode:
    """One registered code: ``meaning`` says in one line what was found, ``fix`` what to do."""

    code: str
    severity: Severity
    meaning: str
    fix: str
    found_by: tuple[str, ...] = (CHECK,)


E, W = Severity.ERROR, Severity.WARNING
_INTEGRITY = (CHECK, VERIFY)
_LEAKS = (CHECK, SPLITS)
_REBUILD = "rebuild the entry with `mriprep run --force` (or `mriprep cache repair CACHE` " \
           "to quarantine it)"

_REGISTRY = (
    # -- the index (mriprep.check.cache_check, mriprep.check.index) --------------------
    FindingCode(
        "index-unreadable", E, "index.json cannot be read, so no entry can be checked",
        "`mriprep cache repair CACHE` rebuilds the index from the entries' sidecars",
        _INTEGRITY),
    FindingCode(
        "empty-cache", E, "the cache has no indexed entries",
        "run `mriprep run MANIFEST -o CACHE` first", _INTEGRITY),
    FindingCode(
        "index-entry-unsafe", E,
        "an index entry would lead outside the cache (a bad key, file name or id); it is "
        "never followed",
        "index.json was written by something other than mriprep: `mriprep cache repair "
        "CACHE` takes the entry out of the index and quarantines it", _INTEGRITY),
    FindingCode(
        "index-malformed", E, "an index entry is not well formed (a field missing or of the "
                              "wrong type)",
        "`mriprep cache repair CACHE` rebuilds the entry's record from its meta.json",
        _INTEGRITY),
    FindingCode(
        "geometry", E, "an entry's recorded grid contradicts itself (shape, spacing, "
                       "affine, label dtype)",
        _REBUILD, _INTEGRITY),
    # -- the tensor pass (mriprep.check.tensors, mriprep.check.entries) -----------------
    FindingCode(
        "file-missing", E, "a file the index records for an entry is not on disk",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "file-size", E, "a tensor file is truncated, has bytes after its data, or differs "
                        "from the size the index records",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "tensor-unreadable", E, "a tensor file cannot be opened or decoded as a safe "
                                ".npy or blosc2 array",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "tensor-layout", E, "a tensor is stored in Fortran order; the cache writes C order "
                            "only",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "dtype-mismatch", E, "a tensor's dtype differs from the one the index records",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "shape-mismatch", E, "a tensor's shape differs from the one the index records",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "checksum-mismatch", E, "a file's bytes differ from the checksum the index records "
                                "(bit rot, a partial copy or an edit)",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "non-finite", E, "an image holds NaN or Inf voxels, which turn the training loss "
                         "into NaN",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "meta-missing", E, "an entry's meta.json sidecar is missing or unreadable",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "meta-mismatch", E, "an entry's meta.json and its index record disagree (one was "
                            "edited after writing)",
        _REBUILD, _INTEGRITY),
    FindingCode(
        "extreme-values", E, "image values overflow to Inf when training casts them to "
                             "--dtype (float16: |x| > 65504)",
        "rebuild with a pipeline that normalizes intensities, or check with the --dtype "
        "training really casts to"),
    FindingCode(
        "cast-underflow", W, "over 0.1% of an image's nonzero values fall below --dtype's "
                             "smallest normal number: the cast loses the contrast",
        "rebuild with a pipeline that normalizes intensities (z-score or 0-1)"),
    FindingCode(
        "cast-precision", W, "an image holds integers --dtype cannot hold exactly "
                             "(float16: above 2048): the cast rounds them",
        "cache the image as normalized float32 intensities, or rescale it"),
    # -- labels (mriprep.check.labels) ---------------------------------------------------
    FindingCode(
        "label-values", E, "a label map holds values outside its allowed set",
        "fix the label map or the pipeline's label list (or pass the right --labels)"),
    FindingCode(
        "labels-unchecked", W, "label maps without a recorded set of allowed values were "
                               "not checked",
        "pass --labels VALUES (e.g. 0,2,4-7)"),
    # -- labels against the class table training uses (mriprep.check.label_table) --------
    FindingCode(
        "lut-unknown-values", E, "a label map holds values the --lut table does not list "
                                 "after its rules (or negative values): training refuses "
                                 "the map",
        "add the values to the table, or count them as background: --unknown background "
        "at export and check (LabelTable(unknown='background') in Python)"),
    FindingCode(
        "lut-unknown-background", W, "a label map holds values the --lut table does not "
                                     "list after its rules; --unknown background makes "
                                     "them class 0",
        "none needed if meant; else add the values to the table"),
    FindingCode(
        "label-side-swap", E, "left/right pairs of the label table (Left-X/Right-X, "
                              "ctx-lh/ctx-rh parcels) lie on the wrong side of the head "
                              "in world coordinates: a map mirrored against its image, or "
                              "swapped hemispheres or structures",
        "check the label map's affine against its image and the labelling tool's "
        "left/right numbering; regenerate or relabel the map"),
    FindingCode(
        "label-off-anatomy", W, "labels lie where the image shows no head, or away "
                                "from the brain's labelled mass (a blob in the "
                                "background or the scalp, a map of another field of "
                                "view or a bad resampling)",
        "check the label map's field of view and resampling against its image; remove "
        "the stray labels"),
    FindingCode(
        "label-misfit", W, "the label map does not lie on its image: cerebral white "
                           "matter and cortex separate better with the map moved by a "
                           "voxel or two, or hardly at all (another person's map)",
        "check that the label map belongs to this image and was resampled with its "
        "affine; regenerate it from this image"),
    FindingCode(
        "label-islands", W, "a structure of a label map has more of its voxels scattered "
                            "as specks far from its body than automatic segmentations "
                            "leave (a bad resampling, noise written as labels)",
        "look at the structure in the QC report; regenerate the map, or remove the "
        "specks (keep each structure's largest connected pieces)"),
    FindingCode(
        "label-volume", W, "structures of a label map are far larger or smaller than the "
                           "cohort's, as a share of the labelled volume (robust z over "
                           "the cohort's maps, with a floor on the spread)",
        "look at the structures in the QC report and the segmentation; regenerate or fix "
        "the map, or leave the entry out"),
    FindingCode(
        "label-structure-missing", W, "a label map has no voxel of structures that most "
                                      "of the cohort's maps hold (a missing cerebellum, "
                                      "a cut field of view)",
        "check the field of view and the segmentation; regenerate the map, or leave the "
        "entry out"),
    FindingCode(
        "lut-cortex-lost", E, "a label map has cerebral cortex (3/42) but no cortical "
                              "parcels (1000-2999): the aparc rules would send all its "
                              "cortex to background (an aseg.mgz)",
        "use a segmentation with parcels (aparc.DKTatlas+aseg or aparc+aseg), or a table "
        "of aseg classes with --processing aseg"),
    FindingCode(
        "lut-absent-classes", E, "classes of the --lut table are absent from every label "
                                 "map of a split: the network would never learn them, and "
                                 "training refuses them",
        "check the segmentations, use a table without these classes, or accept them: "
        "--absent-classes allow at export and check (absent_classes='allow' in "
        "MRIDataset)"),
    FindingCode(
        "lut-absent-allowed", W, "classes of the --lut table are absent from every label "
                                 "map of a split, accepted by --absent-classes allow",
        "none needed if meant: the network never learns these classes"),
    FindingCode(
        "lut-rewrites", Severity.INFO,
        "the rules before the --lut lookup rewrite label values (e.g. Desikan-only "
        "parcels, 1000/2000, 251-255, 3/42): voxels per rule over the cohort, so nothing "
        "is mapped away unseen",
        "none needed; --processing none applies no rules"),
    # -- one pipeline, honest splits (mriprep.check.index, mriprep.splits.leaks) -------
    FindingCode(
        "pipeline-mismatch", E, "entries were made by another pipeline than the rest: the "
                                "splits are not preprocessed the same way",
        "rerun `mriprep run` with one pipeline, or remove the other pipelines' entries "
        "(`mriprep cache prune CACHE --pipeline KEPT_NAME_OR_HASH`)"),
    FindingCode(
        "grid-mismatch", W, "one pipeline produced entries on different grids (shape or "
                            "spacing)",
        "whole-volume batches need one shape: check the pipeline's output grid"),
    FindingCode(
        "split-missing", E, "scans have no split",
        "assign splits per subject (`mriprep splits MANIFEST --assign ... -o OUT`), then "
        "rerun `mriprep run` on the assigned manifest", _LEAKS),
    FindingCode(
        "subject-split-leak", E, "one subject's scans (sessions) are in more than one split",
        "put every session of a subject in one split (`mriprep splits --assign "
        "--reassign`), then rerun `mriprep run`", _LEAKS),
    FindingCode(
        "duplicate-input", E, "the same input image file (SHA-256) is under two subject ids "
                              "or in two splits",
        "keep one copy in the manifest", _LEAKS),
    FindingCode(
        "duplicate-tensor", E, "the same cached image (XXH3) is under two subject ids or in "
                               "two splits",
        "keep one copy in the manifest and rerun `mriprep run`"),
    FindingCode(
        "duplicate-session", W, "the same image is repeated within one subject and split: "
                                "no leak, but one scan weighs twice",
        "drop the repeated scan from the manifest", _LEAKS),
    # -- one person under several ids (mriprep.check.identity): one finding per person ---
    FindingCode(
        "identity-leak", E, "subject ids in two or more splits show one person's anatomy "
                            "(identity correlation >= 0.7)",
        "give the ids one subject id in the manifest, reassign splits by subject "
        "(`mriprep splits --assign`) and rerun `mriprep run`"),
    FindingCode(
        "possible-identity-leak", W, "subject ids in two or more splits may show one "
                                     "person (identity correlation below the error "
                                     "threshold)",
        "compare the scans; if they are one person, give them one subject id and "
        "reassign splits by subject"),
    FindingCode(
        "near-duplicate", W, "subject ids in one split look like one person",
        "if they are one person under several ids, merge the ids in the manifest"),
    FindingCode(
        "identity-too-uniform", W, "the entries deviate from the reference population "
                                   "alike, so identity findings may name different people",
        "compare the named scans by eye; the images may be of another contrast, scanner "
        "or population than the reference"),
    # -- quality, headers, resolution (mriprep.check.quality, .headers, .resolution) ---
    FindingCode(
        "qc-outlier", W, "an entry's QC metric is far from its cohort's (robust z)",
        "look at the entry in the QC report (`mriprep report CACHE`)"),
    FindingCode(
        "qc-missing", W, "some entries have no QC metrics, so outliers are judged without "
                         "them",
        "`mriprep report CACHE` makes them"),
    FindingCode(
        "header-conflict", W, "an input's qform and sform disagree by more than 1 mm and "
                              "no `header:` chose between them",
        "set `header: qform` or `header: sform` in the pipeline or the manifest's "
        "`header` column for the scan, and rerun"),
    FindingCode(
        "resolution-falsely-fine", W, "an input's header claims at least 1.5x finer voxels "
                                      "than its data hold along an axis: it was "
                                      "interpolated onto a finer grid than acquired",
        "conform the scan to its true resolution (the plausibility step's "
        "acquired_resolution_mm), or re-export it at its acquired resolution, and rerun"),
    # -- the cache against its manifest (mriprep.check.manifest) --------------------------
    FindingCode(
        "manifest-missing", E, "manifest rows are not in the cache and no run report lists "
                               "them as failed",
        "run `mriprep run` on the manifest to complete the cache"),
    FindingCode(
        "manifest-failed", E, "manifest rows failed preprocessing and are not cached",
        "fix them and rerun, or list them in an exclusions file (`mriprep check "
        "--exclude FILE`) to train without them on purpose"),
    FindingCode(
        "manifest-split-mismatch", E, "a row's split in the manifest differs from its "
                                      "entry's split in the cache",
        "rerun `mriprep run` with this manifest so the cache follows it"),
    FindingCode(
        "manifest-excluded", W, "manifest rows are not cached and listed as known "
                                "exclusions",
        "none needed: they were excluded on purpose (--exclude)"),
    FindingCode(
        "not-in-manifest", W, "cache entries are not rows of the manifest; a Dataset over "
                              "the cache still trains on them",
        "pass the manifest to the Dataset (`MRIDataset(..., manifest=M)`), or `mriprep "
        "cache prune CACHE --manifest M`"),
)

CODES: dict[str, FindingCode] = {c.code: c for c in _REGISTRY}
if len(CODES) != len(_REGISTRY):  # a programming error: fail at import, not in a report
    raise RuntimeError("a finding code is registered twice in mriprep/core/finding_codes.py")
