"""A tampered index reaches nothing outside the cache: each unsafe index entry (a key that
is no digest, a file record that leads out of its entry, an id against the manifest's
rules) is an ``index-entry-unsafe`` finding, and no command follows it.

Every case lays a cache and a victim folder side by side under one sandbox and watches,
with an audit hook, every file the commands open, list, write, move or delete there:
none may be outside the cache folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mriprep.cache import Cache, IndexEntry, UnsafeEntry, read_entries
from mriprep.check import check_cache
from mriprep.cli import main as cli
from mriprep.core.errors import CacheError
from mriprep.maintenance import plan_prune, repair_index
from tests.training.template_cache import build_template_cache

# Audit events that touch a path (the first argument, and the second for rename-likes).
_EVENTS = {"open", "os.scandir", "os.listdir", "os.rename", "os.remove", "os.rmdir",
           "os.mkdir", "shutil.rmtree", "shutil.copyfile", "shutil.copytree", "os.symlink",
           "os.truncate", "os.utime", "os.chmod"}
_ON_THE_LINK = {"os.rename", "os.remove", "os.rmdir", "os.symlink"}
_WATCH: dict[str, object] = {"sandbox": None, "cache": None, "seen": []}


def _audit(event: str, args: tuple) -> None:
    sandbox, cache = _WATCH["sandbox"], _WATCH["cache"]
    if sandbox is None or event not in _EVENTS:
        return
    for arg in args[:2]:
        if isinstance(arg, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(arg))
            if event in _ON_THE_LINK:  # acts on a link itself, not on what it points at
                path = os.path.join(os.path.realpath(os.path.dirname(path)),
                                    os.path.basename(path))
            else:
                path = os.path.realpath(path)
            inside = path == cache or path.startswith(cache + os.sep)
            if (path == sandbox or path.startswith(sandbox + os.sep)) and not inside:
                _WATCH["seen"].append((event, path))


sys.addaudithook(_audit)  # hooks cannot be removed: it is idle outside `watched`


class Watched:
    """The sandbox's victim files and every access outside the cache while active."""

    def __init__(self, sandbox: Path, cache: Path):
        self.sandbox, self.cache = sandbox, cache

    def __enter__(self):
        self.before = _snapshot(self.sandbox, self.cache)
        _WATCH.update(sandbox=os.path.realpath(self.sandbox),
                      cache=os.path.realpath(self.cache), seen=[])
        return self

    def __exit__(self, *exc):
        seen = list(_WATCH["seen"])
        _WATCH.update(sandbox=None, cache=None, seen=[])
        if exc[0] is None:
            assert seen == [], f"reached outside the cache: {seen[:5]}"
            assert _snapshot(self.sandbox, self.cache) == self.before


def _snapshot(sandbox: Path, cache: Path) -> dict:
    """Every path outside the cache with its bytes and mtime: proof nothing was written,
    moved or deleted there."""
    found = {}
    for path in sandbox.rglob("*"):
        if path == cache or cache in path.parents:
            continue
        found[str(path)] = (path.read_bytes(), path.stat().st_mtime_ns) if path.is_file() \
            else None
    return found


@pytest.fixture
def shared(tmp_path) -> tuple[Path, Path]:
    """(sandbox, cache): a 3-entry cache and, beside it, a victim folder and a folder
    an escaping export would write into."""
    sandbox = tmp_path / "share"
    root = build_template_cache(sandbox / "cache", splits={"train": 2, "val": 1}, step=8)
    victim = sandbox / "victim"
    victim.mkdir()
    (victim / "data.txt").write_text("secret!!\n")  # 9 B, as in the issue
    good = Cache(root).entries()[0]
    (victim / "meta.json").write_text(json.dumps(dict(good.to_json(), key="x")))
    (victim / "image.npy").write_bytes(Cache(root).entry_file(good, "image").read_bytes())
    return sandbox, root


def _tamper(root: Path, case: str) -> str:
    """Rewrite one index entry as an attacker would; the key now naming it."""
    index = json.loads((root / "index.json").read_text())
    key, doc = sorted(index["entries"].items())[0]
    doc = json.loads(json.dumps(doc))
    if case == "key":  # a copy of a sound entry under a key that climbs out
        key = "../../victim"
    elif case == "file":
        for record in doc["files"].values():
            record["file"] = "../../../victim/data.txt"
    elif case == "subject":
        doc["subject_id"] = "../../../escaped"
    index["entries"][key] = doc
    (root / "index.json").write_text(json.dumps(index))
    return key


CASES = ["key", "file", "subject"]


@pytest.mark.parametrize("case", CASES)
def test_reading_refuses_each_unsafe_entry_by_name(shared, case):
    _, root = shared
    key = _tamper(root, case)
    reading = Cache(root).read_entries()
    [refused] = reading.unsafe
    assert refused.key == key and len(reading.entries) == (3 if case == "key" else 2)
    expected = {"key": "not a 64-character hex digest",
                "file": "names '../../../victim/data.txt', which is not a plain file name",
                "subject": "subject_id '../../../escaped' contains a path separator"}[case]
    assert expected in str(refused.error) and repr(key) in str(refused.error)
    with pytest.raises(UnsafeEntry, match="cache repair"):
        Cache(root).entries()  # what the Dataset and export read: all or nothing


@pytest.mark.parametrize("case", CASES)
def test_check_reports_index_entry_unsafe_and_reads_nothing_outside(shared, case):
    sandbox, root = shared
    key = _tamper(root, case)
    with Watched(sandbox, root):
        report = check_cache(root)
    unsafe = [f for f in report.errors if f.code == "index-entry-unsafe"]
    assert [f.keys for f in unsafe] == [(key,)] and not report.ok
    assert repr(key) in unsafe[0].message and "cache repair" in unsafe[0].message


@pytest.mark.parametrize("case", CASES)
def test_ls_prune_export_and_the_dataset_do_not_follow_it(shared, case, capsys, tmp_path):
    sandbox, root = shared
    key = _tamper(root, case)
    with Watched(sandbox, root):
        assert cli(["cache", "ls", str(root)]) == 1
        out = capsys.readouterr().out
        assert "unsafe" in out and repr(key) in out and "9 B" not in out
        with pytest.raises(CacheError, match="unsafe.*cache repair"):
            plan_prune(Cache(root), grace_seconds=0)
        assert cli(["export", str(root), "-o", str(sandbox / "out" / "a" / "b")]) == 2
        assert "unsafe" in capsys.readouterr().err
        from mriprep.training import MRIDataset

        with pytest.raises(UnsafeEntry):
            MRIDataset(root, split="train")
    assert not (sandbox / "escaped.nii.gz").exists()


@pytest.mark.parametrize("case", CASES)
def test_repair_takes_it_out_and_quarantines_inside_the_cache_only(shared, case, capsys):
    sandbox, root = shared
    key = _tamper(root, case)
    with Watched(sandbox, root):
        assert cli(["cache", "repair", str(root)]) == 1  # it found damage
    out = capsys.readouterr().out
    assert "unsafe index entry" in out and repr(key) in out
    reading = Cache(root).read_entries()
    assert reading.refused == [] and len(reading.entries) == 3  # the sidecars are sound
    [kept] = (root / "quarantine").glob("unsafe-index-entries-*.json")
    assert list(json.loads(kept.read_text())) == [key]
    assert check_cache(root).ok


def test_repair_quarantines_a_tampered_sidecar_and_a_linked_entry_folder(shared):
    sandbox, root = shared
    cache = Cache(root)
    entry = cache.entries()[0]
    meta = cache.read_meta(entry.key)
    meta["subject_id"] = "../../../escaped"
    (cache.entry_dir(entry.key) / "meta.json").write_text(json.dumps(meta))
    # Where repair writes the entry's reason, a link to a file outside waits.
    os.symlink(sandbox / "victim" / "data.txt", cache.entry_dir(entry.key) / "reason.txt")
    linked = "f" * 64
    os.symlink(sandbox / "victim", cache.entries_dir / linked)  # a folder outside, linked in
    with Watched(sandbox, root):
        report = repair_index(cache)
    assert set(report.quarantined) == {entry.key, linked}
    assert "unsafe" in report.quarantined[entry.key]
    assert (root / "quarantine" / linked).is_symlink()  # the link moved, not its target
    assert (sandbox / "victim" / "data.txt").read_text() == "secret!!\n"
    assert "unsafe" in (root / "quarantine" / entry.key / "reason.txt").read_text()
    assert len(Cache(root).entries()) == 2


def test_a_sound_entry_still_reads_and_entry_dir_refuses_a_non_key(shared):
    _, root = shared
    cache = Cache(root)
    entry = cache.entries()[0]
    assert IndexEntry.from_json(entry.key, entry.to_json()) == entry
    assert read_entries({entry.key: entry.to_json()}).refused == []
    with pytest.raises(CacheError, match="not a 64-character hex digest"):
        cache.entry_dir("../../victim")


def test_a_record_listed_under_an_escaping_name_is_unsafe_whatever_its_file(shared, tmp_path):
    # export writes an extra file under its record's name, not its "file": a plain "file"
    # must not carry an escaping name through
    sandbox, root = shared
    index = json.loads((root / "index.json").read_text())
    key, doc = sorted(index["entries"].items())[0]
    record = {"file": "meta.json", "bytes": 1, "xxh3_128": None}
    doc.setdefault("extra_files", {})["../../../victim/evil.tfm"] = record
    doc["files"]["../../victim/x"] = dict(doc["files"]["image"])  # its "file" is plain
    (root / "index.json").write_text(json.dumps(index))
    [refused] = Cache(root).read_entries().unsafe
    assert refused.key == key
    assert "'../../../victim/evil.tfm'" in str(refused.error)
    assert "'../../victim/x.npy'" in str(refused.error)
    with Watched(sandbox, root):
        assert cli(["export", str(root), "-o", str(sandbox / "out" / "a" / "b")]) == 2
    assert not (sandbox / "victim" / "evil.tfm").exists()
