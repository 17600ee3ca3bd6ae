"""``mriprep report``: the static HTML QC report of a cache.

An index page (counts, the cohort's distributions per split, a sortable table of every
cached and failed subject with its metrics and outlier flags) and one page per subject
(its pictures with legends, its quality metrics against the cohort, what each stage did,
its warnings, or the stage and reason of its refusal). Plain files: they open from disk
in any browser, with no server and no network; pictures load lazily, so a report of
1,000 subjects opens at once. By default the report is written into ``CACHE/qc``, beside
the pictures, so that nothing is copied.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import mriprep
from mriprep.core.atomic import atomic_path, write_text
from mriprep.core.errors import CacheError
from mriprep.qc import mosaic
from mriprep.qc.causes import cause_table
from mriprep.qc.check_flags import cohort_check, draw_flags, subject_context
from mriprep.qc.gather import ReportData, ReportSubject, gather
from mriprep.qc.outliers import OUTLIER_Z
from mriprep.qc.store import qc_root

REPORT_INDEX = "index.html"
# Marks a folder as an mriprep QC report, which a new report may overwrite.
REPORT_MARKER = ".mriprep-qc-report"

# How a page names the region the tissue classes were fitted in (TissueMasks.source).
_TISSUE_REGIONS = {
    "label map": "label map's brain (its non-zero labels)",
    "template": "template's brain, mapped onto the scan through the registration",
    "head (no brain mask)": "eroded head (no label map, no registration: scalp and neck "
                            "take part, so read the tissue metrics with care)",
}
PICTURES = {
    "input": ("Native scan", "the input as read, in world orientation (left on the left), "
              "each display pixel its nearest voxel so thick slices look thick; filled "
              "voxels and masked slices coloured"),
    "output": ("Output", "the cached image on its grid; every invalid voxel coloured by "
               "why it is invalid"),
    "template": ("Template outline", "the registration template's brain outline over the "
                 "registered output: an outline that cuts the brain or the skull is a "
                 "misregistration"),
    "labels": ("Labels", "the label map over the output, in FreeSurfer's colours and "
               "names (FastSurfer's DKT table) where the map is numbered as FreeSurfer "
               "numbers labels"),
}


def write_report(cache_root: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 make_missing: bool = True) -> Path:
    """Write the report of a cache; return the index page's path.

    ``make_missing`` makes the QC of entries cached without it, from the cache, and
    stores it in ``CACHE/qc`` (see :func:`mriprep.qc.gather.gather`).

    Raises
    ------
    CacheError
        ``cache_root`` is not a cache, or ``out_dir`` is a folder that holds other
        things than an earlier report (its pages would be replaced).
    """
    data = gather(cache_root, make_missing=make_missing, progress=progress)
    out = Path(out_dir) if out_dir is not None else qc_root(data.cache)
    in_cache = out.resolve() == qc_root(data.cache).resolve()
    if not in_cache and out.is_dir() and any(out.iterdir()) \
            and not (out / REPORT_MARKER).exists():
        raise CacheError(f"{out} is not empty and holds no mriprep QC report; choose an "
                         "empty or new folder for -o (its pages would be replaced)")
    (out / "subjects").mkdir(parents=True, exist_ok=True)
    write_text(out / REPORT_MARKER, "written by `mriprep report`\n")
    if not in_cache:
        _bring_pictures(data, out)
    env = _environment()
    here = Path(__file__).parent / "templates"
    for name in ("report.css", "report.js"):
        write_text(out / name, (here / name).read_text())
    # The index table's columns: the measures declared as columns (the QC's own and the
    # subjects' stages').
    declared = data.declared
    columns = [name for name, metric in declared.items() if metric.column]
    plot = _cohort_plot(data, out, columns)
    # The structures and the last check's findings (the end of a run reads no map).
    check = cohort_check(data.cache, read_maps=make_missing)
    # The flagged regions on the label map, for the entries a fresh record flags.
    draw_flags(data.cache, check, out)
    pages = set()
    for i, subject in enumerate(data.subjects):
        neighbours = dict(previous=data.subjects[i - 1] if i > 0 else None,
                          next=data.subjects[i + 1] if i + 1 < len(data.subjects) else None)
        html = env.get_template("subject.html.j2").render(
            s=subject, **_subject_context(subject, out, declared), **neighbours,
            **subject_context(check.subjects.get(subject.key)), check_made=check.made)
        write_text(out / "subjects" / subject.page, html)
        pages.add(subject.page)
    for stale in (out / "subjects").glob("*.html"):
        if stale.name not in pages:
            stale.unlink(missing_ok=True)  # a concurrent report may have taken it
    index = env.get_template("index.html.j2").render(
        cache=str(data.cache), subjects=data.subjects, problems=data.problems,
        pipelines=dict(data.pipelines),
        made=datetime.datetime.now().isoformat(timespec="seconds"),
        version=mriprep.__version__, threshold=OUTLIER_Z,
        n_cached=sum(s.status == "cached" for s in data.subjects),
        n_failed=sum(s.status == "failed" for s in data.subjects),
        n_flagged=sum(bool(s.outliers) for s in data.subjects),
        n_header=sum(bool(s.header_conflict) for s in data.subjects),
        columns=columns, plot=plot[0] if plot else None,
        metric_info={n: (m.label, m.meaning, m.better) for n, m in declared.items()},
        plot_size=plot[1] if plot else None, fmt=_fmt, number=_number, check=check)
    write_text(out / REPORT_INDEX, index)
    return out / REPORT_INDEX


def _environment():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    return Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                       autoescape=select_autoescape(["html", "j2"]), trim_blocks=True)


def _subject_context(subject: ReportSubject, out: Path,
                     declared: dict[str, Any]) -> dict[str, Any]:
    qc = subject.qc or {}
    legends = qc.get("legends", {})
    pictures = []
    for name, (title, caption) in PICTURES.items():
        if name not in qc.get("images", []):
            continue
        path = out / subject.key / f"{name}.jpg"
        if not path.is_file():
            subject.problems.append(f"picture {name} is missing ({path})")
            continue
        pictures.append(dict(name=name, title=title, caption=caption,
                             src=f"../{subject.key}/{name}.jpg", size=_jpeg_size(path),
                             legend=_legend(name, legends.get(name, []))))
    flags = subject.flagged
    metrics = []
    for name, value in qc.get("metrics", {}).items():
        metric = declared.get(name)
        label, meaning = (metric.label, metric.meaning) if metric is not None else (name, "")
        median, z = subject.cohort.get(name, (math.nan, math.nan))
        place = f"median {_fmt(median)}, z {z:+.1f}" if math.isfinite(z) else ""
        metrics.append((name, label, _measure_text(value, metric), place,
                        flags.get(name, ""), meaning))
    return dict(pictures=pictures, metrics=metrics, notes=qc.get("notes", []),
                tissue_region=qc.get("tissue_region", ""),
                tissue_region_text=_TISSUE_REGIONS.get(qc.get("tissue_region", ""),
                                                       qc.get("tissue_region", "")),
                stages=stage_rows(subject.stage_metrics))


def _legend(picture: str, shown: list[str]) -> list[tuple[str, str, str]]:
    if picture == "labels":
        # Entries of a legend record the colour they were painted in; plain values
        # (a qc.json written before the table was used) were painted from tab20.
        return [(e["colour"], e["name"],
                 str(e["value"]) if e["in_table"] else f"not in {mosaic.LABEL_TABLE_NAME}")
                if isinstance(e, dict) else (mosaic.label_colour(int(e)), f"label {e}", "")
                for e in shown]
    if picture == "template":
        return [(mosaic.OUTLINE_COLOUR, name, "") for name in shown]
    by_name = {c.name: (c.colour, c.meaning) for c in cause_table().values()}
    if not shown:
        text = ("no voxel shown was filled or masked" if picture == "input"
                else "every voxel shown is valid")
        return [("#000000", text, "")]
    return [(by_name[n][0], n, by_name[n][1]) for n in shown if n in by_name]


def stage_rows(stage_metrics: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each stage's metrics as (measure, text) rows a person reads: scalars as they are,
    the slices mask_slices flagged with their reasons, long lists counted."""
    out = []
    for stage, metrics in stage_metrics.items():
        if not isinstance(metrics, dict):
            continue
        rows = []
        for name, value in metrics.items():
            if isinstance(value, dict):
                rows += _nested_rows(name, value)
            else:
                rows.append((name, _text(value)))
        out.append((stage, rows))
    return out


def _nested_rows(name: str, value: dict[str, Any]) -> list[tuple[str, str]]:
    if isinstance(value.get("incomplete"), dict) and isinstance(value.get("artifact"), dict):
        rows = []  # one axis of mask_slices: its slices and why
        if value["incomplete"]:
            rows.append((f"{name}: incomplete slices", ", ".join(
                f"{i} ({kind})" for i, kind in value["incomplete"].items())))
        if value["artifact"]:
            rows.append((f"{name}: artifact slices", ", ".join(
                f"{i} ({_artifact_text(score)})" for i, score in value["artifact"].items())))
        return rows
    return [(f"{name}.{k}", _text(v)) for k, v in value.items() if not isinstance(v, dict)]


def _artifact_text(score: Any) -> str:
    """Why mask_slices called a slice an artifact, from its recorded scores."""
    if not isinstance(score, dict):
        return f"score {_fmt(score)}"
    parts = []
    if isinstance(score.get("log_ratio"), (int, float)):
        parts.append(f"intensity x{math.exp(score['log_ratio']):.2f} its neighbours'")
    if isinstance(score.get("correlation_deficit"), (int, float)):
        parts.append(f"correlation deficit {score['correlation_deficit']:.2f}")
    return ", ".join(parts) or ", ".join(f"{k} {_fmt(v)}" for k, v in score.items())


def _text(value: Any) -> str:
    if isinstance(value, float):
        return _fmt(value)
    if isinstance(value, list):
        if len(value) > 12:
            return f"{len(value)} values"
        return ", ".join(_text(v) for v in value) if value else "none"
    return "–" if value is None else str(value)


def _measure_text(value: Any, metric) -> str:
    """A measure's value as its declaration asks (format spec, unit)."""
    text = _fmt(value)
    if metric is not None and metric.fmt and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        text = format(value, metric.fmt)
    return f"{text} {metric.unit}" if metric is not None and metric.unit and text else text


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):  # FBER over an air of exact zeros
            return "inf" if value > 0 else "-inf"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _number(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return repr(float(value))
    return "NaN"


def _jpeg_size(path: Path) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.size
    except OSError:
        return None


def _cohort_plot(data: ReportData, out: Path, columns: list[str]):
    from mriprep.qc.plots import distributions_png

    cached = [s for s in data.subjects if s.status == "cached" and s.qc is not None]
    values: dict[str, dict[str, list[float]]] = {}
    flagged: dict[str, dict[str, list[bool]]] = {}
    for metric in columns:
        for s in cached:
            v = s.metrics.get(metric)
            if not isinstance(v, (int, float)):
                continue
            values.setdefault(metric, {}).setdefault(s.split, []).append(float(v))
            flagged.setdefault(metric, {}).setdefault(s.split, []).append(
                any(o.metric == metric for o in s.outliers))
    png = distributions_png(values, flagged, {m: data.declared[m].label for m in values})
    path = out / "distributions.png"
    if png is None:
        path.unlink(missing_ok=True)
        return None
    with atomic_path(path) as tmp:
        tmp.write_bytes(png)
    from PIL import Image

    with Image.open(path) as image:
        return path.name, image.size


def _bring_pictures(data: ReportData, out: Path) -> None:
    """Hard-link (else copy) each subject's pictures into a report outside the cache."""
    source_root = qc_root(data.cache)
    for subject in data.subjects:
        if not subject.key or not (source_root / subject.key).is_dir():
            continue
        target = out / subject.key
        target.mkdir(parents=True, exist_ok=True)
        for source in (source_root / subject.key).glob("*.jpg"):
            destination = target / source.name
            # A concurrent run may replace the cache's folder meanwhile: what is gone
            # now shows as a missing picture, and the next report brings it.
            with contextlib.suppress(FileNotFoundError):
                tmp = target / f".{source.name}.{os.getpid()}.tmp"
                tmp.unlink(missing_ok=True)
                try:
                    os.link(source, tmp)
                except OSError:
                    shutil.copy2(source, tmp)
                os.replace(tmp, destination)
