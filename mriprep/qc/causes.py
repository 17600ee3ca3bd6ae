"""The causes of invalid voxels the QC pictures colour, and their codes in cause maps.

The stages declare the causes of what they invalidate
(:class:`~mriprep.stages.qc_declaration.InvalidCause`: "filled", "incomplete slice",
...); the QC adds its own three: another stage's invalid voxels that declare no cause,
voxels outside the input's field of view, and invalid voxels whose cause a report made
from the cache could not find again. A cause map (:mod:`mriprep.qc.capture`) holds one
uint8 code per voxel: 1, 2, ... for the declared causes in the order of
:func:`mriprep.stages.all_stages`, and the QC's own at the top of the range, so a legend
sorted by code lists the stages' causes first. Codes live in one process only: what is
stored (``qc.json``'s legends) is the causes' names.
"""

from __future__ import annotations

from mriprep.stages.qc_declaration import InvalidCause

OTHER, OUTSIDE, UNRECORDED = 253, 254, 255
_OWN = {
    OTHER: InvalidCause("other invalid", "marked invalid by another stage", "#ff3030", "red"),
    OUTSIDE: InvalidCause("outside the scan",
                          "no measurement: outside the input's field of view", "#3b6cff",
                          "blue"),
    UNRECORDED: InvalidCause("invalid", "invalid, cause not recorded (QC made from the cache)",
                             "#ffee00", "yellow"),
}
_tables: dict[tuple[str, ...], dict[int, InvalidCause]] = {}


def cause_table() -> dict[int, InvalidCause]:
    """Code -> cause: every registered stage's declared causes, then the QC's own."""
    from mriprep.stages import all_stages

    stages = all_stages()
    signature = tuple(s.name for s in stages)
    if signature not in _tables:  # a stage registered since (a plugin's) adds its causes
        declared: dict[str, InvalidCause] = {}
        for stage in stages:
            for cause in stage.qc.causes if stage.qc is not None else ():
                declared.setdefault(cause.name, cause)
        if len(declared) >= OTHER:
            raise ValueError(f"{len(declared)} declared causes of invalid voxels do not "
                             f"fit a uint8 cause map beside the QC's own three")
        table = {code: cause for code, cause in enumerate(declared.values(), start=1)}
        _tables[signature] = {**table, **_OWN}
    return _tables[signature]


def cause_codes() -> dict[str, int]:
    """Cause name -> its code."""
    return {cause.name: code for code, cause in cause_table().items()}


def not_finite_code() -> int:
    """The code of the cause declared for voxels not finite as read (NaN, Inf), or
    :data:`OTHER` when no stage declares one."""
    return next((code for code, cause in cause_table().items() if cause.not_finite_input),
                OTHER)


def cause_names(codes) -> list[str]:
    """The names of ``codes``, in code order (a legend)."""
    table = cause_table()
    return [table[c].name for c in sorted(codes) if c in table]
