"""``ObjectFile``: one S3 object as a seekable, read-only binary file, read by byte ranges.

Readers written for files (pyarrow's Parquet reader, ``tarfile``) can then read objects without
downloading them whole: a Parquet footer and one row group at a time, a tar shard front to back.
Every read is a ranged GET through :class:`~headrace._remote.objstore.ObjectStore` (its retries),
so memory holds at most one read, plus the ``io.BufferedReader`` window that :func:`open_object`
puts in front to turn small reads (tar headers, Thrift footers) into few requests.
"""

from __future__ import annotations

import io
from typing import Any

from headrace._remote.objstore import ObjectStore

__all__ = ["ObjectFile", "open_object"]

# Reads smaller than this are served from one buffered ranged GET.
DEFAULT_BUFFER = 8 << 20


class ObjectFile(io.RawIOBase):
    """Bytes of ``s3://<bucket>/<key>`` (``size`` bytes long, as listed) by ranged GETs."""

    def __init__(self, client: ObjectStore, key: str, size: int) -> None:
        self.client = client
        self.key = key
        self.size = int(size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        pos = base + int(offset)
        if pos < 0:
            raise ValueError(f"negative seek position {pos} in {self.client.url(self.key)}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        end = min(self.size, self._pos + view.nbytes)
        if end <= self._pos:
            return 0
        data = self.client.get_range(self.key, self._pos, end)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def __repr__(self) -> str:
        return f"ObjectFile({self.client.url(self.key)!r}, size={self.size})"


def open_object(client: ObjectStore, key: str, size: int, *,
                buffer_size: int = DEFAULT_BUFFER) -> io.BufferedReader:
    """A buffered, seekable reader of one object (close it when done)."""
    return io.BufferedReader(ObjectFile(client, key, size), buffer_size=buffer_size)
