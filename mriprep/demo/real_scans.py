"""Real scans that nobody in this project made: Colin27 and a macaque, from Debian.

Debian's ``mricron-data`` package ships, under ``/usr/share/mricron/templates``:

* ``ch2.nii.gz``: Colin27, one man scanned 27 times and averaged (1 mm, whole head with
  the top of the neck; Holmes et al. 1998). A real single-subject T1, not an average of
  a population: its folds, head size and contrast are its own.
* ``ch2bet.nii.gz``: the same, brain-extracted (FSL BET).
* ``ch2better.nii.gz``: the same brain at 0.5 mm, grey and white matter only.
* ``inia19-t1-brain.nii.gz``: the INIA19 rhesus macaque brain template (0.5 mm), a brain
  far from human size.

The package's copyright file licenses its files under BSD-3-Clause; the images are not
committed here, only read where they are installed. ``.ci/run`` installs the package;
elsewhere ``apt-get download mricron-data && dpkg-deb -x mricron-data_*.deb DIR``
unpacks it without root, and ``MRIPREP_REAL_SCANS=DIR/usr/share/mricron/templates``
points mriprep at it. Tests and benchmarks that need these scans skip with that hint
when they are missing.
"""

from __future__ import annotations

import os
from pathlib import Path

# Name -> file of the mricron-data package.
REAL_SCANS = {
    "colin27": "ch2.nii.gz",
    "colin27_brain": "ch2bet.nii.gz",
    "colin27_05mm": "ch2better.nii.gz",
    "macaque": "inia19-t1-brain.nii.gz",
}
ENV_VARIABLE = "MRIPREP_REAL_SCANS"
DEBIAN_FOLDER = Path("/usr/share/mricron/templates")
HOW_TO_GET = (
    "install Debian's mricron-data (apt-get install mricron-data), or unpack it without "
    "root (apt-get download mricron-data && dpkg-deb -x mricron-data_*.deb DIR) and set "
    f"{ENV_VARIABLE}=DIR/usr/share/mricron/templates"
)


def real_scans_folder() -> Path | None:
    """The folder holding the mricron-data scans, or None when they are not here.

    ``$MRIPREP_REAL_SCANS`` first, then Debian's install location.
    """
    for folder in (os.environ.get(ENV_VARIABLE), DEBIAN_FOLDER):
        if folder and all((Path(folder) / f).is_file() for f in REAL_SCANS.values()):
            return Path(folder)
    return None


def real_scan(name: str) -> Path | None:
    """The path of one of :data:`REAL_SCANS`, or None when the package is not here."""
    if name not in REAL_SCANS:
        raise KeyError(f"unknown real scan {name!r}; known: {', '.join(REAL_SCANS)}")
    folder = real_scans_folder()
    return None if folder is None else folder / REAL_SCANS[name]
