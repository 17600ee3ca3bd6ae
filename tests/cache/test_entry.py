"""An entry as the index lists it: IndexEntry round trips and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mriprep.cache import Cache, IndexEntry, MalformedEntry
from mriprep.core.errors import CacheError

from .conftest import key_of, meta_of, tensors_of


def test_index_entry_round_trips_and_refuses_a_malformed_document(tmp_path, brain):
    data, affine = brain
    cache = Cache(tmp_path / "c", create=True)
    key = key_of("sub-01")
    cache.update_index(
        [cache.write_entry(key, tensors_of(data), meta_of("sub-01", data, affine),
                           extra_files={"transform.tfm": "x"}).with_split("train")]
    )
    doc = json.loads(cache.index_path.read_text())["entries"][key]
    entry = IndexEntry.from_json(key, doc)
    assert entry.to_json() == doc
    assert json.dumps(entry.to_json(), indent=1) == json.dumps(doc, indent=1)  # key order too
    assert (entry.subject_id, entry.session_id, entry.split) == ("sub-01", "", "train")
    assert entry.label_values is None and entry.has_label
    assert entry.extra_files["transform.tfm"].file == "transform.tfm"
    np.testing.assert_array_equal(entry.affine, affine)
    # Rewriting the index from its entries leaves the file byte for byte as it was.
    before = cache.index_path.read_bytes()
    cache.update_index(cache.entries())
    assert cache.index_path.read_bytes() == before
    broken = {k: v for k, v in doc.items() if k != "pipeline_hash"}
    with pytest.raises(MalformedEntry, match=f"index entry {key} lacks 'pipeline_hash'"):
        IndexEntry.from_json(key, broken)
    with pytest.raises(CacheError, match=r"'shape' is not a list"):
        IndexEntry.from_json(key, dict(doc, shape="64x64x64"))
    with pytest.raises(MalformedEntry, match=r"affine \[\[1, 0\]\] is not a finite 4x4 matrix"):
        IndexEntry.from_json(key, dict(doc, affine=[[1, 0]])).affine
    with pytest.raises(ValueError, match=r"valid lacks dtype/shape/bytes/xxh3_128"):
        IndexEntry.from_json(key, dict(doc, files=dict(doc["files"], valid={"file": "v"})))
    cache.index_path.write_text(json.dumps({"version": 1, "entries": {key: broken}}))
    with pytest.raises(CacheError, match="lacks 'pipeline_hash'"):
        cache.entries()
