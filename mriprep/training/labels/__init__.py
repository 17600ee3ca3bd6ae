"""Label maps as FastSurfer-style training needs them: lookup tables, classes per view,
weight maps and thick 2.5D slices (see docs/fastsurfer.md)."""

from mriprep.training.labels.lut import Lut, read_lut
from mriprep.training.labels.table import VIEWS, LabelTable, Mapped, dkt_table, load_table

__all__ = ["Lut", "read_lut", "VIEWS", "LabelTable", "Mapped", "dkt_table", "load_table"]
