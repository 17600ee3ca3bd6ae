"""The ``mriprep`` command line: a thin layer over the library.

Each subcommand lives in ``mriprep/cli/<name>.py`` (``to-native`` in ``to_native.py``)
with two functions:
``add_parser(subparsers)`` that declares its arguments and ``run(args) -> int`` that does
the work and returns the exit status, one of :class:`~mriprep.core.exit_codes.ExitCode`
for every subcommand: 0 success, 1 the work found problems (failed subjects, a failed
check), 2 usage or configuration error. Errors of mriprep's own kind are printed as one clear message, never
as a traceback (set MRIPREP_DEBUG=1 to see the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mriprep import __version__
from mriprep.core.errors import MriprepError, cli_words
from mriprep.core.exit_codes import ExitCode


# Order here is the order in `mriprep --help`.
COMMANDS = ("demo", "run", "check", "report", "cache", "export", "to-native", "splits",
            "manifest")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mriprep",
        description=(
            "Preprocess MRI cohorts into NaN-free, checksummed tensor caches for CNN "
            "training, and prove the cache and splits are sound before training starts."
        ),
        epilog=(
            "Typical use: `mriprep splits cohort.csv` to check the splits, "
            "`mriprep run cohort.csv -o cache/` to preprocess, `mriprep check cache/` "
            "before training. `mriprep COMMAND --help` explains each command."
        ),
    )
    parser.add_argument("--version", action="version", version=f"mriprep {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"mriprep.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return ExitCode.USAGE
    try:
        return int(args.func(args))
    except MriprepError as exc:
        if os.environ.get("MRIPREP_DEBUG"):
            raise
        # The library names Python parameters; a command names its flags.
        print(f"mriprep {args.command}: error: {cli_words(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    except BrokenPipeError:
        # `mriprep cache ls | head`: the reader has gone; nothing left to say to it.
        sys.stdout = None
        return ExitCode.OK
    except KeyboardInterrupt:
        print("mriprep: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
