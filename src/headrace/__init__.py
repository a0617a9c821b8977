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
    "AudioLoader": "_modal.audio",
    "CheckpointError": "_base.errors",
    "ConfigError": "_base.errors",
    "Constraints": "_engine.config",
    "CorruptionError": "_base.errors",
    "DataLoader": "_compat.loaderx",
    "Dataset": "_compat.dataset",
    "DecodeError": "_base.errors",
    "DistributedDataLoader": "_multi.dist",
    "FieldSpec": "_store.format",
    "FormatVersionError": "_base.errors",
    "HeadraceError": "_base.errors",
    "ImageLoader": "_modal.image",
    "LinkError": "_base.errors",
    "Loader": "_engine.loader",
    "LoaderError": "_base.errors",
    "MemoryCapError": "_base.errors",
    "MixedLoader": "_multi.mix",
    "NotAStoreError": "_base.errors",
    "PackWorkerError": "_base.errors",
    "Ragged": "_store.reader",
    "RecordIndexError": "_base.errors",
    "RecordTooLargeError": "_base.errors",
    "RemoteError": "_base.errors",
    "RuntimeConfig": "_engine.config",
    "Sampler": "_order.sampler",
    "SchemaError": "_base.errors",
    "Store": "_store.reader",
    "StoreError": "_base.errors",
    "StoreExistsError": "_base.errors",
    "StoreFullError": "_base.errors",
    "TextLoader": "_modal.text",
    "VideoLoader": "_modal.video",
    "Writer": "_store.writer",
    "WriterBusyError": "_base.errors",
    "WriterClosedError": "_base.errors",
    "audio": "_modal.audio",
    "create": "_store.writer",
    "image": "_modal.image",
    "load": "_engine.load",
    "mix": "_multi.mix",
    "open": "_remote.open_store",
    "pack": "_pack.files",
    "pack_arrays": "_pack.arrays",
    "pack_arrow": "_pack.arrow",
    "pack_dir": "_pack.dirs",
    "pack_text": "_pack.text",
    "pack_webdataset": "_pack.webdataset",
    "plot": "_engine.plot",
    "resolve": "_remote.resolve",
    "resolve_manifest_hash": "_remote.resolve",
    "run": "_multi.run",
    "stats": "_engine.stats",
    "text": "_modal.text",
    "verify": "_store.verify",
    "video": "_modal.video",
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
