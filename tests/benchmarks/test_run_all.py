"""`make bench`'s driver: every section in its own process, failures reported, the rest run.

The sections here are one-line Python commands standing in for the benchmarks (each takes
minutes); what is tested is how ``benchmarks/run_all.py`` starts and accounts for them.
"""

from __future__ import annotations

import json
import os
import re
import sys

from benchmarks import run_all


def _writes_pid(tmp_path, code: int = 0):
    """A section command: a fresh interpreter that records its pid and thread count, sets
    one thread more than it found, then exits with ``code``."""
    def command(name):
        script = ("import json, os, sys, torch; "
                  "n = torch.get_num_threads(); "
                  f"json.dump([os.getpid(), n], open({str(tmp_path / name)!r}, 'w')); "
                  "torch.set_num_threads(n + 1); "
                  f"sys.exit({code if name == 'fails' else 0})")
        return [sys.executable, "-c", script]
    return command


def test_each_section_runs_in_a_fresh_process_whose_settings_do_not_carry_over(tmp_path):
    statuses = run_all.run_sections(["first", "second"], _writes_pid(tmp_path))
    first = json.loads((tmp_path / "first").read_text())
    second = json.loads((tmp_path / "second").read_text())
    assert statuses == {"first": 0, "second": 0}
    assert len({first[0], second[0], os.getpid()}) == 3
    # the first set one thread more before it ended; the second starts with the default
    assert second[1] == first[1]


def test_a_failed_section_is_reported_and_the_rest_still_run(tmp_path, capsys):
    statuses = run_all.run_sections(["fails", "after"], _writes_pid(tmp_path, code=3))
    assert statuses == {"fails": 3, "after": 0}
    assert (tmp_path / "after").exists()
    assert re.search(r"\(fails: \d+ s, FAILED with exit status 3\)", capsys.readouterr().out)


def test_the_run_fails_if_any_section_failed_and_shares_one_work_folder(tmp_path, monkeypatch,
                                                                        capsys):
    (tmp_path / "cohort").mkdir()
    (tmp_path / "cohort" / "ground_truth.json").write_text("{}")  # built: not rebuilt
    seen = []

    def command(name, work):
        seen.append(work)
        return [sys.executable, "-c", f"raise SystemExit({2 if name == 'guards' else 0})"]

    monkeypatch.setattr(run_all, "section_command", command)
    assert run_all._run(["guards", "augment"], tmp_path, keep=False, in_process=False) == 1
    assert seen == [tmp_path, tmp_path]
    assert "failed sections (exit status): guards (2)" in capsys.readouterr().out
    assert run_all._run(["augment"], tmp_path, keep=False, in_process=False) == 0


def test_a_relative_work_folder_is_handed_to_the_sections_as_an_absolute_one(tmp_path,
                                                                           monkeypatch):
    given = []
    monkeypatch.setattr(run_all, "_run", lambda chosen, work, **_: given.append(work) or 0)
    monkeypatch.chdir(tmp_path)
    assert run_all.main(["guards", "--work-dir", "bench_out"]) == 0
    assert given == [tmp_path / "bench_out"]


def test_a_section_command_reinvokes_this_script_on_one_section_and_the_shared_folder(tmp_path):
    command = run_all.section_command("guards", tmp_path)
    assert command[0] == sys.executable
    assert command[1].endswith("run_all.py")
    assert command[2:] == ["guards", "--work-dir", str(tmp_path), "--in-process"]


def test_each_sections_output_and_end_are_kept_in_the_work_folder(tmp_path, capsys):
    def command(name):
        return [sys.executable, "-c",
                f"print('measured {name}: 1.5x'); raise SystemExit({4 if name == 'b' else 0})"]

    statuses = run_all.run_sections(["a", "b"], command, tmp_path / "sections")
    assert statuses == {"a": 0, "b": 4}
    assert "measured a: 1.5x" in capsys.readouterr().out  # still shown as it comes
    assert (tmp_path / "sections" / "a.log").read_text() == "measured a: 1.5x\n"
    record = json.loads((tmp_path / "sections" / "b.json").read_text())
    assert record["status"] == 4 and record["seconds"] >= 0
    assert record["started"] <= record["ended"]


def test_resume_leaves_out_only_what_succeeded_on_the_same_code(tmp_path, monkeypatch,
                                                                capsys):
    (tmp_path / "cohort").mkdir()
    (tmp_path / "cohort" / "ground_truth.json").write_text("{}")
    ran = []

    def command(name, work):
        ran.append(name)
        return [sys.executable, "-c", f"raise SystemExit({5 if name == 'guards' else 0})"]

    monkeypatch.setattr(run_all, "section_command", command)
    monkeypatch.setattr(run_all, "code_version", lambda: "c0ffee")
    sections = ["guards", "augment", "labels"]
    assert run_all._run(sections, tmp_path, keep=True, in_process=False) == 1
    assert ran == sections
    # One more success recorded on other code: it must run again.
    record = json.loads((tmp_path / "sections" / "labels.json").read_text())
    (tmp_path / "sections" / "labels.json").write_text(json.dumps({**record,
                                                                   "commit": "0ther"}))
    ran.clear()
    capsys.readouterr()
    assert run_all._run(sections, tmp_path, keep=True, in_process=False, resume=True) == 1
    assert ran == ["guards", "labels"]
    assert "(augment: left out, done " in capsys.readouterr().out
    # A record kept from an earlier commit (nothing it runs changed) names that commit.
    import benchmarks.resume

    monkeypatch.setattr(benchmarks.resume, "kept_records",
                        lambda chosen, records, version: {
                            name: {**records[name], "commit": "0ld"}
                            for name in chosen if name == "augment"})
    ran.clear()
    run_all._run(sections, tmp_path, keep=True, in_process=False, resume=True)
    out = capsys.readouterr().out
    assert ran == ["guards", "labels"]
    assert "(augment: recorded on 0ld; nothing it runs has changed since, to c0ffee)" in out
    assert "(augment: left out, done " in out and " on 0ld in " in out
    # Code that no commit vouches for: nothing is left out.
    monkeypatch.setattr(run_all, "code_version", lambda: None)
    ran.clear()
    run_all._run(sections, tmp_path, keep=True, in_process=False, resume=True)
    assert ran == sections
    assert "every section runs" in capsys.readouterr().out


def test_the_code_version_is_the_commit_until_tracked_code_changes(tmp_path,
                                                                   tmp_path_factory):
    import subprocess

    git = ["git", "-C", str(tmp_path), "-c", "user.email=bench@example.org",
           "-c", "user.name=bench"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "img" / "outcome.json").write_text("{}")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "first"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert run_all.code_version(tmp_path) == commit
    # What a run writes: its work folder (untracked) and the outcome section's table.
    (tmp_path / "bench_out").mkdir()
    (tmp_path / "bench_out" / "guards.log").write_text("measured\n")
    (tmp_path / "docs" / "img" / "outcome.json").write_text('{"seconds": 1800}')
    assert run_all.code_version(tmp_path) == commit
    (tmp_path / "code.py").write_text("x = 2\n")
    assert run_all.code_version(tmp_path) is None
    assert run_all.code_version(tmp_path_factory.mktemp("not-a-checkout")) is None


def test_each_record_names_the_code_as_its_section_started(tmp_path):
    versions = iter(["c0ffee", "beef01"])

    def command(name):
        return [sys.executable, "-c", "pass"]

    run_all.run_sections(["a", "b"], command, tmp_path, version=lambda: next(versions))
    assert json.loads((tmp_path / "a.json").read_text())["commit"] == "c0ffee"
    assert json.loads((tmp_path / "b.json").read_text())["commit"] == "beef01"

