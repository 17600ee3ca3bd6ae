"""The typed sidecar record reads meta.json as written, and writes it unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mriprep.cache import Cache
from mriprep.cache.sidecar import EntrySidecar, InputFile, read_sidecar
from mriprep.core.errors import CacheError

KEY = "a" * 64


def _sidecar(**other) -> EntrySidecar:
    return EntrySidecar(
        subject_id="sub-01", session_id="", pipeline_name="p", pipeline_hash="f" * 64,
        pipeline_source="/p.yaml", output_dtype="float32",
        inputs={"image": InputFile("/in/sub-01_T1w.nii.gz", "b" * 64)}, header="auto",
        affine=np.diag([2.0, 2.0, 2.0, 1.0]), spacing=(2.0, 2.0, 2.0), shape=(3, 4, 5),
        label_values=None, provenance=({"stage": "s", "params": {}, "metrics": {"n": 1},
                                        "warnings": [], "seconds": 0.1},),
        mriprep_version="9.9", other=other)


def test_written_sidecar_reads_back_and_its_json_is_the_file(tmp_path):
    cache = Cache(tmp_path / "cache", create=True)
    sidecar = _sidecar(template_to_subject=np.eye(4).tolist(), transform_file="t.tfm")
    tensors = {"image": np.zeros((3, 4, 5), np.float32), "valid": np.ones((3, 4, 5), bool)}
    cache.write_entry(KEY, tensors, sidecar.to_json())
    raw = json.loads((cache.entry_dir(KEY) / "meta.json").read_text())
    read = read_sidecar(cache, KEY)
    assert read.to_json() == raw and list(read.to_json()) == list(raw)  # order too
    assert read.subject_id == "sub-01" and read.spacing == (2.0, 2.0, 2.0)
    np.testing.assert_array_equal(read.template_to_subject, np.eye(4))
    assert read.tensor_names == ("image", "valid") and read.nifti_form == "auto"
    assert read.inputs["image"].sha256 == "b" * 64 and read.records[0]["stage"] == "s"


def test_a_sidecar_without_newer_fields_reads_as_before():
    doc = _sidecar().to_json()
    del doc["header"], doc["label_values"]
    read = EntrySidecar.from_json(doc)
    assert read.header is None and read.nifti_form == "auto" and read.label_values is None
    assert read.template_to_subject is None


def test_a_malformed_sidecar_names_the_file():
    with pytest.raises(CacheError, match="x/meta.json is not a JSON object"):
        EntrySidecar.from_json([1, 2], where="x/meta.json")
    with pytest.raises(CacheError, match="x/meta.json holds a malformed field"):
        EntrySidecar.from_json({"shape": ["a"]}, where="x/meta.json")
