"""The test heads the mask_slices tests share: a 2 mm isotropic scan and a 2x2x5 mm
thick-slice scan of the test person."""

from __future__ import annotations

import pytest

from mriprep.core.volume import Volume


@pytest.fixture(scope="package")
def iso(head_builder) -> Volume:
    return head_builder((2.0, 2.0, 2.0))


@pytest.fixture(scope="package")
def thick(head_builder) -> Volume:
    return head_builder((2.0, 2.0, 5.0), seed=1)
