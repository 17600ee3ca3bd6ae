"""The entries an :class:`~mriprep.training.dataset.MRIDataset` reads, checked at opening.

From the cache index and the file sizes only (no tensor is read): :func:`split_entries`
gives the entries of one split and refuses a cache that mixes pipeline hashes or an
entry that records no output grid;
:func:`resolve_labels` decides whether label maps are read; :func:`check_files` refuses
missing or truncated tensor files. Each refusal is a
:class:`~mriprep.core.errors.CacheError` that says what to do.
"""

from __future__ import annotations

import collections

from mriprep.cache import Cache, IndexEntry
from mriprep.core.errors import CacheError


def split_entries(cache: Cache, split: str) -> list[IndexEntry]:
    everything = cache.entries()
    hashes = collections.Counter(e.pipeline_hash for e in everything)
    if len(hashes) > 1:
        example = {e.pipeline_hash: e for e in reversed(everything)}
        listed = "; ".join(
            f"{h[:16]} ({n} entries, e.g. {example[h].subject_id} in split {example[h].split!r})"
            for h, n in hashes.most_common()
        )
        raise CacheError(
            f"cache {cache.root} mixes {len(hashes)} pipeline hashes: {listed}. Train, val "
            "and test must be preprocessed by one pipeline: rerun `mriprep run` with one "
            "pipeline into a fresh cache (or with --force)"
        )
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
            path = cache.tensor_path(e.key, name)
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
