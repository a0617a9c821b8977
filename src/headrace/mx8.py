"""mx8 1.0.7's Python API over headrace: ``import headrace.mx8 as mx8``.

Thin configurations of headrace's own loaders (``headrace._compat.mx8``); what changes is in
``docs/migration-mx8.md``. Not yet here from mx8's ``__all__``: ``text``, ``audio``, ``video``,
``mix``, ``pack``, their loader classes and ``_internal`` (use ``headrace.text`` etc.).
"""

from __future__ import annotations

from headrace._compat.mx8 import (
    CoordinatorHandle,
    DataLoader,
    DistributedDataLoader,
    coordinator,
    image,
    load,
    pack_dir,
    resolve,
    resolve_manifest_hash,
    run,
    stats,
)
from headrace._compat.mx8_batch import AudioBatch, PyBatch, TextBatch, VideoBatch
from headrace._engine.config import Constraints, RuntimeConfig
from headrace._modal.image import ImageLoader

__all__ = ["AudioBatch", "Constraints", "CoordinatorHandle", "DataLoader",
           "DistributedDataLoader", "ImageLoader", "PyBatch", "RuntimeConfig", "TextBatch",
           "VideoBatch", "coordinator", "image", "load", "pack_dir", "resolve",
           "resolve_manifest_hash", "run", "stats"]
