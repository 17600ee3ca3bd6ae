"""An entry's sidecar, ``entries/<key>/meta.json``, as a typed record: :class:`EntrySidecar`.

The worker builds it (:func:`mriprep.run.subject.entry_meta`) and hands its JSON form to
:meth:`mriprep.cache.Cache.write_entry`, which adds ``format_version``, ``key``, ``files``
and ``extra_files``; the QC report and the exports read it back with
:func:`read_sidecar`. The file format does not change by being read: :meth:`to_json` gives
the fields in the order the worker writes them, then every other field as it was read
(what a stage declares for the entry, such as registration's ``template_to_subject``,
and what the cache adds), so the worker's ``meta.json`` is byte for byte what it was
when it wrote a dict, and an entry written by an earlier version reads as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from mriprep.core.errors import CacheError


@dataclass(frozen=True)
class InputFile:
    """One input file of an entry as cached: its path then and its SHA-256."""

    path: str
    sha256: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256}


@dataclass(frozen=True)
class EntrySidecar:
    """The typed fields of ``meta.json`` (see the module docstring).

    ``other`` holds every field this record does not name, in the order read: the
    sidecar fields stages declare (``template_to_subject``, ``transform_file``) and the
    cache's own (``format_version``, ``key``, ``files``, ``extra_files``).
    """

    subject_id: str
    session_id: str
    pipeline_name: str | None
    pipeline_hash: str
    pipeline_source: str | None
    output_dtype: str | None
    inputs: dict[str, InputFile]
    # Which NIfTI form gave the input's geometry, as recorded (None: an entry that
    # predates the choice); :attr:`nifti_form` is what reading the input again uses.
    header: str | None
    affine: np.ndarray | None
    spacing: tuple[float, ...] | None
    shape: tuple[int, ...] | None
    label_values: tuple[int, ...] | None
    provenance: tuple[dict[str, Any], ...]
    mriprep_version: str | None
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any, where: str = "meta.json") -> "EntrySidecar":
        """The record of a sidecar document; ``where`` names the file in errors.

        Raises
        ------
        CacheError
            ``doc`` is not a JSON object, or a field this record needs is malformed.
        """
        if not isinstance(doc, Mapping):
            raise CacheError(f"{where} is not a JSON object; rebuild the entry with "
                             "`mriprep run --force` (`mriprep check` lists every such entry)")
        try:
            inputs = {str(role): InputFile(str(v.get("path") or ""), v.get("sha256"))
                      for role, v in (doc.get("inputs") or {}).items() if isinstance(v, Mapping)}
            affine = doc.get("affine")
            record = cls(
                subject_id=str(doc.get("subject_id") or ""),
                session_id=str(doc.get("session_id") or ""),
                pipeline_name=doc.get("pipeline_name"),
                pipeline_hash=str(doc.get("pipeline_hash") or ""),
                pipeline_source=doc.get("pipeline_source"),
                output_dtype=doc.get("output_dtype"),
                inputs=inputs,
                header=doc.get("header"),
                affine=None if affine is None else np.asarray(affine, dtype=np.float64),
                spacing=_tuple(doc.get("spacing"), float),
                shape=_tuple(doc.get("shape"), int),
                label_values=_tuple(doc.get("label_values"), int),
                provenance=tuple(doc.get("provenance") or ()),
                mriprep_version=doc.get("mriprep_version"),
                other={k: v for k, v in doc.items() if k not in _NAMED},
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise CacheError(f"{where} holds a malformed field ({type(exc).__name__}: "
                             f"{exc}); rebuild the entry with `mriprep run --force`") from exc
        return record

    def to_json(self) -> dict[str, Any]:
        """The sidecar document, fields in the order the worker writes them."""
        doc = {
            "subject_id": self.subject_id,
            "session_id": self.session_id,
            "pipeline_name": self.pipeline_name,
            "pipeline_hash": self.pipeline_hash,
            "pipeline_source": self.pipeline_source,
            "output_dtype": self.output_dtype,
            "inputs": {role: f.to_json() for role, f in self.inputs.items()},
            "header": self.header,
            "affine": None if self.affine is None else self.affine.tolist(),
            "spacing": None if self.spacing is None else list(self.spacing),
            "shape": None if self.shape is None else list(self.shape),
            "label_values": None if self.label_values is None else list(self.label_values),
            "provenance": list(self.provenance),
            "mriprep_version": self.mriprep_version,
        }
        doc.update(self.other)
        return doc

    @property
    def nifti_form(self) -> str:
        """The header form to read the input with again: ``qform``, ``sform`` or
        ``auto`` (FastSurfer's rule, what an entry that recorded none was read with)."""
        return self.header if self.header in ("qform", "sform") else "auto"

    @property
    def records(self) -> list[Mapping[str, Any]]:
        """The well-formed stage records of :attr:`provenance` (``stage``, ``params``,
        ``metrics``, ``warnings``, ``seconds``)."""
        return [r for r in self.provenance if isinstance(r, Mapping) and "stage" in r]

    @property
    def template_to_subject(self) -> np.ndarray | None:
        """The applied registration (RAS+, template world to subject world), when a
        stage recorded one."""
        value = self.other.get("template_to_subject")
        return None if value is None else np.asarray(value, dtype=np.float64)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """The tensors the cache wrote for the entry (``image``, ``valid``, ``label``)."""
        files = self.other.get("files")
        return tuple(files) if isinstance(files, Mapping) else ()


def read_sidecar(cache, key: str) -> EntrySidecar:
    """The sidecar of entry ``key`` of ``cache`` (a :class:`mriprep.cache.Cache`).

    Raises
    ------
    CacheError
        The entry has no readable ``meta.json``, or it is malformed.
    """
    return EntrySidecar.from_json(cache.read_meta(key),
                                  where=str(cache.entry_dir(key) / "meta.json"))


_NAMED = {"subject_id", "session_id", "pipeline_name", "pipeline_hash", "pipeline_source",
          "output_dtype", "inputs", "header", "affine", "spacing", "shape", "label_values",
          "provenance", "mriprep_version"}


def _tuple(value: Any, kind: type) -> tuple | None:
    return None if value is None else tuple(kind(v) for v in value)
