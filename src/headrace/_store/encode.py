"""Validation and encoding of the records a writer is given (nothing touches the disk here).

``encode_batch`` checks one field's batch against its schema (dtype, shape, sizes), encodes every
record with the field's codec and computes the crc32c of the stored bytes. The writer calls it for
every field of a batch before writing a single byte, so a bad batch leaves the store untouched.
"""

from __future__ import annotations

from typing import Any, Protocol

import google_crc32c
import numpy as np

from headrace._base.errors import RecordTooLargeError, SchemaError
from headrace._store import format as _format
from headrace._store.codecs import Codec, dict_codec, train_dictionary
from headrace._store.format import FieldSpec

__all__ = ["FieldCodec", "encode_batch"]


class FieldCodec(Protocol):
    """What encoding needs to know about a field."""

    spec: FieldSpec
    codec: Codec
    rec: int  # decoded bytes per record (fixed-shape), -1 for ragged
    dictionary: bytes | None  # zstd_dict: None until trained (by the first batch encoded)


def _fixed_array(fw: FieldCodec, batch: Any, n: int | None) -> np.ndarray:
    spec = fw.spec
    shape = spec.shape or ()
    try:
        arr = np.asarray(batch)
    except ValueError as e:  # nested lists of different lengths: NumPy's inhomogeneous shape
        raise SchemaError(
            f"field {spec.name!r}: the batch's records have different shapes ({e}); every "
            f"record of this field has shape {shape}: pass an array of shape (n, "
            f"{', '.join(map(str, shape))})".replace(", )", ")")) from None
    if not isinstance(batch, np.ndarray):
        arr = _value_cast(spec, arr)  # Python numbers: any cast that keeps every value
    if arr.dtype.hasobject or arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape \
            or (n is not None and arr.shape[0] != n):
        want = f"({n if n is not None else 'n'}, {', '.join(map(str, shape))})".replace(", )", ")")
        raise SchemaError(
            f"field {spec.name!r}: expected a batch of shape {want} and dtype {spec.dtype}, "
            f"got shape {arr.shape} and dtype {arr.dtype}; pass one row per record")
    return _cast(spec, arr)

def _cast(spec: FieldSpec, arr: np.ndarray) -> np.ndarray:
    if arr.dtype != spec.dtype:
        if not np.can_cast(arr.dtype, spec.dtype, "safe") and not (
                arr.size == 0 and arr.dtype == np.float64):
            raise SchemaError(
                f"field {spec.name!r}: expected dtype {spec.dtype}, got {arr.dtype} (which "
                f"cannot be cast safely); convert with .astype({str(spec.dtype)!r})")
        arr = arr.astype(spec.dtype)
    return np.ascontiguousarray(arr)

def _ragged_record(fw: FieldCodec, rec: Any) -> Any:
    spec = fw.spec
    if isinstance(rec, bytes | bytearray | memoryview):
        mv = memoryview(rec).cast("B")
        if mv.nbytes % spec.dtype.itemsize:
            raise SchemaError(
                f"field {spec.name!r}: a {mv.nbytes}-byte record is not a whole number of "
                f"{spec.dtype} elements ({spec.dtype.itemsize} bytes each)")
        return mv
    nbytes = getattr(rec, "nbytes", None)
    if nbytes is not None and not isinstance(rec, np.ndarray) and int(nbytes) > _format.MAX_RECORD_BYTES:
        return rec  # size-checked (and rejected) by the caller before any conversion
    arr = np.asarray(rec) if isinstance(rec, np.ndarray) else _value_cast(spec, np.asarray(rec))
    if arr.ndim > 1 or arr.dtype.hasobject:
        raise SchemaError(
            f"field {spec.name!r} is ragged: expected each record to be bytes or a 1-D array of "
            f"{spec.dtype}, got shape {arr.shape} and dtype {arr.dtype}")
    return _cast(spec, arr.reshape(-1))

def encode_batch(fw: FieldCodec, batch: Any, n: int | None
                 ) -> tuple[int, list[Any] | np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validates and encodes one field's batch.

    Returns ``(n, data, lengths, nbytes, crcs)`` where ``data`` is a ``(n, rec)`` uint8 array
    (fixed-shape raw fields) or a list of stored byte strings.
    """
    spec = fw.spec
    if fw.rec >= 0:
        arr = _fixed_array(fw, batch, n)
        k = arr.shape[0]
        raw = (arr.reshape(k, -1).view(np.uint8) if fw.rec and k
               else np.empty((k, fw.rec), np.uint8))
        _check_size(spec, fw.rec)
        nbytes = np.full(k, fw.rec, np.int64)
        if spec.codec == "raw":
            ro = raw.view()
            ro.flags.writeable = False
            crcs = np.fromiter((google_crc32c.value(r) for r in ro), np.uint32, k)
            return k, raw, nbytes.copy(), nbytes, crcs
        records: list[Any] = list(raw)
    else:
        if isinstance(batch, np.ndarray) and batch.ndim == 2:
            batch = list(batch)
        elif hasattr(batch, "to_list") and hasattr(batch, "offsets"):
            batch = batch.to_list()
        elif isinstance(batch, bytes | bytearray | memoryview | str | np.ndarray):
            raise SchemaError(
                f"field {spec.name!r} is ragged: pass a list of records (bytes or 1-D arrays), "
                f"got a single {type(batch).__name__}")
        try:
            records = [_ragged_record(fw, r) for r in batch]
        except ValueError as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"field {spec.name!r} is ragged: every record must be bytes or a "
                              f"1-D array of {spec.dtype} ({e})") from None
        k = len(records)
        if n is not None and k != n:
            raise SchemaError(f"field {spec.name!r}: got {k} records, other fields have {n}")
        sizes = [int(getattr(r, "nbytes", 0)) for r in records]
        for s in sizes:
            _check_size(spec, s)
        nbytes = np.array(sizes, np.int64)
    if spec.codec == "zstd_dict" and fw.dictionary is None:
        _train(fw, records)
    stored: list[Any] = []
    for r in records:
        mv = memoryview(r).cast("B") if not isinstance(r, memoryview) else r
        if mv.nbytes == 0:
            stored.append(b"")  # a 0-byte record is stored as absent, whatever the codec
            continue
        enc = fw.codec.encode(mv)
        _check_size(spec, len(enc), stored_bytes=True)
        stored.append(enc)
    lengths = np.array([len(s) for s in stored], np.int64)
    crcs = np.fromiter((_crc(s) for s in stored), np.uint32, k)
    return k, stored, lengths, nbytes, crcs

def _train(fw: FieldCodec, records: list[Any]) -> None:
    """Trains a ``zstd_dict`` field's dictionary on the batch about to be stored with it."""
    try:
        dictionary = train_dictionary(records)
    except ValueError as e:
        raise SchemaError(
            f"field {fw.spec.name!r} (codec zstd_dict) trains its dictionary on its first "
            f"appended batch, and this one cannot: {e}. Append a larger first batch, or use "
            "codec 'zstd'") from None
    fw.codec = dict_codec(dictionary)
    fw.dictionary = dictionary


def _check_size(spec: FieldSpec, size: int, *, stored_bytes: bool = False) -> None:
    if size > _format.MAX_RECORD_BYTES:
        what = "compresses to" if stored_bytes else "is"
        raise RecordTooLargeError(
            f"field {spec.name!r}: a record {what} {size} bytes, over the format's limit of "
            f"{_format.MAX_RECORD_BYTES} bytes (u32 lengths); split it into smaller records")


def _value_cast(spec: FieldSpec, arr: np.ndarray) -> np.ndarray:
    if arr.dtype == spec.dtype or arr.dtype.hasobject or arr.dtype.kind not in "biuf":
        return arr
    try:
        with np.errstate(all="ignore"):
            cast = arr.astype(spec.dtype)
        if cast.shape == arr.shape and bool((cast == arr).all()):
            return cast
    except (TypeError, ValueError, OverflowError):
        pass
    return arr


def _crc(buf: Any) -> int:
    if isinstance(buf, bytes):
        return int(google_crc32c.value(buf))
    arr = np.frombuffer(buf, np.uint8)  # google_crc32c wants a read-only buffer: no copy
    arr.flags.writeable = False
    return int(google_crc32c.value(arr))
