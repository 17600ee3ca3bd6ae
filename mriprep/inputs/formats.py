"""Open an image file per format: its checked header now, its voxels on demand.

:func:`open_checked` takes a path and a voxel limit and returns an :class:`OpenedImage`:
the :class:`~mriprep.inputs.headers.ImageHeader` that passed every check of
:mod:`mriprep.inputs.headers`, and a reader of the voxels that :func:`read_voxels` calls,
giving them in the file's own dtype, squeezed to 3D and unscaled. No voxel is read until
the header has passed.

Formats: NIfTI-1/2 (``.nii``, ``.nii.gz``) and FreeSurfer MGH (``.mgz``, ``.mgh``) through
nibabel, which keeps NaN visible; NRRD and MetaImage (``.nrrd``, ``.nhdr``, ``.mha``,
``.mhd``) through SimpleITK, whose LPS world coordinates are converted to RAS+. Gzipped
files are inflated by ISA-L (``isal``), twice as fast as zlib.

Refused with :class:`~mriprep.core.errors.ImageReadError`: a file that is missing, empty,
not a regular file, of an unsupported extension, not an image of its format, an
uncompressed NIfTI shorter than its header promises, or voxels that cannot be read.
Refused with :class:`~mriprep.core.errors.HeaderError`: a vector image, and every header
the checks of :mod:`mriprep.inputs.headers` refuse.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nibabel as nib
import numpy as np
from isal import igzip, isal_zlib
from nibabel.arrayproxy import ArrayProxy
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from mriprep.core.errors import HeaderError, ImageReadError
from mriprep.inputs.headers import (
    ImageHeader,
    check_affine,
    check_dtype,
    check_shape,
    choose_nifti_affine,
    compare_zooms,
    nifti_scaling,
)

NIBABEL_SUFFIXES = (".nii", ".nii.gz", ".mgz", ".mgh")
ITK_SUFFIXES = (".nrrd", ".nhdr", ".mha", ".mhd")
SUPPORTED_SUFFIXES = NIBABEL_SUFFIXES + ITK_SUFFIXES

_READ_ERRORS = (
    OSError, EOFError, zlib.error, isal_zlib.error, ValueError, ImageFileError,
    HeaderDataError,
)
_LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


@dataclass(frozen=True)
class OpenedImage:
    """A checked header, and the way to read the voxels it describes."""

    header: ImageHeader
    # Reads the voxels in the file's dtype, already squeezed to 3D, unscaled.
    read_raw: Callable[[], np.ndarray]
    # Where the voxels start in an uncompressed NIfTI (to detect truncation up front).
    data_offset: int | None = None


def image_suffix(path: str | os.PathLike) -> str:
    """The format suffix of ``path`` (lower case, ``.nii.gz`` counted as one), or ``""``."""
    name = Path(path).name.lower()
    for suffix in sorted(SUPPORTED_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return ""


# --------------------------------------------------------------------------- opening


def open_checked(path: Path, max_voxels: int, header: str = "auto",
                 header_fallback: bool = False) -> OpenedImage:
    """Open ``path`` by its suffix and run every header check; no voxel is read.

    ``header`` (``auto``, ``qform``, ``sform``) chooses a NIfTI's form (see
    :func:`~mriprep.inputs.headers.choose_nifti_affine`, which ``header_fallback`` is
    passed to); the other formats hold one affine and ignore it.
    """
    _check_file(path)
    suffix = image_suffix(path)
    if suffix in NIBABEL_SUFFIXES:
        opened = _open_nibabel(path, header, header_fallback)
    else:
        opened = _open_itk(path)
    check_shape(opened.header, max_voxels)
    check_affine(opened.header.path, opened.header.affine, opened.header.affine_source)
    _check_uncompressed_size(opened)
    return opened


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ImageReadError(
            f"image file {path} does not exist; check the path (relative paths in a "
            "manifest are relative to the manifest's folder)"
        )
    if not path.is_file():
        raise ImageReadError(f"image path {path} is not a file (it is a folder or device)")
    if path.stat().st_size == 0:
        raise ImageReadError(
            f"image file {path} is empty (0 bytes); re-export or re-copy the scan"
        )
    if not image_suffix(path):
        raise ImageReadError(
            f"image file {path} has an unsupported extension; mriprep reads "
            f"{', '.join(SUPPORTED_SUFFIXES)} (convert other formats, e.g. DICOM with "
            "dcm2niix)"
        )


def _not_an_image(path: Path, exc: BaseException) -> ImageReadError:
    return ImageReadError(
        f"cannot read {path} as a {image_suffix(path)} image ({type(exc).__name__}: {exc}); "
        "the file is damaged or not an image of that format: re-export or re-copy it"
    )


def _open_nibabel(path: Path, header_choice: str = "auto",
                  header_fallback: bool = False) -> OpenedImage:
    with _nibabel_messages() as messages:
        try:
            # mmap=False: the voxels become float32 anyway, and a mapping would keep the
            # file open (and visible to later changes of the file) for the Volume's life.
            img = nib.load(str(path), mmap=False)
        except _READ_ERRORS as exc:
            raise _not_an_image(path, exc) from exc
        if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image, nib.MGHImage)):
            raise ImageReadError(
                f"{path} was read as {type(img).__name__}, not NIfTI or MGH; rename it with "
                "the extension of its real format or convert it to NIfTI"
            )
        hdr = img.header
        if not isinstance(img, nib.MGHImage):
            # nibabel moves scl_slope/scl_inter out of img.header on load (they live on the
            # data proxy, NaN and 0 folded into "no scaling"); the raw header keeps them.
            hdr = _raw_nifti_header(path, type(hdr))
        try:
            disk_shape = tuple(int(s) for s in hdr.get_data_shape())
            dtype = np.dtype(img.get_data_dtype())
            zooms = tuple(float(z) for z in hdr.get_zooms()[:3])
        except (HeaderDataError, ValueError) as exc:
            raise HeaderError(
                f"{path}: the header's dimensions or data type are invalid ({exc}); the "
                "file is corrupt: re-export it"
            ) from exc
    warnings = [f"{path}: nibabel fixed the header: {m}" for m in dict.fromkeys(messages)]
    conflict = None
    if isinstance(img, nib.MGHImage):
        fmt, affine, source = "mgh", np.asarray(img.affine, dtype=np.float64), "mgh"
        slope = inter = stored = None
        header_choice = "auto"  # one affine: nothing to choose
    else:
        fmt = "nifti2" if isinstance(img, nib.Nifti2Image) else "nifti1"
        affine, source, conflict = choose_nifti_affine(path, hdr, warnings, header_choice,
                                                       header_fallback)
        slope, inter = nifti_scaling(path, hdr, warnings)
        stored = (float(hdr["scl_slope"]), float(hdr["scl_inter"]))
    check_dtype(path, dtype)
    if len(zooms) == 3 and np.all(np.isfinite(affine)):
        compare_zooms(path, zooms, affine, source, warnings)

    def read_raw() -> np.ndarray:
        if path.name.lower().endswith((".gz", ".mgz")):
            raw = _read_gzipped(img.dataobj, path)
        else:
            raw = np.asarray(img.dataobj.get_unscaled())
        return raw.reshape(disk_shape[:3])

    header = ImageHeader(
        path=path,
        format=fmt,
        disk_shape=disk_shape,
        disk_dtype=str(dtype),
        affine=affine,
        affine_source=source,
        header_zooms=zooms if len(zooms) == 3 else (float("nan"),) * 3,
        scl_slope=slope,
        scl_inter=inter,
        stored_scaling=stored,
        warnings=tuple(warnings),
        form_conflict_mm=conflict,
        header_choice=header_choice,
    )
    offset = None
    if fmt.startswith("nifti") and not path.name.lower().endswith(".gz"):
        offset = int(hdr.get_data_offset())
    return OpenedImage(header, read_raw, offset)


def _read_gzipped(proxy: ArrayProxy, path: Path) -> np.ndarray:
    """``proxy.get_unscaled()`` with the file decompressed by ISA-L instead of zlib.

    Decompression is most of the time it takes to load a ``.nii.gz``; ISA-L's inflate
    gives the same bytes in about half the time (docs/benchmarks.md, "Stage timings").
    nibabel still decides where the voxels start and how they are laid out.
    """
    with igzip.open(path, "rb") as stream:
        fast = ArrayProxy(stream, (proxy.shape, proxy.dtype, proxy.offset),
                          order=proxy.order, mmap=False)
        return np.asarray(fast.get_unscaled())


@contextlib.contextmanager
def _nibabel_messages():
    """Collect what nibabel logs about a header (e.g. zero pixdim it replaces by 1).

    nibabel reports header fixes through the ``nibabel.global`` logger, whose own handler
    prints them to stderr; here they become warnings of the load record instead, so they
    reach the subject's report rather than scrolling past a progress bar. Only this
    thread's records are taken: another thread loading at the same time keeps its own.
    """
    messages: list[str] = []
    thread = threading.get_ident()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == thread:
                messages.append(record.getMessage())

    def not_this_thread(record: logging.LogRecord) -> bool:
        return record.thread != thread

    logger = logging.getLogger("nibabel.global")
    printers = list(logger.handlers)
    collect = Collect(level=logging.WARNING)
    for handler in printers:
        handler.addFilter(not_this_thread)
    logger.addHandler(collect)
    try:
        yield messages
    finally:
        logger.removeHandler(collect)
        for handler in printers:
            handler.removeFilter(not_this_thread)


def _raw_nifti_header(path: Path, header_class):
    try:
        with nib.openers.ImageOpener(str(path)) as fh:
            return header_class.from_fileobj(fh)
    except _READ_ERRORS as exc:
        raise _not_an_image(path, exc) from exc


def _open_itk(path: Path) -> OpenedImage:
    import SimpleITK as sitk  # only for NRRD/MetaImage: keep it off the NIfTI path

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError as exc:
        raise _not_an_image(path, _short_itk_error(exc)) from exc
    if reader.GetNumberOfComponents() != 1:
        raise HeaderError(
            f"{path} has {reader.GetNumberOfComponents()} components per voxel (a vector "
            "or RGB image); mriprep needs one scalar intensity per voxel: extract one "
            "channel first"
        )
    ndim = reader.GetDimension()
    disk_shape = tuple(int(s) for s in reader.GetSize())
    spacing = np.asarray(reader.GetSpacing()[:3], dtype=np.float64)
    origin = np.asarray(reader.GetOrigin()[:3], dtype=np.float64)
    direction = np.asarray(reader.GetDirection(), dtype=np.float64).reshape(ndim, ndim)
    affine = np.eye(4)
    if ndim >= 3:
        affine[:3, :3] = direction[:3, :3] * spacing
        affine[:3, 3] = origin
        affine = _LPS_TO_RAS @ affine
    # SimpleITK's own pixel-type-to-numpy mapping, read off a one-voxel image.
    dtype = np.dtype(sitk.GetArrayViewFromImage(sitk.Image([1, 1, 1], reader.GetPixelID())).dtype)
    check_dtype(path, dtype)

    def read_raw() -> np.ndarray:
        image = reader.Execute()
        # ITK arrays are indexed [t, z, y, x]: reverse to nibabel's [i, j, k].
        array = sitk.GetArrayFromImage(image)
        return np.ascontiguousarray(array.reshape(array.shape[-3:]).transpose(2, 1, 0))

    header = ImageHeader(
        path=path,
        format=image_suffix(path).lstrip("."),
        disk_shape=disk_shape,
        disk_dtype=str(dtype),
        affine=affine,
        affine_source="itk",
        header_zooms=tuple(float(s) for s in spacing) if ndim >= 3 else (float("nan"),) * 3,
    )
    return OpenedImage(header, read_raw)


def _short_itk_error(exc: RuntimeError) -> RuntimeError:
    # SimpleITK messages start with the C++ source location; the useful part is last.
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return RuntimeError(lines[-1].strip() if lines else str(exc))


def _check_uncompressed_size(opened: OpenedImage) -> None:
    """An uncompressed NIfTI shorter than its header promises is truncated: say so now."""
    if opened.data_offset is None:
        return
    header = opened.header
    needed = opened.data_offset + header.n_voxels * np.dtype(header.disk_dtype).itemsize
    size = header.path.stat().st_size
    if size < needed:
        raise ImageReadError(
            f"{header.path} is truncated: its header needs {needed:,} bytes but the file has "
            f"{size:,}; the copy or download was interrupted: copy the file again"
        )


# --------------------------------------------------------------------------- data


def read_voxels(opened: OpenedImage) -> np.ndarray:
    """The voxels of ``opened`` as stored; voxels that cannot be read raise ImageReadError."""
    path = opened.header.path
    try:
        return opened.read_raw()
    except MemoryError:
        raise
    except (*_READ_ERRORS, RuntimeError) as exc:
        detail = _short_itk_error(exc) if isinstance(exc, RuntimeError) else exc
        raise ImageReadError(
            f"{path}: the header is readable but the voxel data is not "
            f"({type(exc).__name__}: {detail}); the file is probably truncated or damaged: "
            "copy or export it again"
        ) from exc

