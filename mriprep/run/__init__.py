"""Run phase: a pipeline over a cohort on dask, one task per subject, into the cache.

Per-subject work, the cohort driver, scheduling of the dask workers, the run reports and
the progress display.
"""
