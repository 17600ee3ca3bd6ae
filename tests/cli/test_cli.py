"""The command line as a whole: help for every subcommand, the shared exit codes, errors
without tracebacks, and a start that does not import the heavy libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mriprep.cli import COMMANDS, main
from mriprep.core.exit_codes import ExitCode


def test_every_subcommand_explains_itself(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listing = capsys.readouterr().out
    for name in COMMANDS:
        assert name in listing
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0
        assert f"usage: mriprep {name}" in capsys.readouterr().out


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == ExitCode.USAGE == 2
    assert "usage: mriprep" in capsys.readouterr().out


def test_an_error_of_mriprep_names_the_file_and_the_fix_without_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MRIPREP_DEBUG", raising=False)
    missing = tmp_path / "absent.csv"
    code = main(["run", str(missing), "-o", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE
    assert err.startswith("mriprep run: error:") and str(missing) in err
    assert "the file does not exist; check the path" in err and "Traceback" not in err
    assert not (tmp_path / "cache").exists()  # refused before any work


def test_the_command_starts_without_torch_or_dask():
    # Workers re-import the caller, and `mriprep check` must start fast on a login node.
    probe = ("import sys; from mriprep.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('torch', 'dask', 'SimpleITK', 'ants') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == "[]"
