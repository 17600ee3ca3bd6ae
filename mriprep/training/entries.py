"""The entries an :class:`~mriprep.training.dataset.MRIDataset` reads, checked at opening.

From the cache index and the file sizes only (no tensor is read): :func:`split_entries`
gives the entries of one split (of a manifest's rows only, when given one; of one K-fold
fold's training or validation part, :func:`fold_entries`) and refuses a
cache that mixes pipeline hashes or an entry that records no output grid;
:func:`leave_out_flagged` leaves out what the last ``mriprep check`` flagged;
:func:`resolve_labels` decides whether label maps are read; :func:`check_files` refuses
missing or truncated tensor files. Each refusal is a
:class:`~mriprep.core.errors.CacheError` that says what to do.
"""

from __future__ import annotations

import collections
import warnings

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.check_record import exclude_flagged
from mriprep.core.errors import CacheError


def split_entries(cache: Cache, split: str, manifest=None,
                  fold: str | None = None) -> list[IndexEntry]:
    everything = cache.entries()
    if fold is not None and manifest is None:
        raise ValueError("MRIDataset: fold= needs manifest=, the manifest whose 'fold' "
                         "column `mriprep splits --folds K` wrote")
    if manifest is not None:
        folded = fold is not None and split in FOLD_SPLITS
        everything = manifest_entries(cache, everything, manifest,
                                      None if folded else split,
                                      (fold, split) if folded else None)
    hashes = collections.Counter(e.pipeline_hash for e in everything)
    if len(hashes) > 1:
        example = {e.pipeline_hash: e for e in reversed(everything)}
        listed = "; ".join(
            f"{h[:16]} ({n} entries, e.g. {example[h].subject_id} in split {example[h].split!r})"
            for h, n in hashes.most_common()
        )
        raise CacheError(
            f"cache {cache.root} mixes {len(hashes)} pipeline hashes: {listed}. Train, val "
            "and test must be preprocessed by one pipeline: keep one with `mriprep cache "
            f"prune {cache.root} --pipeline NAME_OR_HASH` (it lists what it removes first)"
        )
    if fold is not None and split in FOLD_SPLITS:
        entries = fold_entries(everything, manifest, split, fold)
    else:
        entries = [e for e in everything if e.split == split]
    if not entries:
        if not everything:
            raise CacheError(
                f"cache {cache.root} has no entries; fill it with `mriprep run MANIFEST -o CACHE`"
            )
        splits = collections.Counter(e.split for e in everything)
        listed = ", ".join(f"{s!r} ({n})" for s, n in sorted(splits.items()))
        raise CacheError(
            f"cache {cache.root} has no entries in split {split!r}; its splits are {listed}. "
            "Pass one of them as split="
        )
    gridless = [e.subject_id for e in entries if e.shape is None or e.affine is None]
    if gridless:
        raise CacheError(
            f"split {split!r} of cache {cache.root}: {len(gridless)} entries record no output "
            f"grid (shape and affine) ({', '.join(gridless[:5])}); rebuild them with "
            "`mriprep run --force`"
        )
    return entries


# The splits a fold divides: its training part and its validation part.
FOLD_SPLITS = ("train", "val")


def fold_entries(entries: list[IndexEntry], manifest, split: str,
                 fold: str) -> list[IndexEntry]:
    """Fold ``fold``'s training part (``split="train"``: the subjects of every other fold)
    or validation part (``"val"``), from the manifest's ``fold`` column."""
    from mriprep.check.manifest import manifest_name, manifest_rows
    from mriprep.splits import FOLD_COLUMN

    folds = {r.key: r.metadata.get(FOLD_COLUMN, "") for r in manifest_rows(manifest)}
    known = sorted({f for f in folds.values() if f}, key=lambda f: (len(f), f))
    if not known:
        raise CacheError(
            f"{manifest_name(manifest)} has no {FOLD_COLUMN!r} column (or it is empty); "
            "write one with `mriprep splits MANIFEST --folds K -o OUT`"
        )
    if fold not in known:
        raise CacheError(f"fold {fold!r} is not in {manifest_name(manifest)}, whose folds "
                         f"are {', '.join(known)}")
    keep = in_fold_part(fold, split)
    return [e for e in entries if keep(folds.get(e.identity, ""))]


def in_fold_part(fold: str, part: str):
    """Whether a row's ``fold`` value is in fold ``fold``'s training part (``part``
    ``"train"``: any other fold) or its validation part (``"val"``: that fold)."""
    if part == "train":
        return lambda value: bool(value) and value != fold
    return lambda value: value == fold


def leave_out_flagged(cache: Cache, split: str, entries: list[IndexEntry],
                      exclude: bool | str) -> tuple[list[IndexEntry], dict[str, tuple]]:
    """The entries the last check did not flag (``exclude_flagged=``: False, True or
    ``"warning"``, ``"error"``; :func:`mriprep.cache.check_record.exclude_flagged`), and
    the left-out ones' names -> their codes. What is left out is named in a warning, and
    so is a check that judged no label map against a table."""
    kept, exclusion = exclude_flagged(cache.root, entries, exclude)
    if exclusion is None:
        return kept, {}
    excluded = {name: tuple(dict.fromkeys(f.code for f in found))
                for name, found in exclusion.excluded.values()}
    if excluded or not exclusion.record.options.get("label_table"):
        named = f": {exclusion.named()} (dataset.excluded lists them all)" if excluded else ""
        warnings.warn(f"MRIDataset: split {split!r}: {exclusion.summary()}{named}",
                      stacklevel=3)
    return kept, excluded


def resolve_labels(cache: Cache, split: str, entries: list[IndexEntry], labels) -> bool:
    without = [e.subject_id for e in entries if not e.has_label]
    if labels is False:
        return False
    if not without:
        return True
    if labels is None and len(without) == len(entries):
        return False
    raise CacheError(
        f"split {split!r} of cache {cache.root}: {len(without)} of {len(entries)} entries "
        f"have no label map ({', '.join(without[:5])}); pass labels=False to read images "
        "only, or rerun `mriprep run` with label maps for every subject"
    )


def check_files(cache: Cache, entries: list[IndexEntry], labels: bool) -> None:
    names = ("image", "valid", "label") if labels else ("image", "valid")
    problems = []
    for e in entries:
        for name in names:
            path = cache.entry_file(e, name)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                problems.append(f"{e.subject_id}: {path} is missing")
                continue
            expected = e.files[name].bytes if name in e.files else None
            if expected is not None and size != expected:
                problems.append(f"{e.subject_id}: {path} has {size} bytes, expected {expected}")
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise CacheError(
            f"cache {cache.root} has {len(problems)} missing or truncated tensor file(s):\n"
            f"  {shown}{more}\nrerun `mriprep run` on the manifest to rebuild these entries "
            "(`mriprep check` lists every problem)"
        )


def manifest_entries(cache: Cache, entries: list[IndexEntry], manifest, split: str | None,
                     fold: tuple[str, str] | None = None) -> list[IndexEntry]:
    """The entries of the manifest's rows only; a row of ``split`` (of any split when
    None) that is not cached is named in a warning (``mriprep check --manifest`` makes
    it an error). With ``fold`` (the fold and ``"train"`` or ``"val"``) the rows warned
    about are that fold's part, and the warning names it."""
    from mriprep.check.manifest import manifest_name, manifest_rows
    from mriprep.splits import FOLD_COLUMN

    rows = manifest_rows(manifest)
    wanted = {r.key for r in rows}
    kept = [e for e in entries if e.identity in wanted]
    cached = {e.identity for e in kept}
    if fold is not None:
        k, part = fold
        in_part = in_fold_part(k, part)
        asked = lambda r: in_part(r.metadata.get(FOLD_COLUMN, ""))  # noqa: E731
        what = (f"fold {k}'s {'training' if part == 'train' else 'validation'} part "
                f"(split={part!r}, fold={k})")
    else:
        asked = lambda r: split is None or r.split == split  # noqa: E731
        what = f"split {split!r}" if split is not None else "any split"
    missing = [r.name for r in rows if r.key not in cached and asked(r)]
    if missing:
        warnings.warn(
            f"MRIDataset: {len(missing)} row(s) of {what} in "
            f"{manifest_name(manifest)} are not in cache {cache.root} "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): failed or not "
            "run; `mriprep check --manifest` names each with its reason",
            stacklevel=4,
        )
    return kept
