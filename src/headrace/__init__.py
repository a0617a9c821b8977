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
    "CheckpointError": "_errors",
    "ConfigError": "_errors",
    "CorruptionError": "_errors",
    "DecodeError": "_errors",
    "FormatVersionError": "_errors",
    "HeadraceError": "_errors",
    "LinkError": "_errors",
    "LoaderError": "_errors",
    "NotAStoreError": "_errors",
    "RecordIndexError": "_errors",
    "RecordTooLargeError": "_errors",
    "RemoteError": "_errors",
    "SchemaError": "_errors",
    "StoreError": "_errors",
    "StoreExistsError": "_errors",
    "StoreFullError": "_errors",
    "WriterBusyError": "_errors",
    "WriterClosedError": "_errors",
    "resolve": "_resolve",
    "resolve_manifest_hash": "_resolve",
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
