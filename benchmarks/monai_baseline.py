"""The MONAI side of the conform comparison: the equivalent chain, timed per subject.

Two ways to run it, both reported by ``bench_runner``:

* **as shipped** (:class:`MonaiProcess`): in a separate Python process with the
  allocator and NumPy defaults a MONAI user has. The bench process is set up as an
  mriprep worker (:func:`mriprep.run.worker_setup.configure_worker`: freed memory kept for
  reuse, no huge-page requests), and those settings would otherwise speed MONAI up too:
  they are mriprep's, not MONAI's.
* **with mriprep's worker settings** (:func:`monai_seconds` in the bench process): what
  MONAI would take if its users tuned their processes the same way.

Both use one thread (``torch.set_num_threads(1)`` and the single-thread variables the
bench process passes on), as the mriprep side does.

The chain does the pipeline's work the fastest way MONAI documents, and writes what it
writes:

* **one resampling**: ``Compose(..., lazy=True)`` (MONAI's "Lazy Resampling" guide,
  ``docs/source/lazy_resampling.rst``), so that Orientationd, Spacingd and
  ResizeWithPadOrCropd become one resampling, computed in float32 as mriprep's is: the
  pending resampling takes its dtype from ``Compose``'s ``overrides``, not from
  ``Spacingd(dtype=...)`` (which alone left it in float64);
* **the pipeline's output type**: for a uint8 pipeline (conform) the intensities are
  scaled to 0-255 over the 0-99.9th percentiles, clipped and cast to uint8
  (``ScaleIntensityRangePercentilesd``, ``CastToTyped``), as conform's robust scaling
  does; otherwise z-scored (``NormalizeIntensityd``) and cast to the pipeline's float type;
* **the same disk accounting**: the PersistentDataset's cache file is fsynced inside the
  timed span, as mriprep's entry is.

Run ``python -m benchmarks.monai_baseline --serve`` to start the as-shipped server by
hand: it reads one JSON request per line on stdin and answers one JSON line per request.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mriprep.run.worker_setup import MALLOC_ENV, NUMPY_HUGEPAGE_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
# mriprep's worker settings for a process's start; a MONAI user's process has none of them.
_MRIPREP_WORKER_ONLY = tuple(MALLOC_ENV) + tuple(NUMPY_HUGEPAGE_ENV)


def monai_transform(with_label: bool, orientation: str = "RAS",
                    shape: tuple[int, int, int] | None = None, output_dtype: str = "uint8"):
    """The MONAI chain equivalent to the pipeline's geometry and intensity: the same
    orientation, 1 mm spacing and, when ``shape`` is given, the same grid, one lazy
    resampling in float32, and the pipeline's output type (module notes)."""
    import numpy as np
    import torch
    from monai.transforms import (
        CastToTyped,
        Compose,
        EnsureChannelFirstd,
        LoadImaged,
        NormalizeIntensityd,
        Orientationd,
        ResizeWithPadOrCropd,
        ScaleIntensityRangePercentilesd,
        Spacingd,
    )

    keys = ["image", "label"] if with_label else ["image"]
    modes = ("bilinear", "nearest") if with_label else ("bilinear",)
    steps = [
        LoadImaged(keys=keys, image_only=True),
        EnsureChannelFirstd(keys=keys),
        Orientationd(keys=keys, axcodes=orientation),
        Spacingd(keys=keys, pixdim=(1.0, 1.0, 1.0), mode=modes, dtype=np.float32),
    ]
    if shape is not None:
        steps.append(ResizeWithPadOrCropd(keys=keys, spatial_size=tuple(shape)))
    if output_dtype == "uint8":
        steps += [ScaleIntensityRangePercentilesd(keys="image", lower=0, upper=99.9,
                                                  b_min=0, b_max=255, clip=True),
                  CastToTyped(keys="image", dtype=np.uint8)]
    else:
        steps += [NormalizeIntensityd(keys="image", nonzero=True),
                  CastToTyped(keys="image", dtype=np.dtype(output_dtype))]
    return Compose(steps, lazy=True, overrides={"dtype": torch.float32})


def monai_seconds(image: str, label: str | None, cache_dir: Path, orientation: str = "RAS",
                  shape: tuple[int, int, int] | None = None,
                  output_dtype: str = "uint8") -> float:
    """One subject through MONAI's PersistentDataset: transform, write its cache and
    fsync it (as mriprep fsyncs its entry)."""
    from monai.data import PersistentDataset

    item = {"image": image} | ({"label": label} if label else {})
    transform = monai_transform(bool(label), orientation, shape, output_dtype)
    dataset = PersistentDataset([item], transform=transform, cache_dir=cache_dir)
    start = time.perf_counter()
    dataset[0]
    _fsync_folder(cache_dir)
    return time.perf_counter() - start


def _fsync_folder(folder: Path) -> None:
    """fsync every file in ``folder`` and the folder itself (PersistentDataset renames
    its cache file into place)."""
    for path in Path(folder).iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class MonaiProcess:
    """A separate Python process that times subjects through MONAI as shipped.

    Use as a context manager; :meth:`seconds` sends one subject and waits for its time.
    A subject MONAI cannot read comes back as ``"failed: <exception type>"``.
    """

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k not in _MRIPREP_WORKER_ONLY}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.monai_baseline", "--serve"],
            cwd=REPO_ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    def seconds(self, image: str, label: str | None, cache_dir: Path, orientation: str,
                shape: tuple[int, int, int] | None, output_dtype: str) -> float | str:
        request = {"image": image, "label": label, "cache_dir": str(cache_dir),
                   "orientation": orientation, "shape": list(shape) if shape else None,
                   "output_dtype": output_dtype}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the MONAI baseline process exited; run "
                               "`python -m benchmarks.monai_baseline --serve` to see why")
        answer = json.loads(line)
        return answer["seconds"] if "seconds" in answer else f"failed: {answer['error']}"

    def __enter__(self) -> "MonaiProcess":
        return self

    def __exit__(self, *exc) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


def serve() -> int:
    """Answer timing requests from stdin, one JSON line each, until stdin closes."""
    import torch

    torch.set_num_threads(1)
    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        shape = tuple(request["shape"]) if request["shape"] else None
        try:
            seconds = monai_seconds(request["image"], request["label"],
                                    Path(request["cache_dir"]), request["orientation"], shape,
                                    request["output_dtype"])
            answer: dict[str, Any] = {"seconds": seconds}
        except Exception as exc:  # noqa: BLE001 - MONAI's own error for a broken scan
            answer = {"error": type(exc).__name__}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true",
                        help="time the subjects requested on stdin (one JSON line each)")
    if parser.parse_args().serve:
        sys.exit(serve())
    parser.print_help()
