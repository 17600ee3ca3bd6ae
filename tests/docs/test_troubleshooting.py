"""The README's troubleshooting says what Python really prints when the folder that holds
the clone shadows the installed package (issue 47): the message is reproduced here, from
a folder with a ``mriprep/`` clone top in it, and must be the one the README quotes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_shadowing_import_error_is_the_one_the_readme_quotes(tmp_path):
    clone_top = tmp_path / "mriprep"   # a clone's top folder: no __init__.py
    clone_top.mkdir()
    (clone_top / "README.md").write_text("# mriprep\n")
    (clone_top / "pyproject.toml").write_text("")
    done = subprocess.run([sys.executable, "-c", "from mriprep import MRIDataset"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    printed = done.stderr.strip().splitlines()[-1]
    troubleshooting = README.read_text().split("## Troubleshooting", 1)[1]
    quoted = re.findall(r"\*\*`([^`]+)`\*\*", troubleshooting)
    assert printed in quoted, (printed, quoted)
    assert "clone into another" in troubleshooting
