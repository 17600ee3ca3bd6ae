"""Keeping a cache sound over its life: list it, prune it, rebuild its index.

* :mod:`~mriprep.maintenance.inventory`: what the cache holds, indexed or not, and its
  size (``mriprep cache ls``);
* :mod:`~mriprep.maintenance.prune`: a plan of what to remove (entries not in a
  manifest, of another pipeline, or no longer indexed) shown before it is applied
  (``mriprep cache prune``);
* :mod:`~mriprep.maintenance.repair`: the index rebuilt from the entries' own sidecars,
  each entry verified and a damaged one moved to quarantine (``mriprep cache repair``;
  ``mriprep run`` calls it on a damaged index).

``mriprep cache verify`` is the integrity part of ``mriprep check``
(:func:`mriprep.check.verify_cache`).
"""

from mriprep.maintenance.inventory import Inventory, ListedEntry, take_inventory
from mriprep.maintenance.prune import PrunePlan, apply_prune, plan_prune
from mriprep.maintenance.repair import QUARANTINE_DIR, RepairReport, repair_index

__all__ = [
    "Inventory", "ListedEntry", "PrunePlan", "QUARANTINE_DIR", "RepairReport", "apply_prune",
    "plan_prune", "repair_index", "take_inventory",
]
