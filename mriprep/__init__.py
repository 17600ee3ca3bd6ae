"""mriprep: MRI preprocessing and data-quality pipeline for CNN training.

The training-side API is importable from the package root::

    from mriprep import MRIDataset, make_dataloader
"""

__version__ = "0.8.1"

__all__ = ["MRIDataset", "make_dataloader", "__version__"]


def __getattr__(name):
    # Lazy so that `import mriprep` (and the CLI) does not import torch.
    if name in ("MRIDataset", "make_dataloader"):
        from mriprep import training as data

        return getattr(data, name)
    raise AttributeError(f"module 'mriprep' has no attribute {name!r}")
