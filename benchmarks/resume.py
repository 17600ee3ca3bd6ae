"""Which records of a `make bench` run a resumed run may keep (``run_all.py --resume``).

A section's record names the commit its code was at when it started. A record of the
commit checked out now stands. A record of an earlier commit stands too where nothing
that section runs differs between the two commits (:func:`section_unchanged`), so that a
fault found in one benchmark during a run of hours is fixed and that section alone runs
again, the run's other records still valid. Everything here errs towards running a
section again: whatever cannot be compared counts as changed.

What a section runs, and what it does not:

* not run by any section: ``docs/``, ``tests/``, ``benchmarks/runs/``, Markdown files,
  and the files the outcome section itself rewrites;
* the driver, ``benchmarks/run_all.py``: every section's process runs it (its top level,
  ``main``, the in-process path of ``_run``, the section definitions), and the runner's
  worker processes import it again. Compared as code (no docstrings, no line numbers),
  leaving out only :data:`BOOKKEEPING`, the functions the parent process alone calls;
* the other files under ``benchmarks/``: those the section's module imports, at either
  commit, directly or through each other (:func:`section_sources`), and the sources of
  the sections whose output it measures (:data:`INPUTS`);
* every other tracked file (``mriprep/``, ``examples/``, pipelines, ``Makefile``,
  ``pyproject.toml``, constraints): run by every section.
"""

from __future__ import annotations

import ast
import datetime
import subprocess
from pathlib import Path

from benchmarks.run_all import WRITTEN_BY_THE_BENCH

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = ("docs/", "tests/", "benchmarks/runs/")
DRIVER = "benchmarks/run_all.py"
# The driver's functions that only the parent process calls: how sections are started,
# teed, recorded and left out. A section's own process never calls them.
BOOKKEEPING = ("run_sections", "_run_teed", "_record", "_now", "code_version",
               "already_done")
# Sections that measure what another section left in the work folder: the training and
# check sections read the demo cache the runner section builds.
INPUTS = {"training": ("runner",), "check": ("runner",)}


def kept_records(chosen: list[str], records: dict[str, dict], version: str,
                 root: Path = ROOT) -> dict[str, dict]:
    """The records of ``chosen`` (name -> record, as ``sections/NAME.json`` holds them)
    that a resumed run on commit ``version`` may keep: succeeded, on ``version`` or on a
    commit from which the section is unchanged; and, for a section in :data:`INPUTS`,
    only where each section it reads from is kept too and ended before it started."""
    kept = {}
    for name in chosen:
        record = records.get(name)
        commit = record and record.get("commit")
        if record and record.get("status") == 0 and commit and (
                commit == version or section_unchanged(name, commit, version, root)):
            kept[name] = record
    for name in list(kept):
        for source in INPUTS.get(name, ()):
            before = records.get(source)
            if source in chosen and (
                    source not in kept or _when(before["ended"]) > _when(kept[name]["started"])):
                del kept[name]
                break
    return kept


def _when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def section_unchanged(name: str, recorded: str, current: str, root: Path = ROOT) -> bool:
    """True where nothing section ``name`` runs (module docstring) differs between commits
    ``recorded`` and ``current``."""
    changed = _changed_files(recorded, current, root)
    if changed is None:
        return False
    own: set[str] = set()
    for section in (name, *INPUTS.get(name, ())):
        for commit in (recorded, current):
            sources = section_sources(section, commit, root)
            if sources is None:
                return False
            own |= sources
    for path in changed:
        if path.startswith(NOT_RUN) or path.endswith(".md") or path in WRITTEN_BY_THE_BENCH:
            continue
        if path == DRIVER:
            before, after = _driver_code(recorded, root), _driver_code(current, root)
            if before is None or before != after:
                return False
            continue
        if path.startswith("benchmarks/") and path != "benchmarks/__init__.py":
            if path in own:
                return False
            continue
        return False
    return True


def section_sources(name: str, commit: str, root: Path = ROOT) -> set[str] | None:
    """The files under ``benchmarks/`` that section ``name`` runs at ``commit``: its
    module ``bench_NAME.py`` (named even where it does not exist at that commit) and
    every ``benchmarks`` module it imports, anywhere in its code and in theirs, absolute
    or relative, with their parent packages' ``__init__.py`` and each subpackage's whole
    folder (its data files too). None where an import of a ``benchmarks`` module names
    no file at that commit: what it ran cannot be told."""
    files = _tracked(commit, "benchmarks", root)
    if files is None:
        return None
    entry = f"benchmarks.bench_{name}"
    sources = {f"benchmarks/bench_{name}.py"}
    pending, seen = [entry], set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module, files)
        if path is None:
            if module == entry:
                continue  # the section is new or gone at this commit: its name counts
            return None
        sources.add(path)
        parts = module.split(".")
        if "benchmarks/__init__.py" in files:
            sources.add("benchmarks/__init__.py")
        # Importing a.b.c runs the packages a.b and a first: a subpackage with its folder.
        pending += [".".join(parts[:depth]) for depth in range(2, len(parts))]
        if path.endswith("/__init__.py") and len(parts) > 1:
            folder = path.rsplit("/", 1)[0] + "/"
            sources.update(f for f in files if f.startswith(folder))
        tree = _parsed(commit, path, root)
        if tree is None:
            return None
        package = parts if path.endswith("/__init__.py") else parts[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pending += [a.name for a in node.names if a.name.split(".")[0] == "benchmarks"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "benchmarks":
                    continue
                pending.append(target)
                # `from package import name`: a name may be a submodule.
                pending += [sub for sub in (f"{target}.{a.name}" for a in node.names)
                            if _module_file(sub, files) is not None]
    return sources


def _module_file(module: str, files: set[str]) -> str | None:
    base = module.replace(".", "/")
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if candidate in files:
            return candidate
    return None


def _driver_code(commit: str, root: Path) -> str | None:
    """The driver at ``commit`` as code: its syntax tree without docstrings, line numbers
    and the functions of :data:`BOOKKEEPING`; None where it cannot be read."""
    tree = _parsed(commit, DRIVER, root)
    if tree is None:
        return None
    tree.body = [node for node in tree.body
                 if not (isinstance(node, ast.FunctionDef) and node.name in BOOKKEEPING)]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _changed_files(recorded: str, current: str, root: Path) -> list[str] | None:
    """Every path that differs between the two commits, a renamed file under both its
    names; None where git cannot compare them."""
    out = _git(root, "diff", "--name-only", "--no-renames", "-z", recorded, current)
    return None if out is None else [p for p in out.split("\0") if p]


def _tracked(commit: str, folder: str, root: Path) -> set[str] | None:
    out = _git(root, "ls-tree", "-r", "-z", "--name-only", commit, "--", folder)
    return None if out is None else {p for p in out.split("\0") if p}


def _parsed(commit: str, path: str, root: Path) -> ast.Module | None:
    """The syntax tree of ``path`` at ``commit``; None where it cannot be read or parsed."""
    text = _git(root, "show", f"{commit}:{path}")
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
