"""The measures the QC report shows: the QC's own, and those the stages declare.

The QC measures the native scan itself (the image-quality metrics of
:mod:`mriprep.qc.metrics`, which follow MRIQC) and the output's invalid fraction; these
are declared here. Every other measure is a stage's
(:class:`~mriprep.stages.qc_declaration.QCMetric`), and its declaration travels in the
subject's ``qc.json`` (``metric_info``), so that the report and ``mriprep check`` know its
label and how to judge it without importing the stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from mriprep.stages.qc_declaration import QCMetric

# The smallest difference from the cohort's median that matters, per measure, in its
# unit: set between the largest difference of clean scans and the smallest of the planted
# defects the z finds (make bench, report section 5, prints both beside these).
MIN_EFFECT = {
    "snr_total": 2.0, "snr_wm": 2.5, "snr_gm": 2.0, "snr_csf": 2.0, "snr_dietrich": 2.0,
    "cnr": 0.4, "cjv": 0.125, "efc": 0.05, "fber": 500.0, "wm2max": 0.1,
    "invalid_fraction": 0.12,
}

OWN_METRICS: tuple[QCMetric, ...] = (
    QCMetric("snr_total", "SNR", "tissue signal-to-noise: mean over CSF, GM and WM of "
             "median/sd within the class", better="higher", column=True,
             min_effect=MIN_EFFECT["snr_total"]),
    QCMetric("snr_wm", "SNR WM", "white-matter median over its standard deviation",
             better="higher", min_effect=MIN_EFFECT["snr_wm"]),
    QCMetric("snr_gm", "SNR GM", "grey-matter median over its standard deviation",
             better="higher", min_effect=MIN_EFFECT["snr_gm"]),
    QCMetric("snr_csf", "SNR CSF", "CSF median over its standard deviation", better="higher",
             min_effect=MIN_EFFECT["snr_csf"]),
    QCMetric("snr_dietrich", "SNR (air)", "white-matter mean over the noise measured in the "
             "air (Dietrich)", better="higher", column=True,
             min_effect=MIN_EFFECT["snr_dietrich"]),
    QCMetric("cnr", "CNR", "WM-GM contrast over the noise of air, WM and GM together",
             better="higher", column=True, min_effect=MIN_EFFECT["cnr"]),
    QCMetric("cjv", "CJV", "coefficient of joint variation of WM and GM: overlap of the two "
             "intensity distributions", better="lower", column=True,
             min_effect=MIN_EFFECT["cjv"], bounds=(0.0, None)),
    QCMetric("efc", "EFC", "entropy focus criterion: 1 for energy spread evenly (ghosting, "
             "blur), lower when focused", better="lower", column=True,
             min_effect=MIN_EFFECT["efc"]),
    QCMetric("fber", "FBER", "median energy of the head over that of the air (MRIQC's; the "
             "air's exact zeros, padding, left out; n/a when the air is all zeros)",
             better="higher", column=True, min_effect=MIN_EFFECT["fber"]),
    QCMetric("wm2max", "WM2MAX", "white-matter median over the 99.95th percentile: near 1 "
             "means the range is set by WM, low means bright outliers",
             better="near 0.6-0.8", column=True, min_effect=MIN_EFFECT["wm2max"],
             bounds=(0.0, None)),
    # The field of view, not the scan's quality: not judged.
    QCMetric("head_fraction", "head fraction", "share of the field of view inside the head",
             judge="none"),
    QCMetric("air_voxels", "air voxels", "voxels measured as air (the noise estimate's "
             "sample, every other voxel per axis; exact zeros, padding, left out)",
             unit="voxels", judge="none"),
    # What the pipeline could not measure: less than the cohort is never a problem.
    QCMetric("invalid_fraction", "invalid", "share of the output's voxels that are not "
             "measurements (filled, masked, outside the scan)", better="lower", judge="high",
             column=True, min_effect=MIN_EFFECT["invalid_fraction"], bounds=(0.0, 1.0)),
)
OWN = {m.name: m for m in OWN_METRICS}


def declared_metrics(docs: Iterable[Mapping[str, Any] | None]) -> dict[str, QCMetric]:
    """Name -> declaration of every measure: the QC's own, then those the subjects'
    ``qc.json`` documents carry (the first declaration of a name wins)."""
    out = dict(OWN)
    for doc in docs:
        info = (doc or {}).get("metric_info")
        if not isinstance(info, Mapping):
            continue  # made before stages declared their measures: shown by name
        for name, declared in info.items():
            if name not in out and isinstance(declared, Mapping):
                out[name] = QCMetric.from_json(name, declared)
    return out


def with_stage_declarations(declared: Mapping[str, QCMetric],
                            names: Iterable[str]) -> dict[str, QCMetric]:
    """``declared``, completed from the registered stages' declarations for the measures
    among ``names`` it lacks (``qc.json`` made before the stages declared them) or, for a
    judged measure, whose declaration lacks its minimum effect and bounds (made before
    those were declared).
    The stage modules are imported only when something is missing."""
    from mriprep.stages import all_stages

    out = dict(declared)
    missing = {n for n in names if n not in out
               or (out[n].min_effect is None and out[n].judge != "none")}
    if missing:
        for stage in all_stages():
            for metric in stage.qc.metrics if stage.qc is not None else ():
                if metric.name not in missing:
                    continue
                if metric.name not in out:
                    out[metric.name] = metric
                elif out[metric.name].min_effect is None:
                    out[metric.name] = dataclasses.replace(
                        out[metric.name], min_effect=metric.min_effect, bounds=metric.bounds)
    return out
