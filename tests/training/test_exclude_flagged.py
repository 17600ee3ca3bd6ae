"""MRIDataset(exclude_flagged=...): the entries the last check flagged are left out,
named in a warning and in ``dataset.excluded`` (tests/check/flagged_cache.py: sub-01 a
label-side-swap error, sub-02 a label-misfit warning)."""

from __future__ import annotations

import warnings

import pytest

from mriprep.core.errors import CacheError
from mriprep.training import MRIDataset
from tests.check.flagged_cache import flagged_cache, rebuild


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return flagged_cache(tmp_path_factory.mktemp("flagged") / "c", check=True)


def test_the_dataset_leaves_out_flagged_entries_and_says_which(checked):
    with pytest.warns(UserWarning) as caught:
        ds = MRIDataset(checked, "train", exclude_flagged=True)
    assert [e.subject_id for e in ds.entries] == ["sub-00"] and len(ds) == 1
    assert ds[0]["subject_id"] == "sub-00"
    names = {name.split()[0]: codes for name, codes in ds.excluded.items()}
    assert names == {"sub-01": ("label-side-swap",), "sub-02": ("label-misfit",)}
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("MRIDataset: split 'train': left out 2 of 3 entries that "
                              "the check of ")
    assert "(exclude_flagged=; the check record is " in message
    assert "sub-01 [" in message and "(label-side-swap)" in message
    assert "(dataset.excluded lists them all)" in message
    # errors only
    with pytest.warns(UserWarning, match="left out 1 of 3 entries"):
        ds = MRIDataset(checked, "train", exclude_flagged="error")
    assert [e.subject_id for e in ds.entries] == ["sub-00", "sub-02"]
    # by default nothing is read or left out, and nothing is said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = MRIDataset(checked, "train")
    assert len(ds) == 3 and ds.excluded == {}


def test_without_a_record_or_with_a_stale_one_the_dataset_refuses(tmp_path):
    root = flagged_cache(tmp_path / "c")
    with pytest.raises(CacheError, match=r"\(exclude_flagged=\): no check has kept its "
                                         r"findings in cache .*`mriprep check .* --lut dkt`"):
        MRIDataset(root, "train", exclude_flagged=True)
    from mriprep import check as chk
    from mriprep.training.labels import dkt_table

    chk.check_cache(root, label_table=dkt_table(), workers=1)
    rebuild(root, 1)
    with pytest.raises(CacheError, match=r"stale for 1 of the 3 chosen entries: sub-01 \["
                                         r".*check the cache again: `mriprep check "):
        MRIDataset(root, "train", exclude_flagged=True)
    with pytest.raises(ValueError, match=r"exclude_flagged='all': choose True"):
        MRIDataset(root, "train", exclude_flagged="all")


def test_a_check_without_a_label_table_is_named_in_the_warning(tmp_path):
    root = flagged_cache(tmp_path / "c")
    from mriprep import check as chk

    chk.check_cache(root, workers=1)  # no --lut: the label maps are not judged
    with pytest.warns(UserWarning) as caught:
        ds = MRIDataset(root, "train", exclude_flagged=True)
    assert len(ds) == 3 and ds.excluded == {}
    (message,) = [str(w.message) for w in caught]
    assert "left out nothing (exclude_flagged=)" in message
    assert f"that check ran without --lut, so no label map was judged against a label " \
           f"table: `mriprep check {root} --lut dkt`" in message


def test_every_entry_flagged_leaves_nothing_and_is_refused(tmp_path):
    from mriprep import check as chk
    from mriprep.training.labels import dkt_table
    from tests.check.flagged_cache import swap_hippocampus

    root = flagged_cache(tmp_path / "c")
    rebuild(root, 0, swap_hippocampus)
    chk.check_cache(root, label_table=dkt_table(), workers=1)
    with pytest.raises(CacheError, match=r"left out 3 of 3 entries .* nothing is left to "
                                         r"read.*exclude_flagged='error'"):
        MRIDataset(root, "train", exclude_flagged=True)
