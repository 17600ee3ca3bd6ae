"""The QC label legend names FreeSurfer's labels and draws them in FreeSurfer's colours.

The names and colours come from the lookup table (the shipped FastSurfer DKT table, in
FreeSurfer's numbering); the mosaic paints each label in the colour its legend shows. A
value the table does not name stays "label N" and is named as not in the table.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from mriprep.qc import mosaic
from mriprep.qc.report import _legend
from mriprep.qc.subject import OutputData, subject_qc

FREESURFER = {
    2: ("Left-Cerebral-White-Matter", "#f5f5f5"),
    17: ("Left-Hippocampus", "#dcd814"),
    1002: ("ctx-lh-caudalanteriorcingulate", "#7d64a0"),
}


# More FreeSurfer values, as an aseg holds them: a legend names a map's values from the
# table only when it names most of them, and at least mosaic.FREESURFER_MIN_NAMED.
ASEG = [4, 41, 43, 10, 49, 11, 50, 12, 51, 13]


def _label_qc(values):
    """The QC of a 48^3 head whose label map holds ``values`` in slabs along x."""
    image = np.full((48, 48, 48), 100.0, np.float32)
    label = np.zeros(image.shape, np.int16)
    for i, value in enumerate(values):
        label[8:40, 8:40, 4 + 3 * i:7 + 3 * i] = value
    output = OutputData(image=image, valid=np.ones(image.shape, bool), affine=np.eye(4),
                        label=label)
    return subject_qc(None, [], output, None, [])


def test_the_legend_shows_freesurfer_names_and_colours():
    qc = _label_qc([2, 17, 1002] + ASEG)
    legend = _legend("labels", qc.legends["labels"])
    shown = {name: colour for colour, name, _ in legend}
    for name, colour in FREESURFER.values():
        assert shown[name] == colour
    assert not any(name.startswith("label ") for name in shown)


def test_the_mosaic_paints_each_label_in_its_legend_colour():
    qc = _label_qc([17] + ASEG)
    rgb = np.asarray(Image.open(io.BytesIO(qc.images["labels"])).convert("RGB"), float)
    # A constant image is drawn mid-grey; labels are blended in at 45%.
    expected = 0.55 * 0.5 + 0.45 * np.array([220, 216, 20]) / 255
    painted = np.all(np.abs(rgb / 255 - expected) < 0.04, axis=-1)
    assert painted.mean() > 0.005  # its 3-voxel slab, in the two planes across it


def test_a_value_the_table_lacks_stays_a_number_and_is_named_as_missing():
    qc = _label_qc([2, 17, 9999] + ASEG)
    legend = _legend("labels", qc.legends["labels"])
    missing = [(name, meaning) for _, name, meaning in legend if name == "label 9999"]
    assert missing and "not in" in missing[0][1]
    assert any("9999" in note and "not in" in note for note in qc.notes)


def test_a_map_not_numbered_as_freesurfer_numbers_it_is_not_named_from_the_table():
    # Tissue classes 1-3: only 2 is a FreeSurfer value, by chance; naming it
    # "Left-Cerebral-White-Matter" would be an untruth.
    legend = _legend("labels", _label_qc([1, 2, 3]).legends["labels"])
    assert [name for _, name, _ in legend] == ["label 1", "label 2", "label 3"]
    # 2 and 4 are FreeSurfer's: half of four tissue classes named would pass a share alone
    legend = _legend("labels", _label_qc([1, 2, 3, 4]).legends["labels"])
    assert [name for _, name, _ in legend] == [f"label {v}" for v in (1, 2, 3, 4)]


def test_an_older_qc_json_keeps_the_colours_it_was_painted_in():
    # Written before the table: values only, painted from matplotlib's tab20.
    assert _legend("labels", ["17"]) == [(mosaic.label_colour(17), "label 17", "")]
