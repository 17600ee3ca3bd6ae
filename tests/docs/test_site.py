"""The documentation site (`make docs`): it builds with warnings as errors, it documents
every command, option and public name, the commands it shows are commands mriprep takes,
and it renders in a browser.

The site is built once for this module, into a temporary folder (never the working
tree's site/), by the same `mkdocs build --strict` that `make docs` runs.
"""

from __future__ import annotations

import argparse
import html
import importlib
import inspect
import os
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import mriprep
from mriprep.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")
README_MAX_LINES = 250

# One worker builds the site for every test here.
pytestmark = pytest.mark.xdist_group("docs_site")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: install the docs extra "
                    "(pip install -c constraints.txt -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert done.returncode == 0 and not warnings, (
        "mkdocs build --strict failed:\n" + "\n".join(warnings or done.stderr.splitlines()[-20:]))
    return out


def page_text(path: Path) -> str:
    """A built page's visible text, tags dropped and entities decoded."""
    raw = path.read_text(encoding="utf-8")
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def commands(parser: argparse.ArgumentParser, path=("mriprep",)):
    """(command path, its long options) for every command and subcommand of `mriprep`."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = sorted(o for a in parser._actions for o in a.option_strings
                     if o.startswith("--") and o != "--help")
    yield " ".join(path), options
    for action in subparsers:
        for name, child in action.choices.items():
            yield from commands(child, (*path, name))


def public_packages() -> dict[str, list[str]]:
    """Every mriprep package that declares __all__, with its names (the CLI excepted)."""
    found = {"mriprep": list(mriprep.__all__)}
    for info in pkgutil.walk_packages(mriprep.__path__, "mriprep."):
        if not info.ispkg or info.name.startswith("mriprep.cli"):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__"):
            found[info.name] = list(module.__all__)
    return found


def test_every_command_and_option_is_on_the_cli_pages(site):
    cli = page_text(site / "cli" / "index.html")
    everywhere = " ".join(page_text(p) for p in site.rglob("*.html"))
    walked = list(commands(build_parser()))
    assert len(walked) > 10  # the walk reached the subcommands
    missing_commands = [path for path, _ in walked if path != "mriprep" and path not in cli]
    assert missing_commands == [], "commands missing from docs/cli.md"
    missing_options = [f"{path} {option}" for path, options in walked for option in options
                       if option not in everywhere]
    assert missing_options == [], "options documented on no page of docs/"


def test_every_public_name_has_its_entry_in_the_api_reference(site):
    missing = []
    for package, names in public_packages().items():
        short = package.removeprefix("mriprep.") if package != "mriprep" else "mriprep"
        page = site / "api" / short / "index.html"
        if not page.exists():
            missing.append(f"{package}: no page docs/api/{short}.md")
            continue
        raw = page.read_text(encoding="utf-8")
        anchors = set(re.findall(r'id="([^"]+)"', raw))
        text = page_text(page)
        for name in names:
            # The root's names are training's, imported lazily: named on its page.
            if f"{package}.{name}" not in anchors and not (package == "mriprep" and name in text):
                missing.append(f"{package}.{name}")
    assert missing == []


def test_the_commands_the_readme_and_the_pages_show_are_commands_mriprep_takes():
    parser = build_parser()
    shown = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", doc.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if not line.startswith("mriprep "):
                    continue
                words = shlex.split(line, comments=True)
                for stop in ("||", "|", "&&", ";"):
                    if stop in words:
                        words = words[:words.index(stop)]
                if words[:1] == ["mriprep"]:
                    shown.append((doc.name, words))
    assert len(shown) > 20
    refused = []
    for doc, words in shown:
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            refused.append(f"{doc}: {' '.join(words)}")
    assert refused == []


def test_the_readme_opens_with_the_result_then_the_users_own_data():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    # The outcome bench's table, its picture and the command that makes them come first
    # (issue 46); the user's own data follows within the first two screens.
    result = "\n".join(lines[:lines.index("## Your own data")])
    assert "docs/img/outcome.png" in result and "bench_outcome.py" in result
    assert (ROOT / "docs" / "img" / "outcome.png").is_file()
    first_screen = "\n".join(lines[:75])
    assert "## Your own data" in first_screen
    for way in ("manifest from-bids", "manifest from-freesurfer", "manifest validate",
                "mriprep run", "mriprep check"):
        assert way in first_screen, way
    readme = "\n".join(lines)
    for everyday in ("mriprep report", "MRIDataset", "make_dataloader", "make demo",
                     "make test", "(unknown location)"):
        assert everyday in readme, everyday


def test_every_benchmark_row_is_short_and_has_its_paragraph():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    header = "| # | what | ours | reference | ratio | date |"
    assert header in text
    rows = []
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    assert len(rows) > 30
    for number, row in enumerate(rows, 1):
        assert len(row) == 6 and row[0] == str(number), row
        assert max(len(cell) for cell in row) <= 120, f"row {number}: a cell over 120 characters"
        assert re.fullmatch(r"(\d{4}-\d\d-\d\d(/\d\d)?\u2020?)?", row[5]), f"row {number}'s date"
        assert f"\n**{number}.** " in text, f"row {number} has no paragraph"


def test_the_site_renders_in_chromium(site):
    from tests.qc.browser import chromium_driver

    with chromium_driver() as driver:
        driver.get((site / "index.html").as_uri())
        assert driver.title.startswith("mriprep")
        assert "Your own data" in driver.find_element("tag name", "body").text
        driver.get((site / "api" / "training" / "index.html").as_uri())
        assert "mriprep.training" in driver.title
        body = driver.find_element("tag name", "body").text
        # Imported here: `import mriprep` leaves the training package (and torch) out.
        training = importlib.import_module("mriprep.training")
        first_line = inspect.getdoc(training.MRIDataset).splitlines()[0]
        assert first_line in body
        assert "make_dataloader" in body
