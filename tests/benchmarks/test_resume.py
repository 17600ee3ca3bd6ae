"""Which records a resumed `make bench` keeps: a section's record of an earlier commit
stands only where nothing that section runs has changed since."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import resume, run_all

DRIVER = '''"""The driver."""


def _sections():
    """What each section runs."""
    return {{"a": {definition}}}


def _run():
    return 0


def _record():
    """Bookkeeping: the parent's alone."""
    return {bookkeeping}
'''

FILES = {
    "benchmarks/__init__.py": "",
    "benchmarks/helper.py": "X = 1\n",
    "benchmarks/bench_a.py": "def main():\n    from benchmarks.helper import X\n",
    "benchmarks/bench_b.py": "def main():\n    pass\n",
    "benchmarks/bench_c.py": "from benchmarks.pkg.mod import Y\n",
    "benchmarks/pkg/__init__.py": "",
    "benchmarks/pkg/mod.py": "from .util import Z\nY = 1\n",
    "benchmarks/pkg/util.py": "Z = 1\n",
    "benchmarks/pkg/classes.tsv": "0\tUnknown\n",
    "benchmarks/run_all.py": DRIVER.format(definition=1, bookkeeping=1),
    "mriprep/code.py": "y = 1\n",
    "docs/page.md": "text\n",
}


def _scratch_repo(root):
    """A checkout laid out as this one; returns ``commit(files, message) -> sha``."""
    git = ["git", "-C", str(root), "-c", "user.email=bench@example.org",
           "-c", "user.name=bench"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)

    def commit(files: dict, message: str) -> str:
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            if text is None:
                subprocess.run(git + ["mv", path, f"docs/{path.rsplit('/', 1)[1]}"],
                               check=True)
            else:
                (root / path).write_text(text)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", message], check=True)
        return subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    return commit


def test_a_sections_sources_are_its_imports_their_packages_and_folders(tmp_path):
    first = _scratch_repo(tmp_path)(FILES, "first")
    assert resume.section_sources("a", first, tmp_path) == {
        "benchmarks/__init__.py", "benchmarks/bench_a.py", "benchmarks/helper.py"}
    # the package of an imported module, its folder, and a relative import in it
    assert resume.section_sources("c", first, tmp_path) == {
        "benchmarks/__init__.py", "benchmarks/bench_c.py", "benchmarks/pkg/__init__.py",
        "benchmarks/pkg/mod.py", "benchmarks/pkg/util.py", "benchmarks/pkg/classes.tsv"}
    # a section that does not exist at that commit is named all the same
    assert resume.section_sources("new", first, tmp_path) == {"benchmarks/bench_new.py"}


def test_a_section_is_unchanged_across_commits_that_touch_nothing_it_runs(tmp_path):
    commit = _scratch_repo(tmp_path)
    first = commit(FILES, "first")

    def unchanged(old, new):
        return {name: resume.section_unchanged(name, old, new, tmp_path)
                for name in ("a", "b", "c")}

    # (files written, or None: moved into docs/), compared with the first commit or the
    # one before, which sections are unchanged
    steps = [
        ({"docs/page.md": "more text\n", "tests/test_x.py": "pass\n",
          "benchmarks/run_all.py": DRIVER.format(definition=1, bookkeeping=2)
          .replace("The driver.", "The driver, reworded.")},
         "first", {"a": True, "b": True, "c": True}),
        ({"benchmarks/bench_b.py": "def main():\n    return 1\n"}, "first",
         {"a": True, "b": False, "c": True}),
        ({"benchmarks/helper.py": "X = 2\n"}, "previous", {"a": False, "b": True, "c": True}),
        ({"benchmarks/pkg/classes.tsv": "0\tUnknown\n1\tLeft\n"}, "previous",
         {"a": True, "b": True, "c": False}),
        ({"benchmarks/run_all.py": DRIVER.format(definition=2, bookkeeping=2)}, "previous",
         {"a": False, "b": False, "c": False}),
        ({"benchmarks/run_all.py": DRIVER.format(definition=2, bookkeeping=2)
          .replace("return 0", "return 1")}, "previous",
         {"a": False, "b": False, "c": False}),
        ({"mriprep/code.py": "y = 2\n"}, "previous", {"a": False, "b": False, "c": False}),
        ({"mriprep/code.py": None}, "previous", {"a": False, "b": False, "c": False}),
    ]
    previous = current = first
    for files, since, expected in steps:
        current = commit(files, ", ".join(files))
        assert unchanged(first if since == "first" else previous, current) == expected, files
        previous = current
    assert unchanged("0" * 40, current) == {"a": False, "b": False, "c": False}


def test_a_deleted_module_that_a_section_imported_changes_it(tmp_path):
    commit = _scratch_repo(tmp_path)
    first = commit(FILES, "first")
    subprocess.run(["git", "-C", str(tmp_path), "rm", "-q", "benchmarks/pkg/util.py"],
                   check=True)
    gone = commit({}, "util removed")
    assert not resume.section_unchanged("c", first, gone, tmp_path)
    assert resume.section_unchanged("a", first, gone, tmp_path)
    assert resume.section_sources("c", gone, tmp_path) is None  # its import names no file


def _record(commit, started, ended, status=0):
    return {"status": status, "commit": commit, "started": started, "ended": ended,
            "seconds": 1.0}


def test_kept_records_need_success_unchanged_code_and_a_fresh_input(monkeypatch):
    monkeypatch.setattr(resume, "section_unchanged",
                        lambda name, old, new, root: name in ("runner", "check"))
    early, late = "2026-12-07T10:00:00+00:00", "2026-12-07T11:00:00+00:00"
    records = {
        "guards": _record("new", early, early),
        "augment": _record("new", early, early, status=1),
        "labels": _record("old", early, early),  # its code changed since
        "runner": _record("old", early, early),
        "training": _record("new", late, late),
        "check": _record("old", late, late),
    }
    kept = resume.kept_records(list(records), records, "new")
    assert set(kept) == {"guards", "runner", "training", "check"}
    # the runner ran again after the check had read its cache: the check runs again too
    records["runner"] = _record("new", "2026-12-07T12:00:00+00:00", "2026-12-07T12:30:00+00:00")
    assert set(resume.kept_records(list(records), records, "new")) == {
        "guards", "runner"}
    # a runner left out of this invocation leaves its readers' records standing
    assert "check" in resume.kept_records(["check"], records, "new")


def test_resume_names_a_record_kept_from_an_earlier_commit(tmp_path, monkeypatch, capsys):
    (tmp_path / "cohort").mkdir()
    (tmp_path / "cohort" / "ground_truth.json").write_text("{}")
    ran = []

    def command(name, work):
        ran.append(name)
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(run_all, "section_command", command)
    monkeypatch.setattr(run_all, "code_version", lambda: "0ld")
    run_all._run(["guards", "augment"], tmp_path, keep=True, in_process=False)
    monkeypatch.setattr(run_all, "code_version", lambda: "new")
    monkeypatch.setattr(resume, "section_unchanged",
                        lambda name, old, new, root: name == "augment")
    ran.clear()
    capsys.readouterr()
    run_all._run(["guards", "augment"], tmp_path, keep=True, in_process=False, resume=True)
    assert ran == ["guards"]
    out = capsys.readouterr().out
    assert "(augment: recorded on 0ld; nothing it runs has changed since, to new)" in out
    assert json.loads((tmp_path / "sections" / "guards.json").read_text())["commit"] == "new"


def test_the_driver_in_this_checkout_keeps_its_section_code_apart():
    """The functions the comparison leaves out exist in the driver, and none of them is
    one that a section's own process calls."""
    names = {name for name in dir(run_all) if callable(getattr(run_all, name))}
    assert set(resume.BOOKKEEPING) <= names
    assert not {"main", "_run", "_bench", "_sections", "section_command"} & set(
        resume.BOOKKEEPING)
