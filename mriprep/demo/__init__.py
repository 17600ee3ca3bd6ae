"""Demo and calibration data: anatomy that is not the template, scanned with known truth.

The modules follow the flow of the data:

* :mod:`~mriprep.demo.anatomy`: people (synthetic, from MNI152 warped, recontrasted,
  with scalp and neck) and real single-subject scans, each with its rigid truth;
* :mod:`~mriprep.demo.scanner`: a scanner that takes an anatomy in a known pose on a
  slice grid, with bias, noise and a field of view;
* :mod:`~mriprep.demo.real_scans`: where the real scans of Debian's mricron-data are;
* :mod:`~mriprep.demo.calibration`: the calibration set every limit is measured on;
* :mod:`~mriprep.demo.cohort`: the demo cohort ``make demo`` preprocesses;
* :mod:`~mriprep.demo.verify`: the referee that scores a demo run against its truth.
"""

from mriprep.demo.cohort import DEFAULT_SUBJECTS, DemoCohort, build_demo_cohort, load_demo_cohort

__all__ = ["DEFAULT_SUBJECTS", "DemoCohort", "build_demo_cohort", "load_demo_cohort"]
