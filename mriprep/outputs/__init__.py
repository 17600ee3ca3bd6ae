"""Leaving the cache: entries as images any tool opens, predictions back on native scans.

The cache is made for the loader (``.npy`` tensors on one grid); what a study reports
lies elsewhere: in a viewer, another tool, on the scan as acquired. One job per module:

* :mod:`~mriprep.outputs.select`: which entries (subjects, sessions, a split), refusing
  an id that is not there with the ids that are;
* :mod:`~mriprep.outputs.export`: entries as NIfTI or MGZ files on the cache grid, with
  their provenance (``mriprep export``);
* :mod:`~mriprep.outputs.native`: a prediction on the cache grid mapped onto the
  subject's native scan in one interpolation (``mriprep to-native``,
  :func:`to_native`, :func:`to_native_batch`);
* :mod:`~mriprep.outputs.predictions`: what a prediction may be, checked once;
* :mod:`~mriprep.outputs.sampling`: the one interpolation (nearest, linear, per-label);
* :mod:`~mriprep.outputs.images`: native geometry and atomic NIfTI/MGZ writing.

    >>> from mriprep.outputs import to_native  # doctest: +SKIP
    >>> to_native("cache/", "sub-01", prediction).to_filename("sub-01_seg.nii.gz")  # doctest: +SKIP
"""

from mriprep.outputs.export import EXPORT_MARKER, ExportResult, export_entries
from mriprep.outputs.images import save_image
from mriprep.outputs.native import CacheGrid, NativeGrid, native_grid, to_native, to_native_batch
from mriprep.outputs.select import entries_for, entry_for

__all__ = [
    "EXPORT_MARKER", "CacheGrid", "ExportResult", "NativeGrid", "entries_for", "entry_for",
    "export_entries", "native_grid", "save_image", "to_native", "to_native_batch",
]
