"""QC phase: see every subject, and measure its quality (``mriprep report``).

One job per module, in the order the data flow:

* :mod:`~mriprep.qc.capture`: what each stage invalidated, seen while the worker holds
  the data (the cache keeps only the merged ``valid`` mask), by the causes the stages
  declare (:mod:`~mriprep.qc.causes`);
* :mod:`~mriprep.qc.metrics`: image-quality metrics after MRIQC (SNR, CNR, CJV, EFC,
  FBER, WM2MAX) on a simple tissue model;
* :mod:`~mriprep.qc.views` and :mod:`~mriprep.qc.mosaic`: three-plane mosaics on a
  world-aligned display grid, with coloured overlays, as JPEG;
* :mod:`~mriprep.qc.subject`: one subject's pictures and metrics, from the worker's data
  or from the cache; :mod:`~mriprep.qc.measures`: the QC's own measures beside those
  the stages declare (the QC names no stage: it reads their declarations, and imports
  nothing of ``mriprep.run``, which calls it);
* :mod:`~mriprep.qc.store`: ``CACHE/qc/<key>/``, written whole;
* :mod:`~mriprep.qc.outliers`: robust-z flags over the cohort (also in ``mriprep check``);
* :mod:`~mriprep.qc.gather`, :mod:`~mriprep.qc.plots` and :mod:`~mriprep.qc.report`: the
  HTML report of a cache.
"""
