"""The template cache the training tests share (see :mod:`tests.training.template_cache`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.template_cache import build_template_cache


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return build_template_cache(tmp_path_factory.mktemp("cache") / "c")
