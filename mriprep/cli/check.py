"""``mriprep check CACHE``: the gate before training (see :mod:`mriprep.check`).

Exit status: 0 the cache is sound (warnings may be listed), 1 at least one error was
found (or a warning, with ``--strict``), 2 usage error (no such cache folder, unreadable
manifest, bad option).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from mriprep.check import CheckReport, check_cache
from mriprep.splits import NEAR_DUPLICATE_THRESHOLD
from mriprep.check.manifest import read_exclusions

EXIT_OK, EXIT_PROBLEMS = 0, 1
MAX_FINDINGS_PER_CODE = 20


def parse_labels(text: str) -> list[int]:
    """``"0,2,4-7"`` -> ``[0, 2, 4, 5, 6, 7]``."""
    values: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, sep, last = part.partition("-") if not part.startswith("-") else (part, "", "")
            if sep:
                lo, hi = int(first), int(last)
                if hi < lo:
                    raise ValueError(f"range {part} runs backwards")
                values.update(range(lo, hi + 1))
            else:
                values.add(int(part))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--labels {text!r} is not a list of integers and ranges like 0,2,4-7 ({exc})"
        ) from exc
    if not values:
        raise argparse.ArgumentTypeError("--labels needs at least one value, e.g. 0,1,2,3")
    return sorted(values)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--near-threshold must be between 0 and 1, got {text!r}")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check",
        help="verify a cache before training (checksums, NaN, pipelines, split leaks)",
        description=(
            "Verify every entry of a cache (files present, checksums, finite values, dtype, "
            "shape, spacing, label values), that one pipeline made all splits, and that no "
            "subject or image leaks between splits. Reports every problem at once. Exit 0 "
            "when sound, 1 when a problem is found, 2 for a usage error."
        ),
    )
    p.add_argument("cache", help="cache folder written by `mriprep run -o`")
    p.add_argument("--json", action="store_true", help="print the report as JSON (for CI)")
    p.add_argument(
        "--manifest",
        metavar="M",
        help="also check that every row of this manifest is cached: a row that failed "
        "or is missing is an error (exit 1), named with its stage and reason",
    )
    p.add_argument(
        "--exclude",
        metavar="FILE",
        help="rows known not to be cached, accepted with a warning: a text file with one "
        "subject (or subject/session) per line, # for comments",
    )
    p.add_argument(
        "--labels",
        type=parse_labels,
        metavar="VALUES",
        help="allowed label values, e.g. 0,2,4-7 (default: the set each entry records)",
    )
    p.add_argument(
        "--near-threshold",
        type=_threshold,
        default=NEAR_DUPLICATE_THRESHOLD,
        metavar="R",
        help=f"fingerprint correlation from which two subjects' images are reported as "
        f"near-duplicates (default {NEAR_DUPLICATE_THRESHOLD})",
    )
    p.add_argument("--workers", type=int, default=None, metavar="N", help="reader threads")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.exclude and not args.manifest:
        print("mriprep check: error: --exclude lists manifest rows; give the manifest too "
              "(--manifest M)", file=sys.stderr)
        return 2
    progress = None
    if not args.json and sys.stderr.isatty():
        progress = _progress_bar()
    try:
        report = check_cache(
            args.cache,
            manifest=args.manifest,
            exclusions=read_exclusions(args.exclude) if args.exclude else (),
            allowed_labels=args.labels,
            near_duplicate_threshold=args.near_threshold,
            workers=args.workers,
            progress=progress,
        )
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_report(report))
    failed = not report.ok or (args.strict and report.warnings)
    return EXIT_PROBLEMS if failed else EXIT_OK


class _progress_bar:
    """``progress(done, total)`` callback drawing a tqdm bar on the terminal."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="entry", desc="checking", leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def render_report(report: CheckReport) -> str:
    """The report as a table for people: header, per-split summary, findings, verdict."""
    lines = [
        f"mriprep check {report.cache}: {report.entries} entries, {len(report.splits)} split(s)"
    ]
    if report.pipeline_hashes:
        hashes = ", ".join(f"{h[:12]} ({n})" for h, n in sorted(report.pipeline_hashes.items()))
        lines.append(f"  pipeline hash(es): {hashes}")
    if report.bytes_read:
        lines.append(
            f"  read {report.bytes_read / 1e6:.1f} MB in {report.read_seconds:.2f} s "
            f"({report.read_mb_per_s:.0f} MB/s)"
        )
    search = report.near_duplicate_search
    if search.get("method") and search["method"] != "skipped":
        lines.append(
            f"  near-duplicate search: {search['method']} over {search.get('entries')} "
            f"fingerprints, {search.get('pairs_compared')} pairs compared"
        )
    if report.splits:
        lines += ["", _split_table(report)]
    by_code: dict[str, list] = defaultdict(list)
    for finding in report.findings:
        by_code[(finding.severity, finding.code)].append(finding)
    if by_code:
        lines.append("")
    for (severity, code), findings in sorted(
        by_code.items(), key=lambda kv: (kv[0][0] != "error", kv[0][1])
    ):
        for finding in findings[:MAX_FINDINGS_PER_CODE]:
            lines.append(f"{severity.upper():<8}{code:<24}{finding.message}")
        if len(findings) > MAX_FINDINGS_PER_CODE:
            lines.append(
                f"{'':<32}... and {len(findings) - MAX_FINDINGS_PER_CODE} more {code} "
                "finding(s); see --json"
            )
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = "FAILED" if n_err else "OK"
    lines += ["", f"{verdict}: {n_err} error(s), {n_warn} warning(s)"]
    return "\n".join(lines)


def _split_table(report: CheckReport) -> str:
    header = f"{'split':<10}{'entries':>8}{'subjects':>10}{'invalid':>10}  label shares"
    rows = [header]
    for name, s in sorted(report.splits.items()):
        shares = "  ".join(f"{v}:{share:.1%}" for v, share in list(s.label_shares.items())[:10])
        if len(s.label_shares) > 10:
            shares += f"  (+{len(s.label_shares) - 10} labels)"
        if not shares:
            shares = "(no labels)"
        rows.append(
            f"{name:<10}{s.entries:>8}{s.subjects:>10}{s.invalid_fraction:>10.2%}  {shares}"
        )
    return "\n".join(rows)
