"""The cache folder a command was given: one message for a path that is not one.

Every command that reads a cache (check, report, export, to-native) refuses a path that
does not exist or is a file; a file is named for what it is (a manifest, an image, a file
inside a cache) with what to pass instead.
"""

from __future__ import annotations

from pathlib import Path

from mriprep.core.errors import CacheError


def require_cache_folder(path, command: str) -> Path:
    """``path`` as a Path when it is a folder; else a CacheError saying what it is."""
    path = Path(path)
    if path.is_file():
        raise CacheError(not_a_cache_folder(path, command))
    if not path.is_dir():
        raise CacheError(f"cache folder {path} does not exist; pass the folder given to "
                         "`mriprep run -o`")
    return path


def not_a_cache_folder(path: Path, command: str) -> str:
    """What the file given to ``mriprep COMMAND`` as the cache is, and what to pass
    instead."""
    cache = "the cache folder that `mriprep run ... -o CACHE` wrote"
    name = path.name.lower()
    if name.endswith((".csv", ".tsv")):
        try:
            with open(path, newline="", errors="replace") as fh:
                header = fh.readline().lower().replace("\t", ",").replace('"', "")
        except OSError as exc:
            return (f"{path} is a file ({type(exc).__name__} on reading it), not a cache "
                    f"folder: pass {cache}")
        columns = {c.strip() for c in header.split(",")}
        if {"subject_id", "image"} <= columns:
            return (f"{path} is a manifest (a table of subject_id and image), not a cache "
                    f"folder: pass {cache} from it"
                    + (f", and the manifest with --manifest to check that every row is "
                       f"cached: `mriprep check CACHE --manifest {path}`"
                       if command == "check" else ""))
        return (f"{path} is a {name[-3:].upper()} table without the subject_id and image "
                f"columns of a manifest, not a cache folder: pass {cache}")
    from mriprep.inputs.formats import image_suffix  # nibabel: only on this error

    suffix = image_suffix(path)
    if suffix:
        kind = "NIfTI" if suffix.startswith(".nii") else suffix.lstrip(".").upper()
        return (f"{path} is a {kind} image ({suffix}), not a cache folder: `mriprep "
                f"{command}` reads {cache}; list the scan in a manifest (subject_id,image) "
                f"and `mriprep run cohort.csv -o CACHE` first, then `mriprep {command} "
                "CACHE`")
    if (path.parent / "mriprep-cache.json").is_file():
        return (f"{path} is a file inside the cache {path.parent}: pass the folder, "
                f"`mriprep {command} {path.parent}`")
    return (f"{path} is a file ({path.stat().st_size} bytes), not a cache folder: pass "
            f"{cache}")
