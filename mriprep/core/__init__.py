"""The vocabulary every phase shares: errors, exit codes, findings, hashing, numeric
limits, atomic writes, and the in-memory :class:`~mriprep.core.volume.Volume` that flows
from the readers through the stages to the cache."""
