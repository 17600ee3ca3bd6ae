"""Atomic file writes: a reader sees the old file or the complete new one, never a part.

Every file mriprep writes (cache entries and index, reports, manifests, images) goes
through :func:`atomic_path`: the content is written to a temporary name in the same
folder, fsynced, renamed over the target in one ``rename(2)``, and the folder is fsynced
so that the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` durably.

    ``suffix`` is appended to the temporary name for writers that choose a format by the
    file name (nibabel compresses ``*.nii.gz``). On an exception the temporary file is
    removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (new and renamed files) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep_stale(folder: str | os.PathLike, max_age_s: float = 24 * 3600) -> None:
    """Remove what crashed writers left in a temporary ``folder`` (older than a day: a
    live writer's folder is minutes old)."""
    now = time.time()
    for path in Path(folder).iterdir():
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > max_age_s:
                shutil.rmtree(path, ignore_errors=True)


def move_folder_into_place(tmp: Path, final: Path, trash_dir: Path, replace: bool) -> bool:
    """Rename the complete folder ``tmp`` to ``final`` in one step; return False when
    another writer's ``final`` was there first and is kept (``tmp`` is left to the
    caller to remove).

    With ``replace`` an existing ``final`` is first renamed into ``trash_dir`` (same file
    system) and deleted, so that a reader sees the old folder or the new one, and for a
    moment none. The parent folder is fsynced, so the rename survives a crash.
    """
    if replace and final.exists():
        trash = trash_dir / f"{final.name}.old.{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        return False
    fsync_dir(final.parent)
    return True
