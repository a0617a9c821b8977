"""The exception hierarchy of headrace.

Every error headrace raises on purpose is a ``HeadraceError``. Most also derive from the builtin a
caller would naturally catch (``ValueError`` for bad arguments, ``IndexError`` for out-of-range ids,
``FileNotFoundError`` for a missing store, ``OSError`` for a full disk), so code written against
NumPy-style or mx8/loaderx-style errors keeps working.

::

    HeadraceError
    ├── ConfigError (ValueError)            a knob has a bad value; the message names it and the fix
    ├── StoreError                          anything about an on-disk/remote record store
    │   ├── NotAStoreError (FileNotFoundError)  the path holds no meta.json / is not a store
    │   ├── FormatVersionError              written by a newer headrace; upgrade to read it
    │   ├── StoreExistsError (FileExistsError)  create() into a non-empty directory
    │   ├── WriterBusyError                 another writer holds the store's lock
    │   ├── WriterClosedError               a writer used after close() or after a failed write
    │   ├── SchemaError (ValueError)        unknown codec, dtype/shape mismatch, unknown field
    │   │   └── RecordTooLargeError         a record over the 4 GiB format limit
    │   ├── StoreFullError (OSError)        the disk filled up during a write; nothing was committed
    │   └── CorruptionError                 bytes on disk do not match their checksum / bounds
    ├── RecordIndexError (IndexError)       a record id outside [0, N)
    ├── CheckpointError (ValueError)        a resume token that does not fit this loader
    ├── LoaderError (RuntimeError)          a worker or transform failed; ``record_ids`` attached
    ├── MemoryCapError (MemoryError)        the process stays over its RSS cap with nothing in flight
    ├── DecodeError (ValueError)            an image/audio/video payload could not be decoded
    ├── LinkError (ValueError)              a dataset link or manifest snapshot problem
    ├── PackWorkerError (RuntimeError)      a parallel pack task raised or its worker died
    └── RemoteError (OSError)               an object-store request failed after all retries
"""

from __future__ import annotations

from collections.abc import Sequence


class HeadraceError(Exception):
    """Base class of every error headrace raises on purpose."""


class ConfigError(HeadraceError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class StoreError(HeadraceError):
    """A problem with a record store."""


class NotAStoreError(StoreError, FileNotFoundError):
    """The path is not a headrace store (no readable ``meta.json``)."""


class FormatVersionError(StoreError):
    """The store was written in a newer on-disk format version than this headrace reads."""


class StoreExistsError(StoreError, FileExistsError):
    """``create()`` was pointed at a directory that is not empty."""


class WriterBusyError(StoreError):
    """Another writer (in this or another process) holds the store's write lock."""


class WriterClosedError(StoreError):
    """A writer was used after ``close()`` or after a write failed and rolled back."""


class SchemaError(StoreError, ValueError):
    """A record does not fit the store's schema (field names, dtype, shape, codec)."""


class RecordTooLargeError(SchemaError):
    """A single record is larger than the format's 4 GiB per-record limit."""


class StoreFullError(StoreError, OSError):
    """The device ran out of space during a write. Nothing was committed."""


class CorruptionError(StoreError):
    """Stored bytes do not match their checksum, or an index entry points outside its chunk.

    Attributes:
        field: the field whose data is bad (``None`` when it is store-wide, e.g. meta.json).
        record_ids: the record ids found bad (may be empty when unknown).
    """

    def __init__(self, message: str, *, field: str | None = None,
                 record_ids: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.field = field
        self.record_ids = list(record_ids)


class RecordIndexError(HeadraceError, IndexError):
    """A record id is outside ``[0, N)``."""


class CheckpointError(HeadraceError, ValueError):
    """A checkpoint token cannot resume this loader (other data, seed, batch size or format)."""


class LoaderError(HeadraceError, RuntimeError):
    """A loader worker or a user transform raised; ``record_ids`` names the batch's records."""

    def __init__(self, message: str, *, record_ids: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.record_ids = list(record_ids)


class MemoryCapError(HeadraceError, MemoryError):
    """The process's RSS stays over ``max_ram_bytes`` while the loader holds no batch in flight.

    Raised by ``next()``; the loader stays usable: free memory (or raise the cap) and call again.
    """


class DecodeError(HeadraceError, ValueError):
    """A media payload (image, audio, video) could not be decoded."""

    def __init__(self, message: str, *, record_id: int | None = None,
                 path: str | None = None) -> None:
        super().__init__(message)
        self.record_id = record_id
        self.path = path


class LinkError(HeadraceError, ValueError):
    """A dataset link is malformed, or the snapshot it pins is unknown or stale."""


class RemoteError(HeadraceError, OSError):
    """An object-store request failed after the retry budget was spent."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class PackWorkerError(HeadraceError, RuntimeError):
    """A task of a parallel pack raised, or its worker process died; nothing was committed.

    Attributes:
        task: the failed task's number (``None`` when unknown).
        start, stop: its record range ``[start, stop)`` (``None`` when unknown).
    """

    def __init__(self, message: str, *, task: int | None = None, start: int | None = None,
                 stop: int | None = None) -> None:
        super().__init__(message)
        self.task = task
        self.start = start
        self.stop = stop

    def __reduce__(self) -> tuple[object, ...]:  # keeps the attributes across processes
        return (_pack_worker_error, (str(self), self.task, self.start, self.stop))


def _pack_worker_error(message: str, task: int | None, start: int | None,
                       stop: int | None) -> PackWorkerError:
    return PackWorkerError(message, task=task, start=start, stop=stop)
