"""Check phase: prove a cache (and its splits) sound before training (``mriprep check``).

One job per module; :func:`check_cache` runs them in order:

* :mod:`~mriprep.check.cache_check`: the orchestration, :func:`check_cache`, and its
  integrity part alone, :func:`verify_cache` (``mriprep cache verify``);
* :mod:`~mriprep.check.tensors`: one pass over one tensor file (``.npy`` or ``.b2nd``);
* :mod:`~mriprep.check.entries`: the tensor pass over every cache entry;
* :mod:`~mriprep.check.index`: pure checks of the index entries;
* :mod:`~mriprep.check.labels`: label values against the allowed set;
* :mod:`~mriprep.check.quality`: the QC report's outlier flags, as warnings;
* :mod:`~mriprep.check.headers`: inputs whose qform and sform disagree, as warnings;
* :mod:`~mriprep.check.resolution`: inputs written finer than acquired, as warnings;
* :mod:`~mriprep.check.manifest`: the cache against the manifest and the run report;
* :mod:`~mriprep.check.report`: the report model and how messages name entries;
* :mod:`~mriprep.check.render`: the report as a table for people;
* :mod:`~mriprep.check.codes`: the finding codes explained (``--explain CODE``) and as
  the table of docs/qc.md.
"""

from mriprep.check.cache_check import check_cache, verify_cache
from mriprep.check.report import CheckReport

__all__ = ["CheckReport", "check_cache", "verify_cache"]
