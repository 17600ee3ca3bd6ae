"""The ANTs backend: ``antsRegistration`` through ANTsPy (``--float 1``), on the finest
prepared level, shrinking inside ANTs for the coarser ones. The same two parts as the
SimpleITK backend: a Rigid stage over every level (Mattes MI), then an Affine stage over
every level (global correlation, ANTs' ``GC``) for the head's size and shape.

ANTs writes its transform to a file and its iteration log to stdout: a private
temporary folder, removed on return, receives both (the log is parsed for iteration
counts and the final metric). While it runs, the process's stdout goes to that log.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mriprep.stages.registration.backend import BackendResult
from mriprep.stages.registration.geometry import ants_image, matrix_from_ants, ras_to_lps
from mriprep.stages.registration.pyramid import Level

if TYPE_CHECKING:
    from mriprep.stages.registration.params import RegisterParams

ITK_THREADS_VARIABLE = "ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS"
# The ITK thread count ANTsPy was loaded with, once known (None: ITK's default, all cores).
_ants_threads: list[int | None] = []
# One ANTs registration at a time per process: each redirects the process's stdout, and
# two overlapping redirections would restore it to the wrong file.
_ANTS_LOCK = threading.Lock()
_ANTS_ROW = re.compile(r"^\s*\d*DIAGNOSTIC,\s*(\d+),\s*([-+0-9.eE]+)")


def register_ants(
    fixed: tuple[Level, ...], moving: list[Level], shape_fixed: tuple[Level, ...],
    initial_lps: np.ndarray, centre_lps: np.ndarray, params: RegisterParams,
    finest_moving=None,
) -> BackendResult:
    """One antsRegistration call: the Rigid stage over every level (shrink factors and
    smoothing), then the Affine stage over every level.

    ANTs runs every level in one call, so no level can be replaced between them:
    ``finest_moving`` (see :func:`~mriprep.stages.registration.sitk_backend.register_sitk`)
    is not used, and the finest level keeps the bias field estimated over the whole head.

    The result's metric value is the Affine stage's final correlation. Details:
    ``stop_conditions`` (one per level of each stage) and ``ants_threads``, the ITK
    thread count ANTs runs with.
    """
    ants, threads = import_ants(params.threads)
    from ants.internal import get_pointer_string

    del finest_moving  # not used: see the docstring
    finest_fixed, finest_subject = fixed[-1], moving[-1]
    shrink = [int(round(level.spacing_mm / finest_fixed.spacing_mm)) for level in fixed]
    # Smoothing (mm) that takes the finest level's resolution to each coarser one.
    sigmas = [
        0.5 * float(np.sqrt(max(level.spacing_mm**2 - finest_fixed.spacing_mm**2, 0.0)))
        for level in fixed
    ]
    # Both stages run over every level: the same schedule.
    schedule = [
        "--convergence", "[" + "x".join([str(params.max_iterations)] * len(fixed))
                         + ",1e-6,10]",
        "--shrink-factors", "x".join(str(s) for s in shrink),
        "--smoothing-sigmas", "x".join(f"{s:.4g}" for s in sigmas) + "mm",
    ]
    fixed_image = ants_image(finest_fixed.data, finest_fixed.affine)
    moving_image = ants_image(finest_subject.data, finest_subject.affine)
    # antsRegistration receives images as raw pointers: every image must stay referenced
    # here until it returns.
    fixed_mask = ants_image(finest_fixed.mask.astype(np.float32), finest_fixed.affine) != 0
    moving_mask = None
    if not finest_subject.mask.all():
        moving_mask = ants_image(
            finest_subject.mask.astype(np.float32), finest_subject.affine
        ) != 0
    finest_shape = shape_fixed[-1]
    shape_mask = ants_image(finest_shape.mask.astype(np.float32), finest_shape.affine) != 0
    moving_pointer = "NA" if moving_mask is None else get_pointer_string(moving_mask)
    masks = f"[{get_pointer_string(fixed_mask)},{moving_pointer}]"
    shape_masks = f"[{get_pointer_string(shape_mask)},{moving_pointer}]"
    f, m = get_pointer_string(fixed_image), get_pointer_string(moving_image)
    with tempfile.TemporaryDirectory(prefix="mriprep-ants-") as folder:
        initial_path = os.path.join(folder, "initial.mat")
        initial = ants.create_ants_transform(
            transform_type="AffineTransform", precision="double", dimension=3,
            matrix=initial_lps[:3, :3], center=centre_lps,
            translation=initial_lps[:3, 3] - centre_lps + initial_lps[:3, :3] @ centre_lps,
        )
        ants.write_transform(initial, initial_path)
        prefix = os.path.join(folder, "reg_")
        args = [
            "--dimensionality", "3", "--float", "1", "--collapse-output-transforms", "1",
            "--output", prefix, "--interpolation", "Linear",
            "--use-histogram-matching", "0", "--winsorize-image-intensities", "[0,1]",
            "--initial-moving-transform", initial_path,
            "--transform", "Rigid[0.25]",
            "--metric", f"MI[{f},{m},1,{params.histogram_bins},Random,"
                        f"{params.sampling_fraction}]",
            *schedule,
            "--masks", masks,
            "--transform", "Affine[0.1]",
            "--metric", f"GC[{f},{m},1,1,Random,{params.fine_sampling_fraction}]",
            *schedule,
            "--masks", shape_masks,
            "--random-seed", str(params.seed), "--verbose", "1",
        ]
        with _ANTS_LOCK, captured_stdout(folder) as log:
            ants.registration(args, None)
        diagnostics = parse_ants_log(log.read_text(errors="replace"))
        lps = ras_to_lps(matrix_from_ants(ants.read_transform(prefix + "0GenericAffine.mat")))
    iterations = [len(level) for level in diagnostics]
    stops = [
        "maximum number of iterations reached" if n >= params.max_iterations
        else "convergence window slope below 1e-6" for n in iterations
    ]
    # The fit's correlation on its last level, as the sitk backend reports it.
    shape = diagnostics[-1] if len(diagnostics) > len(fixed) else []
    return BackendResult(lps, float(shape[-1]) if shape else float("nan"),
                         stops[-1] if stops else "unknown", iterations,
                         {"stop_conditions": stops, "ants_threads": threads})


def import_ants(threads: int):
    """Import ANTsPy, with ``threads`` ITK threads if this is the first import.

    ANTsPy's ITK reads ``ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS`` once, when the library is
    loaded, and ignores later changes (measured: runs asking for 1 and 2 threads in one
    process are identical). Returns the module and the count in effect, so that the stage
    can record it and warn when it is not the one asked for.
    """
    if not _ants_threads:
        if "ants" not in sys.modules:
            os.environ.setdefault(ITK_THREADS_VARIABLE, str(threads))
        value = os.environ.get(ITK_THREADS_VARIABLE, "")
        _ants_threads.append(int(value) if value.isdigit() else None)
    import ants

    return ants, _ants_threads[0]


@contextlib.contextmanager
def captured_stdout(folder: str):
    """Send the process's stdout (file descriptor 1, where ANTs' and other C++ code
    print their logs) to a file in ``folder`` for the duration, and yield its path."""
    path = Path(folder) / "ants.log"
    sys.stdout.flush()
    saved = os.dup(1)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield path
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def parse_ants_log(text: str) -> list[list[float]]:
    """Metric values per iteration, one list per level, from antsRegistration's log."""
    levels: list[list[float]] = []
    for line in text.splitlines():
        if line.startswith("DIAGNOSTIC,Iteration"):
            levels.append([])
            continue
        match = _ANTS_ROW.match(line)
        if match and levels:
            levels[-1].append(float(match.group(2)))
    return levels
