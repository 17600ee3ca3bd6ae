"""YAML values against stage parameter types (mriprep.pipelines.params)."""

from typing import Literal

import pytest

from mriprep.pipelines.params import coerce_value


def test_coerce_value_reads_yaml_lists_as_tuples():
    assert coerce_value([1, 2.5, 3], tuple[float, float, float]) == (1.0, 2.5, 3.0)
    assert coerce_value([0, 1, 2, 3], tuple[int, ...]) == (0, 1, 2, 3)
    assert coerce_value(None, int | None) is None
    with pytest.raises(ValueError, match="must be a list"):
        coerce_value(3, tuple[int, ...])


def test_floats_written_as_yaml_text_and_strict_types():
    # PyYAML reads 1e30 (no dot) as a string; a float field takes it, a str field keeps it.
    assert coerce_value("1e30", float) == 1e30
    assert coerce_value("1e30", str) == "1e30"
    assert coerce_value(3, float) == 3.0 and isinstance(coerce_value(3, float), float)
    with pytest.raises(ValueError, match="must be an integer"):
        coerce_value(3.0, int)  # never a float where an int is expected
    with pytest.raises(ValueError, match="must be true or false"):
        coerce_value(1, bool)
    with pytest.raises(ValueError, match="must be one of 'a', 'b'"):
        coerce_value("c", Literal["a", "b"])
