"""A storage format is one module: the one below, defined here and registered through the
public registry call, is chosen by a pipeline, written by the runner, verified by
``mriprep check`` (which catches a changed byte) and read by ``MRIDataset``, with no
edit anywhere else in mriprep."""

from __future__ import annotations

import csv
import json
import zlib

import nibabel as nib
import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cache.formats import TensorFormat, choices, register_format, unregister_format
from mriprep.cli import main as cli_main
from mriprep.core.errors import PipelineConfigError
from mriprep.pipelines import pipeline_from_dict
from mriprep.run.cohort import cohort_rows, run_cohort

MAGIC = b"ZRAW1\n"


class ZlibRawFormat(TensorFormat):
    """A raw C-order array deflated whole with zlib, after a line of JSON that gives its
    dtype and shape: the smallest format that is not the shipped ones."""

    suffix = ".zraw"
    choices = ("zlib",)
    description = "a zlib raw array"

    def write(self, fh, array, choice):
        header = json.dumps({"dtype": array.dtype.str, "shape": list(array.shape)})
        fh.write(MAGIC + header.encode() + b"\n" + zlib.compress(array.tobytes(), 6))

    def open(self, path):
        with open(path, "rb") as fh:
            if fh.readline() != MAGIC:
                raise ValueError(f"{path} is not a {self.description}")
            header = json.loads(fh.readline())
            data = zlib.decompress(fh.read())
        array = np.frombuffer(data, dtype=np.dtype(header["dtype"]))
        return array.reshape(header["shape"])  # read-only, like the other formats


@pytest.fixture
def zlib_format():
    fmt = register_format(ZlibRawFormat())
    yield fmt
    unregister_format(fmt)
    assert "zlib" not in choices()


def _cohort(root):
    """Two tiny heads (16 x 18 x 14 voxels of 2 mm) with label maps, one per split."""
    rng = np.random.default_rng(0)
    x, y, z = np.mgrid[:16, :18, :14]
    head = (x - 8) ** 2 / 36 + (y - 9) ** 2 / 49 + (z - 7) ** 2 / 25 < 1
    rows = []
    for i, split in enumerate(["train", "val"]):
        image = (head * (300 + 40 * rng.standard_normal(head.shape))).astype(np.float32)
        label = (head.astype(np.int16) + (head & (x > 8 - i))).astype(np.int16)
        nib.save(nib.Nifti1Image(image, np.diag([2.0, 2, 2, 1])), root / f"s{i}_T1w.nii.gz")
        nib.save(nib.Nifti1Image(label, np.diag([2.0, 2, 2, 1])), root / f"s{i}_dseg.nii.gz")
        rows.append({"subject_id": f"sub-{i}", "image": f"s{i}_T1w.nii.gz",
                     "label": f"s{i}_dseg.nii.gz", "split": split})
    with open(root / "cohort.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return root / "cohort.csv"


def test_a_registered_format_goes_from_pipeline_to_dataset(zlib_format, tmp_path):
    from mriprep.training import MRIDataset

    stages = ["sanitize", "validate"]
    pipe = pipeline_from_dict({"name": "tiny", "output_dtype": "float32",
                               "compression": {"image": "zlib", "label": "lz4"},
                               "stages": stages})
    plain = pipeline_from_dict({"name": "tiny", "output_dtype": "float32", "stages": stages})
    assert pipe.compression == {"image": "zlib", "valid": "none", "label": "lz4"}
    assert pipe.hash != plain.hash  # another storage is another cache

    run = run_cohort(cohort_rows(_cohort(tmp_path)), tmp_path / "cache", pipe,
                     scheduler="sync", report=False)
    assert run.count("cached") == 2, run.failed
    cache = Cache(tmp_path / "cache")
    entries = cache.entries()
    for entry in entries:
        assert [entry.files[n].file for n in ("image", "valid", "label")] == \
            ["image.zraw", "valid.npy", "label.b2nd"]
        assert entry.storage == "float32, image zlib, label lz4"
        path = cache.tensor_path(entry.key, "image")
        assert path.name == "image.zraw" and path.read_bytes().startswith(MAGIC)
        assert cache.has_entry(entry.key, verify=True)

    # `mriprep check` reads it (values too: the labels it counts come from every tensor).
    assert cli_main(["check", str(cache.root)]) == 0

    train = MRIDataset(cache.root, split="train")
    item = train[0]
    key = cache.entries("train")[0].key
    np.testing.assert_array_equal(item["image"][0].numpy(), cache.load_tensor(key, "image"))
    np.testing.assert_array_equal(item["label"].numpy(), cache.load_tensor(key, "label"))
    patch = MRIDataset(cache.root, split="val", mode="patch", patch_size=8,
                       samples_per_volume=2)[1]
    val_key = cache.entries("val")[0].key
    start = tuple(int(s) for s in patch["location"])
    region = tuple(slice(s, s + 8) for s in start)
    np.testing.assert_array_equal(patch["image"][0].numpy(),
                                  cache.load_tensor(val_key, "image")[region])

    # One changed byte of the stored stream: check and verify name the file and entry.
    path = cache.tensor_path(key, "image")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    path.write_bytes(bytes(raw))
    from mriprep.check import check_cache, verify_cache

    for report in (check_cache(cache.root), verify_cache(cache.root)):
        named = [f for f in report.findings if "image.zraw" in f.message]
        assert not report.ok
        assert "checksum-mismatch" in {f.code for f in named}
        assert all(key in f.keys for f in named), report.findings
    assert cli_main(["check", str(cache.root)]) != 0
    assert not cache.has_entry(key, verify=True)


def test_an_unregistered_choice_is_refused_and_a_taken_one_cannot_be_registered():
    with pytest.raises(PipelineConfigError, match="'compression' = 'zlib' is not supported; "
                                                  "use one of none, lz4, zstd"):
        pipeline_from_dict({"name": "x", "compression": "zlib", "stages": ["sanitize"]})

    class Clash(ZlibRawFormat):
        choices = ("lz4",)

    with pytest.raises(ValueError, match="choice 'lz4' is taken by Blosc2Format"):
        register_format(Clash())

    class SameSuffix(ZlibRawFormat):
        suffix = ".npy"

    with pytest.raises(ValueError, match="suffix .npy is taken by NpyFormat"):
        register_format(SameSuffix())
    assert choices() == ("none", "lz4", "zstd")
