"""Rigid registration to a template: the library code behind the register stage.

The stage (:mod:`mriprep.stages.register`) holds the order of the steps; the work is
done here, one topic per module:

* :mod:`~mriprep.stages.registration.params`: the stage's parameters and its result record
  (here rather than in the stage, so that the backends that read them import no stage);

* :mod:`~mriprep.stages.registration.geometry`: RAS+ (nibabel) <-> LPS (ITK, ANTs) matrices,
  transforms and images, and the target registration error;
* :mod:`~mriprep.stages.registration.pyramid`: isotropic resolution levels built by normalised
  convolution, bias-field flattening, centres of mass;
* :mod:`~mriprep.stages.registration.template`: the template's brain mask, brain points,
  pyramid and search windows, built once per process;
* :mod:`~mriprep.stages.registration.search`: the global search over the 24 axis orientations
  and all positions (masked normalised cross-correlation by FFT) that starts the
  optimiser;
* :mod:`~mriprep.stages.registration.backend`: what every backend receives and returns;
* :mod:`~mriprep.stages.registration.sitk_backend`, :mod:`~mriprep.stages.registration.ants_backend`:
  the two optimisers;
* :mod:`~mriprep.stages.registration.checks`: head size, similarity, overlap and the
  diagnosis of a failed registration with its likely cause.
"""
