"""How fast `mriprep check` reads a cache, and how its index checks scale.

Two measurements (nothing is asserted; the numbers are printed and returned):

1. Tensor throughput on a warm cache of template-sized volumes (197x233x189 float32
   image, bool mask, int16 labels: 61 MB per entry). The cache is read once to warm the
   page cache, then timed in 5 interleaved rounds (median and range): a bare
   ``readinto`` loop over every file (what the page cache delivers to one reader),
   ``checksum_file`` alone, and the full ``check_cache`` (checksum, finiteness, range,
   fingerprints, label counts, valid counts, and the cast checks for the float16 that
   training casts to) with 1 thread, with 1 thread and ``dtype="float32"`` (no cast
   check; the paired ratio of the two, their order turned each round, is what the cast
   checks add, where the image is not float16 already), and with the default thread
   count.
2. Scaling of the index checks with 1k, 3k, 10k and 30k small entries (up to
   ``EXACT_SEARCH_MAX``, below which ``auto`` compares every pair): ``check_index`` on
   synthetic index entries and fingerprints (pipeline, split leaks, identical inputs and
   tensors, identity search with planted rescans), with the exact all-pairs
   search and the LSH search side by side, and optionally the full ``check_cache`` over
   real caches of small (16^3) entries.

Run: ``python benchmarks/bench_check.py [--cache DIR] [--entries N] [--sizes 1000,3000,10000,30000]
[--full-sizes 1000,3000]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from mriprep import check as chk
from mriprep.cache import Cache, IndexEntry, file_record
from mriprep.check.index import check_index
from mriprep.core.hashing import checksum_file

PIPELINE = hashlib.sha256(b"bench pipeline").hexdigest()
SPLITS = ("train", "train", "train", "train", "train", "train", "train", "train", "val", "test")


# -- 1. tensor throughput --------------------------------------------------------------


def build_template_cache(root: Path, entries: int) -> Path:
    """A cache of ``entries`` template-sized subjects written with ``Cache.write_entry``."""
    from scipy import ndimage

    from mriprep.inputs.templates import load_mni152_tissue, load_template

    template = load_template("mni152")
    tissue = load_mni152_tissue()
    label = np.zeros(template.shape, dtype=np.int16)
    label[tissue["gm"] > 0.5] = 1
    label[tissue["wm"] > 0.5] = 2
    cache = Cache(root, create=True)
    rng = np.random.default_rng(0)
    small = tuple(s // 8 for s in template.shape)
    indexed = []
    for i in range(entries):
        field = ndimage.zoom(rng.standard_normal(small), 8, order=1)
        field = np.pad(
            field, [(0, t - f) for t, f in zip(template.shape, field.shape)], mode="edge"
        )
        image = template.data * (
            1 + 0.2 * field[: template.shape[0], : template.shape[1], : template.shape[2]]
        )
        image = ((image - image.mean()) / image.std()).astype(np.float32)
        subject = f"sub-{i:04d}"
        meta = _meta(subject, template.affine, template.shape)
        key = hashlib.sha256(subject.encode()).hexdigest()
        valid = np.ones(template.shape, dtype=bool)
        entry = cache.write_entry(key, {"image": image, "valid": valid, "label": label}, meta)
        indexed.append(entry.with_split(SPLITS[i % len(SPLITS)]))
    cache.update_index(indexed)
    return root


def _meta(subject: str, affine: np.ndarray, shape) -> dict:
    return {
        "subject_id": subject,
        "session_id": "",
        "pipeline_name": "bench",
        "pipeline_hash": PIPELINE,
        "inputs": {
            "image": {
                "path": f"/data/{subject}.nii.gz",
                "sha256": hashlib.sha256(subject.encode()).hexdigest(),
            }
        },
        "affine": affine,
        "spacing": [float(s) for s in np.linalg.norm(affine[:3, :3], axis=0)],
        "shape": list(shape),
        "provenance": [{"stage": "validate", "params": {"allowed_labels": [0, 1, 2]}}],
    }


def _tensor_files(cache_dir: Path) -> list[Path]:
    cache = Cache(cache_dir)
    return [
        cache.entry_dir(entry.key) / record.file
        for entry in cache.entries()
        for record in entry.files.values()
    ]


def _bare_read(files: list[Path]) -> int:
    buffer = bytearray(4 << 20)
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buffer):
                total += n
    return total


WITH_CAST = "check_cache, 1 thread"
WITHOUT_CAST = "check_cache, 1 thread, dtype float32 (no cast check)"


def measure_throughput(cache_dir: Path, workers: int | None = None,
                       rounds: int = 5) -> list[dict]:
    """Every case once per round, the cases in turn, ``rounds`` rounds after one warm
    read: per case the median round and the range. The paired per-round ratio of the
    default check (float16 casts judged) to ``dtype="float32"`` (no cast check), on one
    thread and their order turned each round, is what the cast checks add where the
    image is not float16 already."""
    files = _tensor_files(cache_dir)
    total = _bare_read(files)  # warm the page cache
    default = workers or min(4, os.cpu_count() or 1)
    cases = {
        "bare readinto (the read alone)": lambda: _bare_read(files),
        "checksum_file only": lambda: [checksum_file(p) for p in files],
        WITH_CAST: lambda: _require_ok(chk.check_cache(cache_dir, workers=1)),
        WITHOUT_CAST: lambda: _require_ok(
            chk.check_cache(cache_dir, workers=1, dtype="float32")),
        f"check_cache, {default} threads": lambda: _require_ok(
            chk.check_cache(cache_dir, workers=default)),
    }
    turned = [{WITH_CAST: WITHOUT_CAST, WITHOUT_CAST: WITH_CAST}.get(c, c) for c in cases]
    seconds: dict[str, list[float]] = {case: [] for case in cases}
    for r in range(rounds):
        for case in (list(cases) if r % 2 == 0 else turned):
            start = time.perf_counter()
            cases[case]()
            seconds[case].append(time.perf_counter() - start)
    rows = []
    for case, taken in seconds.items():
        median = float(np.median(taken))
        rows.append({
            "bench": "check-throughput", "case": case, "files": len(files),
            "mb": round(total / 1e6, 1), "rounds": rounds, "seconds": round(median, 3),
            "seconds_range": f"{min(taken):.3f}-{max(taken):.3f}",
            "mb_per_s": round(total / 1e6 / median, 1),
        })
    cast = np.array(seconds[WITH_CAST]) / np.array(seconds[WITHOUT_CAST])
    rows.append({"bench": "check-cast-cost", "files": len(files), "rounds": rounds,
                 "with_over_without": round(float(np.median(cast)), 3),
                 "range": f"{cast.min():.3f}-{cast.max():.3f}"})
    return rows


# Findings of the tensor pass: a cache with one of these would time the wrong thing.
# Index findings (the demo cache's planted leak, say) do not change what is read.
_TENSOR_CODES = {
    "file-missing", "file-size", "tensor-unreadable", "tensor-layout", "dtype-mismatch",
    "shape-mismatch", "checksum-mismatch", "non-finite", "extreme-values", "meta-missing",
    "meta-mismatch",
}


def _require_ok(report: chk.CheckReport) -> None:
    # A benchmark of a failing read would measure the wrong thing; say so loudly.
    broken = [f.message for f in report.errors if f.code in _TENSOR_CODES]
    if broken:
        raise RuntimeError(f"benchmark cache has unreadable or corrupt tensors: {broken[:3]}")


# -- 2. index scaling ------------------------------------------------------------------


def synthetic_index(n: int, duplicates: int = 10, seed: int = 0) -> tuple[dict, dict, set]:
    """Index entries and identity fingerprints of ``n`` distinct subjects, with planted
    rescans under other ids (:func:`benchmarks.bench_identity.synthetic_descriptors`)."""
    from benchmarks.bench_identity import synthetic_descriptors

    prints, planted = synthetic_descriptors(n, seed, duplicates)
    index, fingerprints = {}, {}
    for i in range(n):
        key = hashlib.sha256(f"entry {i}".encode()).hexdigest()
        subject = f"sub-{i:05d}"
        index[key] = IndexEntry.from_json(key, {
            "subject_id": subject,
            "session_id": "",
            "split": SPLITS[i % len(SPLITS)],
            "pipeline_name": "bench",
            "pipeline_hash": PIPELINE,
            "inputs": {"image": {"sha256": hashlib.sha256(subject.encode()).hexdigest()}},
            "spacing": [1.0, 1.0, 1.0],
            "shape": [16, 16, 16],
            "files": {
                "image": {
                    "file": "image.npy",
                    "dtype": "float32",
                    "shape": [16, 16, 16],
                    "bytes": 16512,
                    "xxh3_128": hashlib.md5(key.encode()).hexdigest(),
                },
                "valid": {
                    "file": "valid.npy",
                    "dtype": "bool",
                    "shape": [16, 16, 16],
                    "bytes": 4224,
                    "xxh3_128": hashlib.md5(f"valid {key}".encode()).hexdigest(),
                },
            },
        })
        fingerprints[key] = prints[i].astype(np.float32)
    return index, fingerprints, planted


def measure_index_scaling(sizes=(1000, 3000, 10000, 30000),
                          methods=("exact", "lsh")) -> list[dict]:
    rows = []
    for n in sizes:
        index, fingerprints, planted = synthetic_index(n)
        subjects = {k: int(e.subject_id[4:]) for k, e in index.items()}
        for method in methods:
            info: dict = {}
            start = time.perf_counter()
            findings = check_index(
                index, fingerprints, near_duplicate_method=method, search_info=info
            )
            seconds = time.perf_counter() - start
            found = {
                tuple(sorted(subjects[k] for k in f.keys))
                for f in findings
                if f.code in ("near-duplicate", "identity-leak", "possible-identity-leak")
            }
            rows.append(
                {
                    "bench": "check-index",
                    "entries": n,
                    "method": method,
                    "seconds": round(seconds, 3),
                    "us_per_entry": round(seconds / n * 1e6, 1),
                    "lsh_candidates": info.get("lsh_candidates", "-"),
                    "pairs_compared": info.get("pairs_compared"),
                    "near_duplicate_seconds": info.get("seconds"),
                    "planted_found": f"{len(found & planted)}/{len(planted)}",
                    "false_reports": len(found - planted),
                }
            )
    return rows


def build_small_cache(root: Path, n: int, side: int = 16) -> Path:
    """A real cache of ``n`` small entries, written without fsync to build quickly.

    The entry folders, sidecars and index are the same as ``Cache.write_entry`` writes; only
    its per-file fsync and atomic rename are skipped (they cost ~20 ms an entry and are not
    what is measured).
    """
    from mriprep.inputs.templates import load_template

    cache = Cache(root, create=True)
    template = load_template("mni152")
    step = max(1, min(template.shape) // side)
    image = template.data[::step, ::step, ::step][:side, :side, :side]
    affine = template.affine.copy()
    affine[:3, :3] *= step
    rng = np.random.default_rng(1)
    label = (image > image.mean()).astype(np.int16)
    valid = np.ones(image.shape, dtype=bool)
    entries = []
    for i in range(n):
        subject = f"sub-{i:05d}"
        key = hashlib.sha256(subject.encode()).hexdigest()
        folder = cache.entry_dir(key)
        folder.mkdir()
        noisy = (image + 0.1 * rng.standard_normal(image.shape)).astype(np.float32)
        files = {}
        for name, array in (("image", noisy), ("valid", valid), ("label", label)):
            path = folder / f"{name}.npy"
            np.save(path, np.ascontiguousarray(array), allow_pickle=False)
            files[name] = file_record(path, array)
        meta = {
            **_meta(subject, affine, image.shape),
            "format_version": 1,
            "key": key,
            "files": files,
        }
        (folder / "meta.json").write_text(json.dumps(chk_jsonable(meta)))
        entry = IndexEntry.from_meta(key, chk_jsonable(meta))
        entries.append(entry.with_split(SPLITS[i % len(SPLITS)]))
    cache.update_index(entries)
    return root


def chk_jsonable(value):
    from mriprep.core.volume import jsonable

    return jsonable(value)


def measure_full_small(sizes=(1000, 3000)) -> list[dict]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="mriprep-bench-") as tmp:
            root = build_small_cache(Path(tmp) / "cache", n)
            chk.check_cache(root)  # warm
            start = time.perf_counter()
            report = chk.check_cache(root)
            seconds = time.perf_counter() - start
            _require_ok(report)
            rows.append(
                {
                    "bench": "check-small-cache",
                    "entries": n,
                    "seconds": round(seconds, 3),
                    "us_per_entry": round(seconds / n * 1e6, 1),
                    "near_duplicate_method": report.near_duplicate_search.get("method"),
                    "near_duplicate_seconds": report.near_duplicate_search.get("seconds"),
                }
            )
    return rows


# -- entry points ----------------------------------------------------------------------


def run(
    cache_dir: str | os.PathLike | None = None,
    entries: int = 8,
    sizes=(1000, 3000, 10000, 30000),
    full_sizes=(),
) -> list[dict]:
    """Run the measurements and return one dict per measured case.

    ``cache_dir`` is an existing sound cache to time (e.g. the demo cache); without it, a
    cache of ``entries`` template-sized subjects is built in a temporary folder.
    """
    rows = []
    if cache_dir is not None:
        rows += measure_throughput(Path(cache_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="mriprep-bench-") as tmp:
            rows += measure_throughput(build_template_cache(Path(tmp) / "cache", entries))
    rows += measure_index_scaling(sizes)
    if full_sizes:
        rows += measure_full_small(full_sizes)
    return rows


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="time this cache instead of building one")
    parser.add_argument("--entries", type=int, default=8, help="template-sized entries to build")
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=(1000, 3000, 10000, 30000),
        help="index sizes for the scaling measurement",
    )
    parser.add_argument(
        "--full-sizes",
        type=_sizes,
        default=(),
        help="also run check_cache on real caches of this many small entries",
    )
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines")
    args = parser.parse_args(argv)
    rows = run(args.cache, args.entries, args.sizes, args.full_sizes)
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
