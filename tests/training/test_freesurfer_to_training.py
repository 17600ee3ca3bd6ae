"""From a FreeSurfer SUBJECTS_DIR to FastSurfer training data, as docs/fastsurfer.md's recipe
runs it: a DKT subject, a Desikan subject and an aseg-only one (issue 44).

The manifest takes the DKT and Desikan maps and refuses the aseg-only subject with the
fix; conform_1mm caches both; ``check --lut dkt`` passes and lists the rewrites; the
export and the thick-slice Dataset keep every cortical voxel, counted per class. Whole
256^3 heads, about a minute: the calibration tier (``make test-calibration``).
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep import MRIDataset
from mriprep.cache import Cache
from mriprep.cli import main
from mriprep.demo.freesurfer_subjects import build_subjects_dir
from mriprep.training.labels import dkt_table
from mriprep.training.labels.derived import DerivedLabels

pytestmark = pytest.mark.calibration
h5py = pytest.importorskip("h5py", reason="h5py missing: pip install 'mriprep[fastsurfer]'")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    work = tmp_path_factory.mktemp("quickstart")
    subjects = build_subjects_dir(work / "subjects", kinds=("dkt", "desikan", "aseg"))
    return work, subjects


def test_subjects_dir_to_cache_check_export_and_dataset(quickstart, capsys):
    work, subjects = quickstart
    assert main(["manifest", "from-freesurfer", str(subjects), "-o",
                 str(work / "subjects.csv")]) == 0
    out, err = capsys.readouterr()
    assert "subj-03" in err and "--seg aseg" in err        # refused, with the fix
    assert "aparc.DKTatlas+aseg.mgz for 1" in out and "aparc+aseg.mgz" in out
    assert main(["splits", str(work / "subjects.csv"), "--assign", "train=0.5,val=0.5",
                 "-o", str(work / "cohort.csv")]) == 0
    cache = work / "cache"
    assert main(["run", str(work / "cohort.csv"), "-o", str(cache), "-p", "conform_1mm",
                 "--workers", "2", "--no-report"]) == 0
    capsys.readouterr()
    assert main(["check", str(cache), "--lut", "dkt"]) == 0
    out = capsys.readouterr().out
    assert "Desikan-only parcel" in out and "lut-rewrites" in out

    for split in ("train", "val"):
        out_file = work / f"{split}_coronal.hdf5"
        assert main(["export", str(cache), "-o", str(out_file), "--format",
                     "fastsurfer-hdf5", "--split", split]) == 0

    # Every cortical voxel of the cached maps (parcels, unknown, Desikan) is a cortical
    # class after the rules, in both subjects: no cortex went to background.
    c = Cache(cache)
    table = dkt_table()
    store = DerivedLabels(c, table)
    first_cortex = table.class_names("axial").index("ctx-lh-caudalanteriorcingulate")
    for entry in c.entries():
        raw = np.asarray(c.load_tensor(entry.key, "label"))
        cortex = int(((raw >= 1000) & (raw < 3000)).sum())
        summary = store.summary(entry)
        counts = summary.class_counts["axial"]
        assert cortex > 100_000 and int(counts[first_cortex:].sum()) == cortex
        assert (counts[first_cortex:] > 0).sum() >= 30   # the parcels, each counted
        ds = MRIDataset(cache, entry.split, mode="thick_slice", view="coronal",
                        absent_classes="error")
        assert len(ds) > 100 and int(ds[len(ds) // 2]["label"].max()) >= first_cortex
