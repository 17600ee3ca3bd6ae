"""What makes a subject or session id safe: the manifest's rule, also applied to every
index entry a cache reads (an index may be shared and written by anyone, so an id read
back from it is no more trusted than one read from a manifest).

mriprep never puts an id in an output path (cache entries are named by content hash), but
an id with a path separator, ``..``, a control character or a leading dot is almost always
a broken export, and ids often end up in file names downstream.
"""

from __future__ import annotations

import unicodedata

# Bytes, not characters: file systems limit names to 255 bytes, and an id may end up
# inside a longer file name.
MAX_ID_BYTES = 128
_ID_FIX = "use letters, digits, '-', '_' and single inner dots, as in 'sub-01'"


def id_problems(value: str, what: str = "subject_id") -> list[str]:
    """Why ``value`` is not a safe id (an empty list when it is).

    Parameters
    ----------
    value : str
        The id as written in the manifest.
    what : str
        Its column name, used in the messages.

    Examples
    --------
    >>> id_problems("sub-01")
    []
    >>> for problem in id_problems("a/../b"):
    ...     print(problem.split(";")[0])
    subject_id 'a/../b' contains a path separator (/ or \\)
    subject_id 'a/../b' contains '..'
    """
    problems = []
    if not value:
        return [f"{what} is empty; every row needs one"]
    if "/" in value or "\\" in value:
        problems.append(f"{what} {value!r} contains a path separator (/ or \\)")
    if ".." in value:
        problems.append(f"{what} {value!r} contains '..'")
    if value.startswith("."):
        problems.append(f"{what} {value!r} starts with a dot (a hidden file name)")
    controls = sorted({ch for ch in value if unicodedata.category(ch).startswith("C")})
    if controls:
        codes = ", ".join(f"U+{ord(ch):04X}" for ch in controls)
        problems.append(f"{what} {value!r} contains control or invisible characters ({codes})")
    size = len(value.encode("utf-8"))
    if size > MAX_ID_BYTES:
        problems.append(f"{what} {value[:20]!r}... is {size} bytes long (limit {MAX_ID_BYTES})")
    return [f"{p}; {_ID_FIX}" for p in problems]
