"""Synthetic people built once per test run, whatever the number of xdist workers.

A synthetic person (:func:`mriprep.demo.anatomy.synthetic_person`) takes seconds of one
core, more for a process's first (the template on its canvas and its distance map are
built once per process: docs/benchmarks.md, "Demo data"), and
:func:`mriprep.demo.calibration.person` keeps it for its own process only: with two
xdist workers, most of the people the suite uses were built twice.
:func:`share_people` makes the calibration module's builder go through
:func:`tests.built_once.built_once_in`: the first process that asks builds the person
and pickles it in the run's shared folder, the others read it back (a tenth of a
second). The key is everything the builder is given, the random generator's state
included, so a person read back is the one that would have been built.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.built_once import built_once_in

_shared_folder: list[Path] = []  # set once the session knows its temp folder


def share_people(base: Path) -> None:
    """Route the calibration module's person builder through ``base`` from now on."""
    from mriprep.demo import calibration

    _shared_folder[:] = [base]
    build = calibration.synthetic_person
    if getattr(build, "shared", False):
        return

    def synthetic_person(rng, *args, **kwargs):
        state = json.dumps([rng.bit_generator.state, args, kwargs], sort_keys=True,
                           default=repr)
        name = f"person-{hashlib.sha256(state.encode()).hexdigest()[:16]}"
        return built_once_in(_shared_folder[0], name,
                             lambda folder: build(rng, *args, **kwargs))

    synthetic_person.shared = True
    calibration.synthetic_person = synthetic_person
