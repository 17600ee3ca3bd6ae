"""Input phase: what a cohort is before any stage runs.

Manifests (CSV, or written from BIDS), image and label readers with their header checks,
and the registration templates.
"""
