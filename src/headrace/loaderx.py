"""``import headrace.loaderx as loaderx``: the loaderx names, on headrace's engine.

loaderx 0.4.1's ``Dataset``, ``DataLoader`` and ``Sampler`` (the same objects as
``headrace.Dataset`` / ``headrace.DataLoader`` / ``headrace.Sampler``), and loaderx 2.8.19's
zrecord containers read in place: ``DenseStore``, ``RaggedStore`` (and their ``RaggedBatch``),
so data a 2.8.19 program wrote loads without conversion. ``convert_zrecord`` turns containers
into a headrace store when the store's features are wanted (checksums, appends, edits, S3).

``docs/migration-loaderx.md`` lists what differs from loaderx and why.
"""

from __future__ import annotations

from headrace._compat.dataset import Dataset
from headrace._compat.loaderx import DataLoader
from headrace._compat.zrecord import DenseStore, DenseView, RaggedBatch, RaggedStore, RaggedView
from headrace._order.sampler import Sampler
from headrace._pack.zrecord import convert_zrecord

__all__ = ["DataLoader", "Dataset", "DenseStore", "DenseView", "RaggedBatch", "RaggedStore",
           "RaggedView", "Sampler", "convert_zrecord"]
