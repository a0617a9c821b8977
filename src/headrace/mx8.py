"""mx8 1.0.7's Python API over headrace: ``import headrace.mx8 as mx8``.

Every name of mx8's ``__all__``, as thin configurations of headrace's own loaders
(``headrace._compat.mx8*``); what changes is in ``docs/migration-mx8.md``.
"""

from __future__ import annotations

from headrace._compat import mx8_internal as _internal
from headrace._compat.mx8 import (
    CoordinatorHandle,
    DataLoader,
    DistributedDataLoader,
    ImageLoader,
    coordinator,
    image,
    load,
    pack,
    pack_dir,
    resolve,
    resolve_manifest_hash,
    run,
    stats,
)
from headrace._compat.mx8_batch import AudioBatch, PyBatch, TextBatch, VideoBatch
from headrace._compat.mx8_mix import MixedDataLoader, mix
from headrace._compat.mx8_modal import AudioLoader, TextLoader, VideoDataLoader, audio, text, video
from headrace._engine.config import Constraints, RuntimeConfig

# mx8 1.0.7's __all__ (sorted)
__all__ = [
    "AudioBatch",
    "AudioLoader",
    "Constraints",
    "CoordinatorHandle",
    "DataLoader",
    "DistributedDataLoader",
    "ImageLoader",
    "MixedDataLoader",
    "PyBatch",
    "RuntimeConfig",
    "TextBatch",
    "TextLoader",
    "VideoBatch",
    "VideoDataLoader",
    "_internal",
    "audio",
    "coordinator",
    "image",
    "load",
    "mix",
    "pack",
    "pack_dir",
    "resolve",
    "resolve_manifest_hash",
    "run",
    "stats",
    "text",
    "video",
]
