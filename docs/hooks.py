"""MkDocs hook: the site's home page is the repository's README.md.

One text for both: GitHub shows README.md, the site shows it as index.md, with its
links into docs/ rewritten to the site's pages.
"""

from __future__ import annotations

import re
from pathlib import Path


def readme_as_home(readme: str) -> str:
    """README.md's text with its links to ``docs/PAGE`` made relative to the site's root."""
    text = re.sub(r"\]\(docs/\)", "](index.md)", readme)
    return re.sub(r"\]\(docs/([^)]*)\)", r"](\1)", text)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config["config_file_path"]).parent / "README.md"
    return readme_as_home(readme.read_text(encoding="utf-8"))
