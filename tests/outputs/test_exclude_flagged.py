"""`mriprep export --exclude-flagged`: the entries the last check flagged are left out,
and each is named on stderr with its findings (tests/check/flagged_cache.py: sub-01 a
label-side-swap error, sub-02 a label-misfit warning)."""

from __future__ import annotations

import pytest

from mriprep.cli import main
from tests.check.flagged_cache import flagged_cache, rebuild


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return flagged_cache(tmp_path_factory.mktemp("flagged") / "c", check=True)


def test_export_leaves_out_flagged_entries_and_names_them(checked, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["export", str(checked), "-o", str(out), "--exclude-flagged"]) == 0
    captured = capsys.readouterr()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["sub-00"]
    assert "exported 1 of 1 entries" in captured.out
    err = captured.err.splitlines()
    assert err[0].startswith("mriprep export: left out 2 of 3 entries that the check of ")
    assert "(--exclude-flagged; the check record is " in err[0]
    assert "exclude_flagged" not in captured.err
    assert err[1].startswith("  left out sub-01 [") and "label-side-swap (error)" in err[1]
    assert err[2].startswith("  left out sub-02 [") and "label-misfit (warning)" in err[2]
    # errors only: the misfit is exported
    out2 = tmp_path / "y"
    assert main(["export", str(checked), "-o", str(out2), "--exclude-flagged", "error"]) == 0
    assert sorted(p.name for p in out2.iterdir() if p.is_dir()) == ["sub-00", "sub-02"]
    assert "left out 1 of 3 entries" in capsys.readouterr().err


def test_fastsurfer_export_leaves_out_flagged_entries(checked, tmp_path, capsys):
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "x.hdf5"
    assert main(["export", str(checked), "-o", str(out), "--format", "fastsurfer-hdf5",
                 "--workers", "1", "--exclude-flagged", "error",
                 "--derived-dir", str(tmp_path / "derived")]) == 0
    err = capsys.readouterr().err
    assert "left out 1 of 3 entries" in err and "left out sub-01 [" in err
    with h5py.File(out, "r") as hf:
        assert [s.decode() for s in hf["72"]["subject"][:]] == ["sub-00", "sub-02"]


def test_without_a_record_or_with_a_stale_one_export_refuses_naming_the_check(
        tmp_path, capsys):
    root = flagged_cache(tmp_path / "c")
    assert main(["export", str(root), "-o", str(tmp_path / "x"), "--exclude-flagged"]) == 2
    err = capsys.readouterr().err
    assert "(--exclude-flagged): no check has kept its findings" in err
    assert f"`mriprep check {root} --lut dkt`" in err and "exclude_flagged" not in err
    assert not (tmp_path / "x").exists()
    from mriprep import check as chk
    from mriprep.training.labels import dkt_table

    chk.check_cache(root, label_table=dkt_table(), workers=1)
    rebuild(root, 2)
    assert main(["export", str(root), "-o", str(tmp_path / "x"), "--exclude-flagged"]) == 2
    err = capsys.readouterr().err
    assert "is stale for 1 of the 3 chosen entries: sub-02 [" in err
    assert f"check the cache again: `mriprep check {root} --lut dkt`" in err
