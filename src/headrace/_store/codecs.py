"""Per-record codecs behind a tiny registry keyed by name.

A codec turns one record's bytes into stored bytes and back. The decoded size is kept in the aux
file, so decoders are told the exact output size (lz4 blocks carry no size of their own, and every
decoder can reject a record that decodes to the wrong size). ``raw`` encodes and decodes without a
copy. Compressor contexts are per thread because zstandard's are not thread-safe.

``zstd_dict`` is zstd with a dictionary trained on the field's own records: small records that
share structure (JSON rows, labels, token runs, headers) compress several times better than
independent zstd frames, which each restart from nothing. Its codec is built per field from the
dictionary (``dict_codec``); the registry entry only names it.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace._base.errors import SchemaError

__all__ = ["CODECS", "DICT_BYTES", "Codec", "check_codec", "dict_codec", "get_codec", "loop_decoder",
           "train_dictionary"]

Buffer = Any  # bytes, bytearray, memoryview, contiguous ndarray


@dataclass(frozen=True)
class Codec:
    """One codec: ``encode(buf) -> bytes-like``, ``decode(buf, nbytes) -> bytes-like``.

    ``decode`` raises any exception on malformed input; callers wrap it in ``CorruptionError``
    with the field and record id.
    """

    name: str
    encode: Callable[[Buffer], Buffer]
    decode: Callable[[Buffer, int], Buffer]
    # decode_into(buf, out): decodes straight into the writable buffer ``out`` (exactly its size),
    # skipping a copy; None where the codec's Python binding cannot
    decode_into: Callable[[Buffer, memoryview], None] | None = None
    # decode_many(frames, nbytes): decodes many records in one call: ``frames`` a list of stored
    # records (buffers), ``nbytes`` a uint64 array of their decoded sizes. Returns the decoded
    # records (buffers) in order, each exactly its ``nbytes``, or raises on any malformed record.
    # None where the binding has no batch API.
    decode_many: Callable[[list[Buffer], Any], Any] | None = None


_local = threading.local()


def _zstd_c() -> Any:
    c = getattr(_local, "zc", None)
    if c is None:
        import zstandard
        c = _local.zc = zstandard.ZstdCompressor(level=3)
    return c


def _zstd_d() -> Any:
    d = getattr(_local, "zd", None)
    if d is None:
        import zstandard
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def _zstd_decode(buf: Buffer, nbytes: int) -> bytes:
    out: bytes = _zstd_d().decompress(buf, max_output_size=nbytes)
    return out


def _zstd_decode_into(buf: Buffer, out: memoryview) -> None:
    reader = _zstd_d().stream_reader(buf, read_across_frames=False)
    view, done = out.cast("B"), 0
    while done < len(view):
        n = reader.readinto(view[done:])
        if not n:
            raise ValueError(f"zstd frame ends after {done} bytes, expected {len(view)}")
        done += n
    if reader.read(1):
        raise ValueError(f"zstd frame holds more than the expected {len(view)} bytes")


def _zstd_decode_many(frames: list[Buffer], nbytes: Any) -> Any:
    # One C call for the whole batch (GIL released): saves the per-frame Python overhead of
    # ``decompress``. It rejects a frame that does not decode to exactly its entry of ``nbytes``.
    # (A list of frames, not BufferWithSegments per chunk: one call per chunk costs ~40 us each,
    # and zstandard 0.25 refuses decompressed_sizes with a BufferWithSegmentsCollection.)
    return _zstd_d().multi_decompress_to_buffer(frames, decompressed_sizes=nbytes, threads=0)


def _lz4_encode(buf: Buffer) -> bytes:
    import lz4.block
    out: bytes = lz4.block.compress(buf, store_size=False)
    return out


def _lz4_decode(buf: Buffer, nbytes: int) -> bytes:
    import lz4.block
    out: bytes = lz4.block.decompress(buf, uncompressed_size=nbytes)
    return out


def _deflate_encode(buf: Buffer) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate: no zlib header (the design's "flate")
    return c.compress(buf) + c.flush()


def _deflate_decode(buf: Buffer, nbytes: int) -> bytes:
    d = zlib.decompressobj(-15)
    out = d.decompress(buf, nbytes)
    if d.unconsumed_tail or not d.eof:
        raise zlib.error("deflate stream does not end at the recorded size")
    return out


def _needs_dict(*_args: Any) -> Any:
    raise SchemaError("the zstd_dict codec needs its field's dictionary; build it with dict_codec()")


# Dictionary size and training sample, as loaderx 2.8.19's train_dict: 32 KiB from at most 4 MiB
# of records spread evenly over what is offered.
DICT_BYTES = 32 << 10
SAMPLE_BYTES = 4 << 20
MIN_SAMPLES = 10  # zstd's trainer refuses fewer ("Src size is incorrect")


def train_dictionary(records: list[Buffer], *, dict_bytes: int = DICT_BYTES,
                     sample_bytes: int = SAMPLE_BYTES) -> bytes:
    """A zstd dictionary trained on an even spread of ``records`` (empty ones skipped).

    Raises:
        ValueError: fewer than ``MIN_SAMPLES`` non-empty records, or zstd could not train on
            them (too little data); the message says so.
    """
    import zstandard

    sizes = [memoryview(r).nbytes for r in records]
    present = [i for i, n in enumerate(sizes) if n]
    if len(present) < MIN_SAMPLES:
        raise ValueError(f"{len(present)} non-empty records are too few to train a zstd "
                         f"dictionary; it needs at least {MIN_SAMPLES} (hundreds work best)")
    mean = max(1, sum(sizes[i] for i in present) // len(present))
    k = max(MIN_SAMPLES, min(len(present), sample_bytes // mean))
    step = (len(present) - 1) / max(1, k - 1)
    picks = sorted({present[round(j * step)] for j in range(k)})
    samples = [bytes(memoryview(records[i]).cast("B")) for i in picks]
    try:
        trained = zstandard.train_dictionary(dict_bytes, samples)  # type: ignore[arg-type]
    except zstandard.ZstdError as e:
        raise ValueError(f"zstd could not train a dictionary on {len(samples)} records "
                         f"({e}); give it more (or larger) records") from e
    out: bytes = trained.as_bytes()
    return out


def dict_codec(dictionary: bytes) -> Codec:
    """The ``zstd_dict`` codec of one field: zstd level 3 with ``dictionary``.

    Each thread gets its own compressor/decompressor (zstandard's are not thread-safe); the
    dictionary is digested once and shared.

    Raises:
        ValueError: ``dictionary`` is empty or not a zstd dictionary.
    """
    import zstandard

    if not dictionary:
        raise ValueError("a zstd_dict field's dictionary is empty")
    zd = zstandard.ZstdCompressionDict(bytes(dictionary))
    zd.precompute_compress(level=3)
    local = threading.local()

    def comp() -> Any:
        c = getattr(local, "c", None)
        if c is None:
            # no dictionary id nor content size in the frame: the field has one dictionary and
            # the aux file keeps each record's size; ~5 bytes a record, a lot for small records
            c = local.c = zstandard.ZstdCompressor(level=3, dict_data=zd, write_dict_id=False,
                                                   write_content_size=False)
        return c

    def dec() -> Any:
        d = getattr(local, "d", None)
        if d is None:
            d = local.d = zstandard.ZstdDecompressor(dict_data=zd)
        return d

    dec()  # a damaged dictionary fails here, when the field is opened, not at the first read

    def decode(buf: Buffer, nbytes: int) -> bytes:
        out: bytes = dec().decompress(buf, max_output_size=nbytes)
        return out

    def decode_many(frames: list[Buffer], nbytes: Any) -> Any:
        return dec().multi_decompress_to_buffer(frames, decompressed_sizes=nbytes, threads=0)

    return Codec("zstd_dict", lambda b: comp().compress(b), decode, None, decode_many)


CODECS: dict[str, Codec] = {
    "raw": Codec("raw", lambda b: b, lambda b, n: b),
    "zstd": Codec("zstd", lambda b: _zstd_c().compress(b), _zstd_decode, _zstd_decode_into,
                  _zstd_decode_many),
    "lz4": Codec("lz4", _lz4_encode, _lz4_decode),
    "deflate": Codec("deflate", _deflate_encode, _deflate_decode),
    "zstd_dict": Codec("zstd_dict", _needs_dict, _needs_dict),
}


def loop_decoder(codec: Codec) -> Callable[[Buffer, int], Buffer]:
    """The cheapest per-record ``decode(buf, nbytes)`` of ``codec``, for tight loops.

    Same contract as ``Codec.decode`` except that the result may have the wrong size (the caller
    checks it): lz4's own ``decompress``, without a wrapper call (a measurable share of a small
    lz4 record's cost). Use the result in the calling thread only (zstd contexts are per thread).
    """
    if codec.name == "lz4":
        import lz4.block
        fn: Callable[[Buffer, int], Buffer] = lz4.block.decompress
        return fn
    if codec.name == "zstd":
        d = _zstd_d()
        return lambda buf, nbytes: d.decompress(buf, max_output_size=nbytes)
    return codec.decode


def check_codec(name: Any, *, field: str | None = None) -> str:
    """Returns ``name`` if it is a known codec, else raises ``SchemaError`` listing the valid ones."""
    if isinstance(name, str) and name in CODECS:
        return name
    where = f"field {field!r}: " if field else ""
    raise SchemaError(
        f"{where}unknown codec {name!r}; use one of {', '.join(sorted(CODECS))}")


def get_codec(name: str, dictionary: bytes | None = None) -> Codec:
    """The codec registered under ``name``; ``zstd_dict`` is built from the field's ``dictionary``
    (without one, the entry that raises when used: a field whose dictionary is not trained yet)."""
    if name == "zstd_dict" and dictionary:
        return dict_codec(dictionary)
    return CODECS[check_codec(name)]
