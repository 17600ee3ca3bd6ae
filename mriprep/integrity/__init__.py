"""The parts of ``mriprep check``, one job per module (orchestrated by :mod:`mriprep.check`).

* :mod:`~mriprep.integrity.report`: the report model and how messages name entries;
* :mod:`~mriprep.integrity.tensors`: one pass over one ``.npy`` file;
* :mod:`~mriprep.integrity.entries`: the tensor pass over every cache entry;
* :mod:`~mriprep.integrity.index`: pure checks of the index summaries;
* :mod:`~mriprep.integrity.labels`: label values against the allowed set;
* :mod:`~mriprep.integrity.manifest`: the cache against the manifest and the run report.
"""
