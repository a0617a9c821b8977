"""headrace: a bounded-memory, deterministic data runtime for ML training.

One public door: every public name is listed in ``_EXPORTS`` (name -> private module) and imported
on first use, so ``import headrace`` stays cheap and never pulls in torch, jax or an S3 SDK. The
framework adapters are the submodules ``headrace.jax`` and ``headrace.torch``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> private module that defines it. Keep sorted; tests/test_public_api.py pins the list.
_EXPORTS: dict[str, str] = {
    "AudioLoader": "_audio_loader",
    "CheckpointError": "_errors",
    "ConfigError": "_errors",
    "Constraints": "_config",
    "CorruptionError": "_errors",
    "DataLoader": "_compat_loaderx",
    "Dataset": "_dataset",
    "DecodeError": "_errors",
    "DistributedDataLoader": "_dist",
    "FieldSpec": "_format",
    "FormatVersionError": "_errors",
    "HeadraceError": "_errors",
    "ImageLoader": "_image_loader",
    "LinkError": "_errors",
    "Loader": "_loader",
    "LoaderError": "_errors",
    "MemoryCapError": "_errors",
    "MixedLoader": "_mix",
    "NotAStoreError": "_errors",
    "PackWorkerError": "_errors",
    "Ragged": "_store",
    "RecordIndexError": "_errors",
    "RecordTooLargeError": "_errors",
    "RemoteError": "_errors",
    "RuntimeConfig": "_config",
    "Sampler": "_sampler",
    "SchemaError": "_errors",
    "Store": "_store",
    "StoreError": "_errors",
    "StoreExistsError": "_errors",
    "StoreFullError": "_errors",
    "TextLoader": "_text_loader",
    "VideoLoader": "_video_loader",
    "Writer": "_writer",
    "WriterBusyError": "_errors",
    "WriterClosedError": "_errors",
    "audio": "_audio_loader",
    "create": "_writer",
    "image": "_image_loader",
    "load": "_load",
    "mix": "_mix",
    "open": "_store",
    "pack": "_pack",
    "pack_arrays": "_pack_arrays",
    "pack_dir": "_pack_dir",
    "pack_text": "_pack_text",
    "plot": "_plot",
    "resolve": "_resolve",
    "resolve_manifest_hash": "_resolve",
    "run": "_run",
    "stats": "_stats",
    "text": "_text_loader",
    "verify": "_verify",
    "video": "_video_loader",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'headrace' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"headrace.{module}"), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return __all__
