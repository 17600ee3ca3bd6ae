"""Each interface in its own words: a message the Python API raises names parameters
(``session_id=``); the same message printed by a command names its flags (``--session``)."""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.cache import Cache, entry_key
from mriprep.cli import main
from mriprep.core.errors import CacheError, cli_words
from mriprep.outputs.select import entry_for
from mriprep.splits import assign_folds


def test_cli_words_turns_parameters_into_flags_and_leaves_the_rest():
    assert cli_words("name one (session_id=)") == "name one (--session)"
    assert cli_words("pass native_path=PATH") == "pass --native PATH"
    assert cli_words("folds=1: K-fold needs 2") == "--folds 1: K-fold needs 2"
    assert cli_words("pass reassign=True to draw") == "pass --reassign to draw"
    assert cli_words("n_folds=3, x.labels=4, subject_id") == "n_folds=3, x.labels=4, subject_id"


def _two_sessions(root):
    cache = Cache(root, create=True)
    entries = []
    for number, session in enumerate(["ses-1", "ses-2"]):
        meta = {"subject_id": "sub-a", "session_id": session, "pipeline_name": "test",
                "pipeline_hash": "a" * 64,
                "inputs": {"t1w": {"path": "a.nii.gz", "sha256": f"{number:064x}"}},
                "affine": np.eye(4).tolist(), "spacing": [1.0] * 3, "shape": [4, 4, 4],
                "provenance": []}
        tensors = {"image": np.ones((4, 4, 4), np.float32), "valid": np.ones((4, 4, 4), bool)}
        key = entry_key("sub-a", session, {"t1w": f"{number:064x}"}, "a" * 64)
        entries.append(cache.write_entry(key, tensors, meta).with_split("train"))
    cache.update_index(entries)
    return cache


def test_a_subject_with_two_sessions_is_asked_for_in_each_interface_s_words(
        tmp_path, capsys):
    cache = _two_sessions(tmp_path / "cache")
    with pytest.raises(CacheError) as caught:
        entry_for(cache, "sub-a")
    assert "session_id=" in str(caught.value) and "--session" not in str(caught.value)
    prediction = tmp_path / "pred.npy"
    np.save(prediction, np.zeros((4, 4, 4), np.int16))
    code = main(["to-native", str(cache.root), "sub-a", str(prediction), "-o",
                 str(tmp_path / "out.nii.gz")])
    err = capsys.readouterr().err
    assert code == 2 and "--session" in err and "session_id" not in err


def test_assignment_errors_name_parameters_in_python(tmp_path):
    with pytest.raises(ValueError) as caught:
        assign_folds([], 1)
    assert str(caught.value).startswith("folds=1") and "--" not in str(caught.value)
