"""A YAML value checked against a stage parameter's type: the pipeline file's schema.

Stage parameters are frozen dataclass fields; their annotations are the schema. This
module turns what ``yaml.safe_load`` gives into a value of that type, or says what was
expected. Supported: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` of strings,
``tuple[T, T, T]``, ``tuple[T, ...]`` and ``X | None`` of those.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal

# YAML 1.1 (PyYAML) reads `1e30` as a string because it lacks a dot; a float field
# accepts such text so that users can write limits the way they write them everywhere.
_FLOAT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def coerce_value(value: Any, annotation: Any) -> Any:
    """Check a YAML value against a parameter field's type and return it in that type.

    Supported types: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``,
    ``tuple[T, T, T]``, ``tuple[T, ...]`` and ``X | None``. A YAML list becomes a tuple;
    an int is accepted where a float is expected, never the reverse.

    Raises
    ------
    ValueError
        Saying what was expected (the caller adds the key and the file).
    """
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return coerce_value(value, option)
            except ValueError:
                continue
        allowed = " or ".join(_describe(a) for a in args)
        raise ValueError(f"must be {allowed}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"must be one of {', '.join(repr(a) for a in args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"must be a list: {_describe(annotation)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce_value(v, args[0]) for v in value)
        if len(value) != len(args):
            raise ValueError(f"must be a list of {len(args)} values: {_describe(annotation)}")
        return tuple(coerce_value(v, a) for v, a in zip(value, args))
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        return value
    if annotation is float:
        if isinstance(value, bool):
            raise ValueError("must be a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):
            return float(value)
        raise ValueError("must be a number")
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError("must be a string (quote it in YAML)")
        return value
    raise ValueError(f"has a type mriprep cannot read from YAML ({annotation!r})")


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"[{_describe(args[0])}, ...]"
        return "[" + ", ".join(_describe(a) for a in args) + "]"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    return {bool: "true/false", int: "integer", float: "number", str: "string"}.get(
        annotation, repr(annotation)
    )
