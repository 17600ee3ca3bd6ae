"""Real heads labelled as the synthetic people are: a FreeSurfer-numbered map of each
real scan, made from the scan's own tissue contrast, for the label checks' calibration
(issue 45: "clean labelled cohorts ... and real anatomy").

No labelled real anatomy ships with the packages this project may use: the mricron-data
atlases next to Colin27 (AAL, Harvard-Oxford, JHU, ...) are parcellations of MNI152 or
Colin27 under their own licences, not FreeSurfer-numbered maps of S1's or ROBEX's head.
So each head is labelled here the way :mod:`mriprep.demo.freesurfer_cohort` labels a
synthetic person, with the real image in place of the template:

1. **Brain.** The scan's shipped brain mask where there is one (Colin27: its FSL BET copy
   ``ch2bet``, non-zero; ROBEX: ROBEX's own ``atlas_mask``). S1 has none: MNI152's brain
   mask (nilearn's rule, :func:`~mriprep.stages.registration.template.template_brain_mask`)
   is pulled onto S1's grid through its approximate MNI frame, grown by
   :data:`PRIOR_GROWTH_MM` for the frame's error, and the brain kept from it by S1's
   contrast (:func:`_brain_from_prior`). Checked where a shipped mask says what the
   brain is (docs/benchmarks.md, row 49): it agrees with BET's on Colin27 at 1 mm and
   loses much of ROBEX's brain on its 1.5 mm grid, so it is used at 1 mm only (S1 is
   1 mm).
2. **Tissue.** ANTs' N4 bias correction inside the brain (ROBEX's head shades by about
   half its grey-white contrast), then Atropos, k-means initialised, three classes (CSF,
   grey, white matter by rising T1 intensity) with a weak MRF (:data:`ATROPOS_MRF`) so
   that the classes are regions, not voxel noise; one thread and a fixed seed, so the map
   is the same on every run.
3. **Labels.** :func:`~mriprep.demo.freesurfer_labels.freesurfer_labels` on that tissue
   map with the scan's affine composed with its MNI frame
   (:func:`~mriprep.demo.real_scans.mni_frame`), so that the regional rules (sides,
   parcels, deep structures, cerebellum) fall in MNI millimetres as they do for a
   synthetic person.

The boxes are the demo's: the maps have FreeSurfer's numbers and class structure on real
tissue boundaries, not FreeSurfer's anatomy. Labelling takes up to a couple of minutes a
head on one thread; each map is kept on disk under a hash of its inputs
(:func:`labelled_head`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from mriprep.core.boxes import nonzero_box
from mriprep.demo.freesurfer_labels import CSF, GM, WM, freesurfer_labels
from mriprep.demo.real_scans import brain_mask_path, mni_frame, real_scan
from mriprep.stages.registration.ants_backend import import_ants

# The heads this module labels, and the skull-stripped copy whose brain is each one's
# mask (None: the brain is found from MNI152's mask, :func:`_brain_from_prior`).
HEADS = {"colin27": "colin27_brain", "s1": None, "robex": "robex_brain"}
# Atropos' MRF: smoothing factor and radius in voxels. Weak, so that tissue edges stay
# where the image has them; without it, k-means alone scatters single voxels of grey
# matter through white matter and the reverse (partial volume), which the islands check
# would then judge as the labeller's specks, not a map's.
ATROPOS_MRF = "[0.1,1x1x1]"
# MNI152's brain pulled onto S1 through a frame fitted by hand is off by a few mm at the
# edges (real_scans' notes): grown by this much before S1's own contrast trims it.
PRIOR_GROWTH_MM = 6.0
# The smallest piece of eroded tissue kept as brain: a hemisphere or the cerebellum, not
# a fold of scalp or an eye muscle (a few cm^3 at most).
BRAIN_PIECE_MM3 = 20_000.0
CACHE_VARIABLE = "MRIPREP_REAL_LABELS"


@dataclass(frozen=True)
class LabelledHead:
    """A real head with its FreeSurfer-numbered map on the scan's own grid."""

    name: str
    image: np.ndarray        # the scan as stored (float32, 3-D)
    labels: np.ndarray       # int16, FreeSurfer numbers, 0 off the brain
    affine: np.ndarray       # the scan's voxel -> world (not MNI)
    brain: np.ndarray        # the brain mask the tissue was segmented in (bool)
    mask_source: str         # where ``brain`` came from, in words


def labelled_head(name: str, cache: Path | None = None) -> LabelledHead | None:
    """Real head ``name`` (a key of :data:`HEADS`) labelled as the module docstring says,
    or None when its scan (or its brain mask) is not on this machine
    (:data:`~mriprep.demo.real_scans.HOW_TO_GET`).

    The brain and labels are kept in ``cache`` (default :func:`cache_folder`) under a
    hash of everything that decides them (:func:`_digest`), and read back from there:
    labelling takes a minute or two a head on one thread."""
    if name not in HEADS:
        raise KeyError(f"no labelling for real scan {name!r}; known: {', '.join(HEADS)}")
    path = real_scan(name)
    stripped = HEADS[name]
    if path is None or (stripped is not None and real_scan(stripped) is None):
        return None
    scan = nib.load(path)
    image = np.asarray(scan.dataobj, dtype=np.float32)
    if image.ndim == 4 and image.shape[3] == 1:  # ROBEX's head is stored 4-D
        image = image[..., 0]
    affine = scan.affine
    if stripped is None:
        source = (f"MNI152's brain mask through {name}'s MNI frame, grown "
                  f"{PRIOR_GROWTH_MM:g} mm and trimmed by its own contrast")
        inputs = [path]
    else:
        source = f"the shipped brain of {stripped}"
        inputs = [path, brain_mask_path(stripped) or real_scan(stripped)]
    # ITK reads its thread count once per process: the count in effect names the map.
    _, threads = import_ants(1)
    stored = (cache or cache_folder()) / f"{name}-{_digest(name, inputs, source, threads)}.npz"
    if stored.is_file():
        with np.load(stored, allow_pickle=False) as kept:
            return LabelledHead(name, image, kept["labels"], affine, kept["brain"], source)
    if stripped is None:
        brain = _brain_from_prior(image, affine, mni_frame(name))
    else:
        brain = _shipped_brain(stripped)
    if brain.shape != image.shape:
        raise ValueError(f"{name}: brain mask {brain.shape} is not on the scan's grid "
                         f"{image.shape}")
    tissue = segment_tissue(image, brain, _spacing(affine))
    labels = freesurfer_labels(tissue, mni_frame(name) @ affine, medial_unknown=True)
    stored.parent.mkdir(parents=True, exist_ok=True)
    # A name of this process's own: test workers label the same head at once.
    partial = stored.with_name(f"{stored.stem}.{os.getpid()}.partial.npz")
    np.savez_compressed(partial, labels=labels, brain=brain)
    partial.replace(stored)  # whole or absent: a killed run leaves no half file
    return LabelledHead(name, image, labels, affine, brain, source)


def cache_folder() -> Path:
    """Where :func:`labelled_head` keeps its maps: ``$MRIPREP_REAL_LABELS``, else
    ``share/mriprep/real-labels`` in the running Python's prefix (next to the fetched
    scans)."""
    folder = os.environ.get(CACHE_VARIABLE)
    return Path(folder) if folder else Path(sys.prefix) / "share" / "mriprep" / "real-labels"


def _digest(name: str, inputs: list[Path], source: str, threads: int | None) -> str:
    """The scan's and mask's bytes, the head's MNI frame, this recipe's code (this
    module, the labelling rules, and the template's for a mask found from MNI152's), ANTs'
    version and ITK's thread count: a kept map made otherwise has another name, and is
    made again."""
    import ants

    from mriprep.demo import freesurfer_labels as rules
    from mriprep.inputs import templates
    from mriprep.stages.registration import template

    digest = hashlib.sha256(f"{source}|antspyx {ants.__version__}|itk threads "
                            f"{threads}".encode())
    digest.update(np.asarray(mni_frame(name), dtype=np.float64).tobytes())
    for path in [*inputs, Path(__file__), Path(rules.__file__), Path(templates.__file__),
                 Path(template.__file__)]:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def _spacing(affine: np.ndarray) -> tuple[float, float, float]:
    return tuple(float(s) for s in np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))


def _shipped_brain(stripped: str) -> np.ndarray:
    mask = brain_mask_path(stripped)
    if mask is not None:
        data = np.asarray(nib.load(mask).dataobj)
    else:  # a brain-extracted image: its brain is where it is not zero
        data = np.asarray(nib.load(real_scan(stripped)).dataobj)
    data = data[..., 0] if data.ndim == 4 else data
    return data > 0


def segment_tissue(image: np.ndarray, brain: np.ndarray,
                   spacing: tuple[float, float, float]) -> np.ndarray:
    """CSF / grey / white matter (1 / 2 / 3, 0 outside ``brain``): N4's bias field
    removed inside ``brain``, then Atropos' k-means with an MRF; deterministic (one
    thread, Atropos' fixed seed), in the brain's box only."""
    # ITK's threads may order sums differently from run to run: one thread where this
    # process loads ANTs first (labelled_head names a map by the count in effect).
    ants, _ = import_ants(1)

    box = nonzero_box(brain, margin=2)
    if box is None:
        raise ValueError("the brain mask to segment in is empty: check the scan's brain "
                         "mask, or its MNI frame where the mask comes from MNI152's")
    img = ants.from_numpy(np.ascontiguousarray(image[box], dtype=np.float32),
                          spacing=spacing)
    mask = ants.from_numpy(np.ascontiguousarray(brain[box], dtype=np.float32),
                           spacing=spacing)
    # ROBEX's head shades by half its grey-white contrast across the brain: k-means on
    # it as stored puts grey matter's far side with the CSF.
    flat = ants.n4_bias_field_correction(img, mask=mask)
    # r=0: Atropos' fixed seed. Its default draws one per run (the MRF's update order),
    # and two runs on ROBEX then differed in 95-178 voxels.
    with _temporary_files_in_a_folder_of_their_own():
        seg = ants.atropos(a=flat, x=mask, i="kmeans[3]", m=ATROPOS_MRF, c="[3,0]",
                           r=0, verbose=0)["segmentation"].numpy()
    flat = flat.numpy()
    inside = brain[box]
    # Atropos numbers k-means classes by rising mean; sorted again here, not trusted.
    means = [flat[(seg == c) & inside].mean() for c in (1, 2, 3)]
    local = np.zeros(seg.shape, dtype=np.uint8)
    for cls, tissue_class in zip(np.array((1, 2, 3))[np.argsort(means)], (CSF, GM, WM)):
        local[(seg == cls) & inside] = tissue_class
    tissue = np.zeros(image.shape, dtype=np.uint8)
    tissue[box] = local
    return tissue


@contextmanager
def _temporary_files_in_a_folder_of_their_own() -> Iterator[None]:
    """Every temporary name this process takes meanwhile lies in a new folder, deleted
    on leaving. ``ants.atropos`` (antspyx 0.6) writes one probability image per class
    beside a ``tempfile.mktemp`` name, reads them back and leaves them: three files of
    a few MB in the system's temporary folder per call, for ever."""
    previous = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="mriprep-atropos-") as folder:
        tempfile.tempdir = folder
        try:
            yield
        finally:
            tempfile.tempdir = previous


def _brain_from_prior(image: np.ndarray, affine: np.ndarray,
                      frame: np.ndarray) -> np.ndarray:
    """The brain of a head without a shipped mask: MNI152's brain on the scan's grid,
    grown for the frame's error, then only the grey and white matter of the brain's
    large pieces (skull and scalp parted from them by an erosion), holes filled. Its
    erosions and closings count voxels: made for, and checked on, 1 mm grids (module
    docstring)."""
    from mriprep.inputs.templates import load_template
    from mriprep.stages.registration.template import template_brain_mask

    template = load_template("mni152")
    prior_on_template = template_brain_mask("mni152")
    # scan voxel -> world -> MNI mm -> template voxel
    to_template = np.linalg.inv(template.affine) @ frame @ affine
    prior = ndimage.affine_transform(prior_on_template.astype(np.uint8),
                                     to_template[:3, :3], to_template[:3, 3],
                                     output_shape=image.shape, order=0) > 0
    spacing = np.array(_spacing(affine))
    grown = ndimage.distance_transform_edt(~prior, sampling=spacing) <= PRIOR_GROWTH_MM
    tissue = segment_tissue(image, grown, tuple(spacing))
    parenchyma = (tissue == GM) | (tissue == WM)
    # Two erosions cut the thin bridges of grey-looking tissue (dura, marrow) that join
    # the scalp to the cortex. The brain is the pieces of at least BRAIN_PIECE_MM3 lying
    # mostly inside the prior itself, grown back within the tissue: not the largest piece
    # alone, since at 1.5 mm the erosions also part the hemispheres at the falx.
    core = ndimage.binary_erosion(parenchyma, iterations=2)
    pieces, count = ndimage.label(core)
    sizes = np.bincount(pieces.ravel(), minlength=count + 1)
    inside = np.bincount(pieces.ravel(), weights=prior.ravel(), minlength=count + 1)
    keep = (sizes * np.prod(spacing) >= BRAIN_PIECE_MM3) & (inside > 0.5 * sizes)
    keep[0] = False
    if not keep.any():
        raise ValueError("no brain found inside MNI152's mask: check the scan's MNI frame")
    brain = ndimage.binary_dilation(keep[pieces], iterations=2) & parenchyma
    # Sulcal and ventricular CSF: inside the brain's closed outline, within the prior.
    outline = ndimage.binary_closing(brain, iterations=3)
    brain = ndimage.binary_fill_holes(outline | brain) & grown
    return brain


def labels_onto(theirs: LabelledHead, onto: LabelledHead) -> np.ndarray:
    """``theirs``' labels on ``onto``'s grid, the two heads lined up through their MNI
    frames (nearest neighbour): another person's map handed in with this one's image, as
    a mixed-up manifest or a registered atlas would hand it in."""
    to_theirs = (np.linalg.inv(theirs.affine) @ np.linalg.inv(mni_frame(theirs.name))
                 @ mni_frame(onto.name) @ onto.affine)
    return ndimage.affine_transform(theirs.labels, to_theirs[:3, :3], to_theirs[:3, 3],
                                    output_shape=onto.image.shape, order=0,
                                    mode="constant", cval=0)


def on_1mm_grid(head: LabelledHead) -> LabelledHead:
    """``head`` on a 1 mm grid over the same box and axes (image linear, labels and brain
    nearest neighbour), as ``conform_1mm`` caches a coarser scan: the label checks judge
    cached maps, and some measures are in mm^3 of specks that a 1.5 mm voxel exceeds."""
    spacing = np.array(_spacing(head.affine))
    if np.allclose(spacing, 1.0):
        return head
    shape = tuple(int(np.floor((n - 1) * s)) + 1 for n, s in zip(head.image.shape, spacing))
    step = 1.0 / spacing  # the 1 mm voxel's size in the scan's voxels, per axis
    affine = head.affine.copy()
    affine[:3, :3] = head.affine[:3, :3] / spacing
    image = ndimage.affine_transform(head.image, np.diag(step), output_shape=shape, order=1)
    labels = ndimage.affine_transform(head.labels, np.diag(step), output_shape=shape, order=0)
    brain = ndimage.affine_transform(head.brain.astype(np.uint8), np.diag(step),
                                     output_shape=shape,
                                     order=0) > 0
    return LabelledHead(head.name, image.astype(np.float32), labels, affine, brain,
                        head.mask_source + ", resampled to 1 mm")
