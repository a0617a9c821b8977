"""``store_fingerprint``: the data version a checkpoint and the ranks' agreement check compare."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

__all__ = ["store_fingerprint"]


def store_fingerprint(store: Any) -> str:
    """The data version of a store: its generation plus a hash of schema and committed chunks.

    Derived from ``meta.json`` content, not the path, so a copied or moved store resumes; any commit
    that changes records (a new generation, or appended chunks) changes it.
    """
    meta = store.meta
    material = {
        "fields": [[f.spec.name, np.dtype(f.spec.dtype).str,
                    None if f.spec.shape is None else list(f.spec.shape), f.spec.codec]
                   for f in meta.fields],
        "chunks": [[c.id, c.field, c.size] for c in meta.chunks],
        "length": meta.length,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return f"store:g{meta.generation}:{digest}"
