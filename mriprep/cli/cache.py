"""``mriprep cache ls | prune | verify | repair``: look after a cache folder.

The work is in :mod:`mriprep.maintenance` and :func:`mriprep.check.verify_cache`; this
module parses, asks before deleting, and prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from mriprep.cache import Cache
from mriprep.core.exit_codes import ExitCode
from mriprep.core.progress import ProgressBar


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "cache",
        help="list, prune, verify or repair a cache",
        description="Look after a cache folder: list its entries, remove what no longer "
        "belongs, verify every file, or rebuild a damaged index from the entries' sidecars.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    ls = sub.add_parser("ls", help="list the entries: subject, session, split, pipeline, "
                                   "storage, size",
                        description="List every indexed entry (subject, session, split, "
                        "pipeline, storage: the image dtype and each tensor's compression, "
                        "size on disk) and the entry folders the index no longer lists.")
    ls.add_argument("cache", help="cache folder")
    ls.add_argument("--split", help="only this split")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=run_ls)

    prune = sub.add_parser(
        "prune", help="remove entries not in a manifest, of other pipelines, or unindexed",
        description="Remove indexed entries that are not rows of --manifest or come from "
        "another pipeline than the kept one, entry folders the index no longer lists, and "
        "their QC folders. Shows what it will remove first and asks (or --yes).")
    prune.add_argument("cache", help="cache folder")
    prune.add_argument("--manifest", metavar="M", help="keep only this manifest's rows")
    prune.add_argument("--pipeline", metavar="NAME_OR_HASH",
                       help="the pipeline to keep (default: the cache's only one, or the "
                       "last run's)")
    prune.add_argument("--dry-run", action="store_true", help="show the plan, remove nothing")
    prune.add_argument("-y", "--yes", action="store_true", help="remove without asking")
    prune.add_argument("--json", action="store_true", help="print the plan as JSON")
    prune.set_defaults(func=run_prune)

    verify = sub.add_parser(
        "verify", help="the integrity part of `mriprep check`: files, checksums, sidecars",
        description="Read every file of every entry once: present, whole, finite, equal to "
        "its checksum and to its sidecar and index records. Exit 1 on any problem.")
    verify.add_argument("cache", help="cache folder")
    verify.add_argument("--workers", type=int, metavar="N", help="reader threads")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=run_verify)

    repair = sub.add_parser(
        "repair", help="rebuild the index from the entries' sidecars, quarantining damage",
        description="Rebuild index.json from every entry's meta.json, verifying each "
        "entry's files (every byte); a damaged entry moves to CACHE/quarantine with its "
        "reason. Splits come from --manifest, else the old index if readable, else the run "
        "reports. The old index is kept as index.json.before-repair-<time>.")
    repair.add_argument("cache", help="cache folder")
    repair.add_argument("--manifest", metavar="M", help="take each entry's split from here")
    repair.add_argument("--workers", type=int, metavar="N", help="reader threads")
    repair.add_argument("--json", action="store_true", help="print what it did as JSON")
    repair.set_defaults(func=run_repair)


def run_ls(args: argparse.Namespace) -> int:
    from mriprep.maintenance import take_inventory

    inventory = take_inventory(Cache(args.cache))
    if args.split:
        inventory.indexed = [e for e in inventory.indexed if e.entry.split == args.split]
    if args.json:
        print(json.dumps(inventory.to_json(), indent=2))
        return ExitCode.PROBLEMS if inventory.unsafe else ExitCode.OK
    if inventory.index_problem:
        print(f"index: {inventory.index_problem}\n  `mriprep cache repair {args.cache}` "
              "rebuilds it from the entries' sidecars")
    for problem in inventory.unsafe + inventory.malformed:
        print(f"index: {problem}")
    rows = [("subject", "session", "split", "pipeline", "storage", "size", "key")]
    for listed in inventory.indexed:
        e = listed.entry
        rows.append((e.subject_id, e.session_id or "-", e.split or "-",
                     f"{e.pipeline_name or '?'} {e.pipeline_hash[:8]}", e.storage,
                     _size(listed.bytes), e.key[:12]))
    for listed in inventory.unindexed:
        rows.append(("(not indexed)", "", "", "", "", _size(listed.bytes), listed.key[:12]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    splits: dict[str, int] = {}
    for listed in inventory.indexed:
        splits[listed.entry.split] = splits.get(listed.entry.split, 0) + 1
    per_split = ", ".join(f"{s or '-'} {n}" for s, n in sorted(splits.items()))
    line = (f"{len(inventory.indexed)} entries ({per_split or 'none'}), "
            f"{_size(sum(e.bytes for e in inventory.indexed))}")
    if inventory.unindexed:
        line += (f"; {len(inventory.unindexed)} folder(s) not indexed, "
                 f"{_size(sum(e.bytes for e in inventory.unindexed))} "
                 f"(`mriprep cache prune {args.cache}` removes them)")
    print(line)
    # An entry nobody may follow is a problem of the cache, as `mriprep check` says too.
    return ExitCode.PROBLEMS if inventory.unsafe else ExitCode.OK


def run_prune(args: argparse.Namespace) -> int:
    from mriprep.maintenance import apply_prune, plan_prune

    cache = Cache(args.cache)
    plan = plan_prune(cache, manifest=args.manifest, pipeline=args.pipeline)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        for r in plan.removals:
            who = (f"{r.entry.subject_id}{'/' + r.entry.session_id if r.entry.session_id else ''}"
                   f" ({r.entry.split})" if r.entry else r.folder)
            print(f"  remove {r.key[:12]}  {_size(r.bytes):>9}  {who}: {r.reason}")
        if plan.too_young:
            print(f"  keep {len(plan.too_young)} unindexed folder(s) written in the last "
                  "10 minutes (a run may be indexing them)")
        print(f"{len(plan.removals)} folder(s) to remove, {_size(plan.bytes)}; "
              f"{plan.kept} indexed entries stay")
    if not plan.removals or args.dry_run:
        return ExitCode.OK
    if not args.yes:
        if not sys.stdin.isatty():
            print("mriprep cache prune: not removing anything without a terminal to ask; "
                  "add --yes", file=sys.stderr)
            return ExitCode.USAGE
        if input("remove them? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return ExitCode.OK
    freed = apply_prune(cache, plan)
    print(f"removed {len(plan.removals)} folder(s), {_size(freed)} freed", file=sys.stderr)
    return ExitCode.OK


def run_verify(args: argparse.Namespace) -> int:
    from mriprep.check import verify_cache
    from mriprep.check.render import render_report

    bar = ProgressBar("verifying", "entry", leave=False, terminal=False if args.json else None)
    try:
        report = verify_cache(args.cache, workers=args.workers, progress=bar.update_to)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_report(report, command="mriprep cache verify"))
    return ExitCode.OK if report.ok else ExitCode.PROBLEMS


def run_repair(args: argparse.Namespace) -> int:
    from mriprep.maintenance import repair_index

    bar = ProgressBar("verifying", "entry", leave=False, terminal=False if args.json else None)
    try:
        report = repair_index(Cache(args.cache), args.manifest, workers=args.workers,
                              progress=bar.update_to)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        if report.previous_problem:
            print(f"the old index was unreadable: {report.previous_problem}")
        for key, reason in sorted(report.quarantined.items()):
            print(f"  quarantined {key[:12]}: {reason}")
        for key, reason in sorted(report.unsafe.items()):
            print(f"  took unsafe index entry {key!r} out of the index, unfollowed: {reason}")
        if report.backup:
            print(f"  the old index is kept as {report.backup}")
        print(f"mriprep cache repair {args.cache}: {report.summary()}")
    damaged = report.quarantined or report.unsafe or report.unassigned
    return ExitCode.PROBLEMS if damaged else ExitCode.OK


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
