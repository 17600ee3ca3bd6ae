"""`make bench`: every benchmark of mriprep in one run, on the calibration set and one
demo cohort.

Each section measures side by side (mriprep against its anchor in the same run), because
these machines are shared and noisy: compare the ratios, not the absolute seconds. Nothing
here asserts a time. Sections can be chosen: ``python benchmarks/run_all.py slices loader``.

Each section runs in a fresh Python process (this script again, with ``--in-process`` and
the one section), so that nothing a section sets holds for the next: the runner section's
``torch.set_num_threads(1)``, the thread counts and environment a bench gives itself, the
modules it imported. The parent builds the demo cohort once and hands every section the
same work folder. A section that fails is reported with its exit status and the rest still
run; the run's exit status is non-zero if any section failed.

Each section's output is also kept in the work folder (``sections/NAME.log``), beside a
record of how it ended (``sections/NAME.json``: exit status, seconds, start and end, the
commit). The whole bench takes hours on a 2-core machine, longer than some sessions:
``--work-dir DIR --resume`` continues a run, leaving out the sections that already
succeeded in DIR on the same commit of a clean checkout, or on an earlier commit from which
nothing that section runs has changed (``benchmarks/resume.py``), and says which and when.
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Benchmarks import each other as a package when run as a script from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mriprep.demo import build_demo_cohort  # noqa: E402


def _bench(name: str):
    """A benchmark module, imported when its section runs, never at this file's top.

    The runner section starts dask worker processes, and a spawned process re-imports
    this script: with every benchmark imported here (torch, MONAI), each worker took
    2.0 s instead of 0.45 s to start, and the scaling figures measured that.
    """
    return importlib.import_module(f"benchmarks.{name}")


SECTIONS = ("registration", "plausibility", "resolution", "slices", "conform", "runner",
            "report", "loader", "storage", "guards", "augment", "training", "check",
            "identity", "scale", "fastsurfer", "labels", "outcome")


def _sections(cohort: Path, work: Path) -> dict:
    """What each of :data:`SECTIONS` runs."""
    return {
        "registration": lambda: _bench("bench_registration").main([]),
        "plausibility": lambda: _bench("bench_plausibility").main([]),
        "resolution": lambda: _bench("bench_resolution").main([]),
        "slices": lambda: _bench("bench_slices").main([str(cohort)]),
        "conform": lambda: _bench("bench_conform").main([str(cohort)]),
        "runner": lambda: _bench("bench_runner").main(["--work-dir", str(work / "runner")]),
        "report": lambda: _bench("bench_report").main(
            [str(cohort), "--work-dir", str(work / "report"), "--rounds", "2"]),
        "loader": lambda: _bench("bench_loader").main([]),
        "storage": lambda: _bench("bench_storage").main(["--cohort", str(cohort)]),
        "guards": lambda: _bench("bench_guards").main([]),
        "augment": lambda: _bench("bench_augment").main([]),
        "training": lambda: _training_section(work),
        "check": lambda: _check_section(work),
        "identity": lambda: _bench("bench_identity").main(["--work-dir", str(work / "identity")]),
        "scale": lambda: _bench("bench_scale").main(["--work-dir", str(work / "scale")]),
        "fastsurfer": lambda: _bench("bench_fastsurfer").main(
            ["--work-dir", str(work / "fastsurfer")]),
        "labels": lambda: _bench("bench_labels").main([]),
        # Writes docs/img/outcome.png and outcome.json: the README's picture and table.
        "outcome": lambda: _bench("bench_outcome").main(["--work-dir", str(work / "outcome")]),
    }


def _training_section(work: Path) -> int:
    """The reference training step fed by the loader against a dummy loader, on the demo
    cache the runner section left (its people and labels), else on a built cache."""
    demo_cache = work / "runner" / "scaling-2"
    if (demo_cache / "index.json").exists():
        print(f"demo cache ({demo_cache}):")
        return _bench("bench_training").main(["--cache", str(demo_cache)])
    return _bench("bench_training").main([])


def _check_section(work: Path) -> int:
    """The check's read speed on the demo cache (left by the runner section), then on a
    cache of template-sized volumes, and how the index checks scale."""
    demo_cache = work / "runner" / "scaling-2"
    if (demo_cache / "index.json").exists():
        print(f"demo cache ({demo_cache}):")
        _bench("bench_check").main(["--cache", str(demo_cache), "--sizes", ""])
        print("template-sized synthetic cache, and index scaling:")
    return _bench("bench_check").main([])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help="run only these sections")
    parser.add_argument("--work-dir", help="keep the demo cohort and caches here, e.g. to "
                        "inspect a failed run (default: a temporary folder, deleted at the "
                        "end, whatever happened)")
    parser.add_argument("--resume", action="store_true",
                        help="with --work-dir: leave out the sections that already "
                        "succeeded in that folder on this same commit (a clean checkout), "
                        "or on an earlier one from which nothing they run has changed "
                        "(benchmarks/resume.py), to finish a run that was stopped")
    parser.add_argument("--in-process", action="store_true",
                        help="run the chosen sections in this process, one after another "
                        "(how each section's own process is started; the default starts a "
                        "fresh process per section)")
    args = parser.parse_args(argv)
    chosen = args.sections or list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    if args.in_process and not args.work_dir:
        parser.error("--in-process needs --work-dir (the folder the parent run shares)")
    if args.resume and (not args.work_dir or args.in_process):
        parser.error("--resume needs --work-dir (the folder of the run to continue), and "
                     "no --in-process")

    if args.work_dir:
        # Absolute, so that every path a section writes into a manifest or prints names
        # the same file whichever folder a reader starts from.
        return _run(chosen, Path(args.work_dir).absolute(), keep=not args.in_process,
                    in_process=args.in_process, resume=args.resume)
    # Without --work-dir everything goes: one run writes about 6 GB of caches.
    with tempfile.TemporaryDirectory(prefix="mriprep-bench-") as scratch:
        return _run(chosen, Path(scratch), keep=False, in_process=False)


def section_command(name: str, work: Path) -> list[str]:
    """The command that runs section ``name`` alone in a fresh interpreter, on ``work``."""
    return [sys.executable, str(Path(__file__).resolve()), name, "--work-dir", str(work),
            "--in-process"]


def run_sections(chosen: list[str], command, records: Path | None = None,
                 version=lambda: None) -> dict[str, int]:
    """Run each of ``chosen`` as its own process, ``command(name)``, one after another.

    With ``records``, each section's output is also written to ``records/NAME.log`` and
    how it ended to ``records/NAME.json`` (:func:`_record`), with ``version()``, the code
    as the section starts (:func:`code_version`: a section imports the checkout as it is
    then, so a commit made during a long run must not be credited to the start's).
    Returns every section's exit status; a failed section does not stop the ones after it.
    """
    statuses = {}
    for name in chosen:
        print(f"\n=== {name} " + "=" * (70 - len(name)), flush=True)
        started = _now()
        commit = version()
        start = time.perf_counter()
        log = None
        if records is not None:
            records.mkdir(parents=True, exist_ok=True)
            # An earlier success must not vouch for the output this run cuts short.
            (records / f"{name}.json").unlink(missing_ok=True)
            log = open(records / f"{name}.log", "w", encoding="utf-8")
        try:
            statuses[name] = _run_teed(command(name), log)
        finally:
            if log is not None:
                log.close()
        seconds = time.perf_counter() - start
        failed = f", FAILED with exit status {statuses[name]}" if statuses[name] else ""
        print(f"({name}: {seconds:.0f} s{failed})", flush=True)
        if records is not None:
            _record(records / f"{name}.json", {
                "section": name, "status": statuses[name], "seconds": round(seconds, 1),
                "started": started, "ended": _now(), "commit": commit})
    return statuses


def _run_teed(command: list[str], log) -> int:
    """Run ``command``, its output (stdout and stderr) passed on to this process's stdout
    as it comes, and copied into ``log`` when one is given; returns its exit status. If
    this process is stopped meanwhile (Ctrl-C), the section is stopped with it."""
    if log is None:
        return subprocess.run(command).returncode
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while True:
            chunk = process.stdout.read1(1 << 16)
            text = decoder.decode(chunk, final=not chunk)
            sys.stdout.write(text)
            sys.stdout.flush()
            log.write(text)
            log.flush()
            if not chunk:
                return process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise


def _record(path: Path, record: dict) -> None:
    """Write ``record`` as JSON in one step (a temporary file renamed): a run stopped
    while writing leaves the old record or none, never half of one."""
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=1))
    temporary.replace(path)


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# Tracked files a run itself rewrites (the README's picture and table, bench_outcome.py):
# a change there says nothing about the code that measured.
WRITTEN_BY_THE_BENCH = ("docs/img/outcome.png", "docs/img/outcome.json")


def code_version(root: Path = Path(__file__).resolve().parents[1]) -> str | None:
    """The commit of the checkout at ``root``, or None where it cannot vouch for the code
    that ran: not a git checkout, or tracked files changed since the commit (other than
    :data:`WRITTEN_BY_THE_BENCH`). Untracked files do not count: a work folder inside the
    checkout would otherwise void every record."""
    git = ["git", "-C", str(root)]
    try:
        commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(
            git + ["status", "--porcelain", "--untracked-files=no", "--", "."]
            + [f":(exclude){path}" for path in WRITTEN_BY_THE_BENCH],
            capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return None if changed else commit


def already_done(chosen: list[str], records: Path, version: str | None) -> dict[str, dict]:
    """The sections of ``chosen`` recorded in ``records`` as succeeded on ``version``, or
    on an earlier commit from which nothing they run has changed
    (:func:`benchmarks.resume.kept_records`, which names them); none where ``version``
    is None (the code that ran cannot be told apart)."""
    if version is None:
        return {}
    # Here, not at the top: a section's own process runs this file and never needs it.
    from benchmarks.resume import kept_records

    loaded = {}
    for name in chosen:
        try:
            loaded[name] = json.loads((records / f"{name}.json").read_text())
        except (OSError, ValueError):
            continue
    kept = kept_records(chosen, loaded, version)
    for name, record in kept.items():
        if record["commit"] != version:
            print(f"({name}: recorded on {record['commit'][:10]}; nothing it runs has "
                  f"changed since, to {version[:10]})")
    return kept


def _run(chosen: list[str], work: Path, keep: bool, in_process: bool,
         resume: bool = False) -> int:
    cohort = work / "cohort"
    if not (cohort / "ground_truth.json").exists():
        print(f"building the demo cohort in {cohort} ...", flush=True)
        build_demo_cohort(cohort, seed=0)
    if in_process:
        sections = _sections(cohort, work)
        return max((int(sections[name]() or 0) for name in chosen), default=0)
    records = work / "sections"
    version = code_version()
    done = already_done(chosen, records, version) if resume else {}
    if resume:
        if version is None:
            print("--resume: this checkout has changes to tracked files since its commit "
                  "(or is not a git checkout), so no earlier section can be vouched for: "
                  "every section runs (commit or stash the changes to resume)")
        for name, record in done.items():
            print(f"({name}: left out, done {record['ended']} on {record['commit'][:10]} in "
                  f"{record['seconds']:.0f} s; its output: {records / name}.log)")
    statuses = run_sections([n for n in chosen if n not in done],
                            lambda name: section_command(name, work), records, code_version)
    failed = {name: code for name, code in statuses.items() if code}
    if failed:
        print("\nfailed sections (exit status): "
              + ", ".join(f"{name} ({code})" for name, code in failed.items()))
    if keep:
        print(f"\nbench work folder (kept): {work}; each section's output in {records}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
