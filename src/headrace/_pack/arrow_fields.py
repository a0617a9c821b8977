"""Arrow columns -> store fields, and one Arrow record batch -> one ``Writer.append`` batch.

One field per column, as loaderx 2.8.19's converter maps them, plus what it rejects:

=====================================================  ==========================================
Arrow type (HF feature)                                field
=====================================================  ==========================================
bool, int*, uint*, float16/32/64                       fixed scalar of that dtype
date/time/timestamp/duration                           fixed scalar of its integer storage
fixed_size_list (nested), HF ``ArrayND`` fixed shape   fixed shape ``(d0, d1, ...)``
fixed_size_binary(k)                                   fixed ``(k,)`` uint8
list / large_list of a primitive                       ragged 1-D
string, binary (large, view)                           ragged uint8 (the UTF-8 / raw bytes)
HF ``Image`` / ``Audio`` / ``Video``                   ragged uint8: the encoded file bytes
list of fixed_size_list, ``{values, shape}`` struct,   ragged flat values + ``<field>-shape``
HF ``ArrayND`` with a dynamic first dimension          (uint32 ``(ndim,)``: each record's shape)
dictionary                                             as its value type (decoded)
HF ``ClassLabel``                                      int64 scalar, names kept as ``classes``
=====================================================  ==========================================

Nulls follow one explicit policy (``error``: raise naming the row and column; ``skip``: drop the
row; ``fill``: zeros / empty records). A null *inside* a list counts as a null of its row.
Conversion works on whole Arrow buffers (offsets and values), never row by row, except for HF
media cells stored as a path instead of bytes, which are read from that file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace._base.errors import ConfigError, SchemaError
from headrace._store.reader import Ragged

__all__ = ["NULL_POLICIES", "Column", "convert_batch", "plan_columns"]

NULL_POLICIES = ("error", "skip", "fill")
# HF features whose cells are struct{bytes, path}: the encoded file is the record.
MEDIA_FEATURES = {"Image": "image", "Audio": "audio", "Video": "video"}
SHAPE_SUFFIX = "-shape"
_FIELD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")


@dataclass(frozen=True)
class Column:
    """How one Arrow column becomes a field (picklable: tasks carry their plan).

    Attributes:
        name: the Arrow column.
        field: the store field (``<field>-shape`` too for ``tensor`` columns).
        kind: ``fixed``, ``ragged`` (1-D numbers), ``bytes`` (strings/binary), ``media`` (HF
            Image/Audio/Video bytes) or ``tensor`` (ragged n-d: flat values + shapes).
        dtype: the stored element dtype.
        shape: the record shape of a ``fixed`` column; for ``tensor``: the fixed trailing dims
            (``None`` when the shape comes from the data, a ``{values, shape}`` struct).
        ndim: a ``tensor`` record's number of dimensions.
        feature: the HF feature type (``Image``, ``ClassLabel``, ``Array2D``...) or ``None``.
        classes: a ``ClassLabel``'s names.
        arrow_type: the column's Arrow type, as text (kept in the store's attrs).
    """

    name: str
    field: str
    kind: str
    dtype: str
    shape: tuple[int, ...] | None = None
    ndim: int = 1
    feature: str | None = None
    classes: tuple[str, ...] | None = None
    arrow_type: str = ""

    def specs(self, codec: str) -> dict[str, dict[str, Any]]:
        """The field spec(s) this column adds to the store."""
        if self.kind == "fixed":
            return {self.field: {"dtype": self.dtype, "shape": list(self.shape or ()),
                                 "codec": codec}}
        out: dict[str, dict[str, Any]] = {
            self.field: {"dtype": self.dtype, "shape": None, "codec": codec}}
        if self.kind == "tensor":
            out[self.field + SHAPE_SUFFIX] = {"dtype": "<u4", "shape": [self.ndim],
                                              "codec": "raw"}
        return out

    def describe(self) -> dict[str, Any]:
        """What the store's attrs record about the column."""
        d: dict[str, Any] = {"field": self.field, "kind": self.kind, "arrow_type": self.arrow_type}
        if self.feature is not None:
            d["feature"] = self.feature
        if self.classes is not None:
            d["classes"] = list(self.classes)
        if self.kind == "tensor":
            d["shape_field"] = self.field + SHAPE_SUFFIX
        return d


# -- planning ---------------------------------------------------------------------------------------


def _pa() -> Any:
    import pyarrow as pa

    return pa


def _np_dtype(t: Any, where: str) -> np.dtype[Any]:
    pa = _pa()
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()).newbyteorder("<")
    if pa.types.is_temporal(t):  # stored as its integer representation
        return np.dtype(f"<i{t.bit_width // 8}")
    raise SchemaError(f"{where}: Arrow type {t} is not a number")


def _is_number(t: Any) -> bool:
    pa = _pa()
    return bool(pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
                or pa.types.is_temporal(t))


def _is_list(t: Any) -> bool:
    pa = _pa()
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _fixed_of(t: Any) -> tuple[Any, tuple[int, ...]] | None:
    """``(leaf type, shape)`` of a number or a nest of fixed-size lists of one; else ``None``."""
    pa = _pa()
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return (t, tuple(shape)) if _is_number(t) else None


def _leaf_of_lists(t: Any, depth: int) -> Any:
    for _ in range(depth):
        if not (_is_list(t) or _pa().types.is_fixed_size_list(t)):
            return None
        t = t.value_type
    return t if _is_number(t) else None


def _unsupported(where: str, t: Any, why: str) -> SchemaError:
    return SchemaError(f"{where}: Arrow type {t} cannot be a field ({why}); leave the column "
                       "out with columns=[...], or convert it first (e.g. dataset.flatten() / "
                       "table.flatten() for structs, dataset.cast_column(...))")


def _classify(name: str, field: str, t: Any, feat: Mapping[str, Any] | None) -> Column:
    pa = _pa()
    where = f"column {name!r}"
    ftype = (feat or {}).get("_type")
    common: dict[str, Any] = {"name": name, "field": field, "arrow_type": str(t),
                              "feature": ftype}
    if isinstance(t, pa.ExtensionType):
        shape = getattr(t, "shape", None)
        if shape is not None and ftype is None:
            ftype = f"Array{len(shape)}D"
            feat = {"_type": ftype, "shape": list(shape)}
            common["feature"] = ftype
        t = t.storage_type
    if pa.types.is_dictionary(t):
        return _classify(name, field, t.value_type, feat)
    if ftype in MEDIA_FEATURES:
        if not (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0):
            raise SchemaError(f"{where}: an HF {ftype} column must be stored as "
                              f"struct<bytes, path>, got {t}; cast it with "
                              f"dataset.cast_column({name!r}, datasets.{ftype}(decode=False))")
        return Column(kind="media", dtype="|u1", **common)
    if ftype == "ClassLabel":
        if not pa.types.is_integer(t):
            raise SchemaError(f"{where}: a ClassLabel column must hold integers, got {t}")
        names = tuple(str(n) for n in (feat or {}).get("names") or ())
        return Column(kind="fixed", dtype="<i8", shape=(), classes=names or None, **common)
    if isinstance(ftype, str) and re.fullmatch(r"Array[2-5]D", ftype):
        shape = list((feat or {}).get("shape") or [])
        leaf = _leaf_of_lists(t, len(shape))
        if leaf is None:
            raise _unsupported(where, t, f"{ftype} storage should be {len(shape)} nested lists "
                                         "of numbers")
        dt = _np_dtype(leaf, where).str
        if shape and shape[0] is None:
            if any(s is None for s in shape[1:]):
                raise _unsupported(where, t, f"{ftype} shape {shape}: only the first dimension "
                                             "may vary")
            return Column(kind="tensor", dtype=dt, shape=tuple(int(s) for s in shape[1:]),
                          ndim=len(shape), **common)
        return Column(kind="fixed", dtype=dt, shape=tuple(int(s) for s in shape), **common)
    if pa.types.is_null(t):
        raise _unsupported(where, t, "every value is null")
    if _is_number(t):
        return Column(kind="fixed", dtype=_np_dtype(t, where).str, shape=(), **common)
    fixed = _fixed_of(t)
    if fixed is not None:
        return Column(kind="fixed", dtype=_np_dtype(fixed[0], where).str, shape=fixed[1],
                      **common)
    if pa.types.is_fixed_size_binary(t):
        return Column(kind="fixed", dtype="|u1", shape=(t.byte_width,), **common)
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
            or pa.types.is_binary_view(t)):
        return Column(kind="bytes", dtype="|u1", **common)
    if _is_list(t):
        inner = _fixed_of(t.value_type)
        if inner is None:
            raise _unsupported(where, t, "a list of lists or of non-numbers has no flat layout; "
                                         "only lists of numbers (or of fixed-size lists) do")
        dt = _np_dtype(inner[0], where).str
        if inner[1] == ():
            return Column(kind="ragged", dtype=dt, **common)
        return Column(kind="tensor", dtype=dt, shape=inner[1], ndim=1 + len(inner[1]), **common)
    if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == {"values",
                                                                                    "shape"}:
        vt, st = t.field("values").type, t.field("shape").type
        if _is_list(vt) and _is_number(vt.value_type) and pa.types.is_fixed_size_list(st) \
                and pa.types.is_integer(st.value_type):
            return Column(kind="tensor", dtype=_np_dtype(vt.value_type, where).str, shape=None,
                          ndim=st.list_size, **common)
    if pa.types.is_struct(t):
        raise _unsupported(where, t, "a struct is several values; flatten it into one column "
                                     "per leaf")
    raise _unsupported(where, t, "not a number, string, binary or list of numbers")


def plan_columns(schema: Any, features: Mapping[str, Any] | None,
                 columns: Sequence[str] | Mapping[str, str] | None) -> list[Column]:
    """One ``Column`` per selected column of ``schema`` (``columns``: names, or ``{column:
    field}`` to rename; ``None``: every column), in the order selected.

    Raises:
        ConfigError: an unknown column, or a name that is not a valid field name.
        SchemaError: a column whose type has no field layout (the message says what to do).
    """
    names = list(schema.names)
    if columns is None:
        chosen = {n: n for n in names}
    elif isinstance(columns, Mapping):
        chosen = {str(k): str(v) for k, v in columns.items()}
    elif isinstance(columns, str):
        raise ConfigError(f"columns={columns!r} must be a list of column names (or a dict "
                          f"column -> field), e.g. columns=[{columns!r}]")
    else:
        chosen = {str(c): str(c) for c in columns}
    if not chosen:
        raise ConfigError("columns= selects no column; name at least one")
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise ConfigError(f"unknown columns {unknown}; the source has {names}")
    out = []
    for name, field in chosen.items():
        if not _FIELD_NAME.match(field) or field.endswith(SHAPE_SUFFIX):
            raise ConfigError(
                f"column {name!r} cannot be a field named {field!r}: field names are 1-100 "
                f"letters, digits, '_' or '-' (not ending in {SHAPE_SUFFIX!r}); rename it with "
                f"columns={{{name!r}: {re.sub(r'[^A-Za-z0-9_-]', '_', field)[:100]!r}, ...}}")
        feat = (features or {}).get(name)
        out.append(_classify(name, field, schema.field(name).type,
                             feat if isinstance(feat, Mapping) else None))
    fields = [f for c in out for f in c.specs("raw")]
    dup = sorted({f for f in fields if fields.count(f) > 1})
    if dup:
        raise ConfigError(f"fields {dup} would be written twice; rename columns with "
                          "columns={column: field}")
    return out


# -- nulls ------------------------------------------------------------------------------------------


def _storage(arr: Any) -> Any:
    pa = _pa()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):  # offsets need not ascend
        import pyarrow.compute as pc

        sizes = np.asarray(pc.fill_null(pc.list_value_length(arr), 0), np.int64)
        offs = np.concatenate([[0], np.cumsum(sizes)])
        mask = None if not arr.null_count else pa.array(~np.asarray(arr.is_valid()))
        arr = pa.LargeListArray.from_arrays(pa.array(offs, pa.int64()), pc.list_flatten(arr),
                                            mask=mask)
    return arr


def _row_nulls(arr: Any) -> np.ndarray | None:
    """Rows that are null or hold a null somewhere inside (``None``: no null at all)."""
    import pyarrow.compute as pc

    pa = _pa()
    mask = None
    if arr.null_count:
        mask = ~np.asarray(arr.is_valid())
    t = arr.type
    if _is_list(t) or pa.types.is_fixed_size_list(t):
        child = arr.flatten()
        cm = _row_nulls(child)
        if cm is not None:
            parents = np.asarray(pc.list_parent_indices(arr))
            inner = np.zeros(len(arr), bool)
            inner[parents[cm]] = True
            mask = inner if mask is None else mask | inner
    elif pa.types.is_struct(t):
        for child in arr.flatten():
            cm = _row_nulls(child)
            if cm is not None:
                mask = cm if mask is None else mask | cm
    return mask


def _media_nulls(arr: Any) -> np.ndarray | None:
    """Media cells with neither bytes nor a path."""
    parts = dict(zip([arr.type.field(i).name for i in range(arr.type.num_fields)],
                     arr.flatten(), strict=True))
    b = parts["bytes"]
    if not b.null_count and not arr.null_count:
        return None
    mask = ~np.asarray(b.is_valid())
    p = parts.get("path")
    if p is not None:
        mask &= ~np.asarray(p.is_valid())
    if arr.null_count:
        mask |= ~np.asarray(arr.is_valid())
    return mask if mask.any() else None


def null_rows(cols: Sequence[Column], batch: Any) -> dict[str, np.ndarray]:
    """``{column: mask of null rows}`` for the columns of ``batch`` that have any."""
    out = {}
    for c in cols:
        arr = _storage(batch.column(c.name))
        m = _media_nulls(arr) if c.kind == "media" else _row_nulls(arr)
        if m is not None and m.any():
            out[c.name] = m
    return out


# -- conversion -------------------------------------------------------------------------------------


def _filled(arr: Any) -> Any:
    """``arr`` with top-level nulls replaced by zeros / empty values."""
    if not arr.null_count:
        return arr
    import pyarrow.compute as pc

    pa = _pa()
    t = arr.type
    if pa.types.is_fixed_size_list(t):
        leaf, shape = _fixed_of(t) or (None, ())
        zero: Any = np.zeros(shape, bool if pa.types.is_boolean(leaf) else np.int64).tolist()
    elif _is_list(t):
        zero = []
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        zero = ""
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        zero = b""
    elif pa.types.is_fixed_size_binary(t):
        zero = bytes(t.byte_width)
    elif pa.types.is_boolean(t):
        zero = False
    elif pa.types.is_temporal(t):
        return pc.fill_null(arr.cast(pa.int64() if t.bit_width == 64 else pa.int32()), 0)
    else:
        zero = 0
    return pc.fill_null(arr, pa.scalar(zero, t))


def _numbers(arr: Any, dtype: str) -> np.ndarray:
    """A null-free 1-D numeric Arrow array as NumPy (zero-copy where Arrow allows)."""
    pa = _pa()
    arr = _filled(arr)
    t = arr.type
    if pa.types.is_temporal(t):
        arr = arr.cast(pa.int64() if t.bit_width == 64 else pa.int32())
    out = arr.to_numpy(zero_copy_only=False)
    return out if out.dtype == np.dtype(dtype) else out.astype(dtype)


def _flat(arr: Any, depth: int) -> Any:
    for _ in range(depth):
        arr = _filled(arr).flatten()
    return arr


def _offsets(arr: Any) -> np.ndarray:
    """Element offsets of a (null-free) list/binary array, from 0, as int64."""
    pa = _pa()
    t = arr.type
    if _is_list(t):
        offs = np.asarray(arr.offsets, dtype=np.int64)
    else:
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        odt = np.dtype("<i8" if large else "<i4")
        offs = np.frombuffer(arr.buffers()[1], odt, count=len(arr) + 1,
                             offset=arr.offset * odt.itemsize).astype(np.int64)
    return offs - offs[0]


def _bytes(arr: Any) -> Ragged:
    pa = _pa()
    arr = _filled(arr)
    t = arr.type
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = arr.cast(pa.large_binary())
    offs_abs = _offsets(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    odt = np.dtype("<i8" if large else "<i4")
    first = int(np.frombuffer(arr.buffers()[1], odt, count=1, offset=arr.offset * odt.itemsize)[0])
    data = arr.buffers()[2]
    values = (np.frombuffer(data, np.uint8)[first:first + int(offs_abs[-1])] if data is not None
              else np.empty(0, np.uint8))
    return Ragged(values, offs_abs)


def _media(arr: Any, col: Column, row0: int) -> Ragged:
    """HF media cells: their ``bytes``; a cell with only a ``path`` is read from that file."""
    names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
    parts = dict(zip(names, arr.flatten(), strict=True))
    b = parts["bytes"]
    if b.null_count == 0:
        return _bytes(b)
    p = parts.get("path")
    paths = p.to_pylist() if p is not None else [None] * len(arr)
    blobs = b.to_pylist()
    for i, blob in enumerate(blobs):
        if blob is None:
            path = paths[i]
            if path is None:
                blobs[i] = b""  # nulls="fill"; the other policies never get here
                continue
            try:
                with open(path, "rb") as f:
                    blobs[i] = f.read()
            except OSError as e:
                raise ConfigError(f"column {col.name!r} row {row0 + i}: the {col.feature} has no "
                                  f"bytes and its path {path!r} cannot be read ({e}); embed the "
                                  "files first (dataset.cast_column(..., decode=False) keeps "
                                  "paths; datasets' embed_table_storage embeds them)") from None
    offs = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(x) for x in blobs], out=offs[1:])
    return Ragged(np.frombuffer(b"".join(blobs), np.uint8), offs)


def _tensor(arr: Any, col: Column, row0: int) -> tuple[Ragged, np.ndarray]:
    pa = _pa()
    arr = _filled(arr)
    n = len(arr)
    if pa.types.is_struct(arr.type):  # loaderx's {values: list, shape: fixed_size_list}
        values_arr, shape_arr = arr.field("values"), arr.field("shape")
        if arr.offset:
            values_arr, shape_arr = values_arr.slice(arr.offset, n), shape_arr.slice(arr.offset, n)
        values_arr = _filled(values_arr)
        offs = _offsets(values_arr)
        values = _numbers(values_arr.flatten(), col.dtype)
        shapes = _numbers(_filled(shape_arr).flatten(), "<i8").reshape(n, col.ndim)
        bad = np.flatnonzero(np.prod(shapes, axis=1) != np.diff(offs))
        if bad.size or (shapes < 0).any():
            i = int(bad[0]) if bad.size else int(np.flatnonzero((shapes < 0).any(1))[0])
            raise SchemaError(f"column {col.name!r} row {row0 + i}: shape {shapes[i].tolist()} "
                              f"does not hold its {int(np.diff(offs)[i])} values")
        return Ragged(values, offs), shapes.astype("<u4")
    inner = tuple(col.shape or ())
    per = int(np.prod(inner, dtype=np.int64)) if inner else 1
    first = np.diff(_offsets(arr))
    values = _numbers(_flat(arr, col.ndim), col.dtype)
    if values.size != int(first.sum()) * per:
        raise SchemaError(f"column {col.name!r} rows {row0}..{row0 + n - 1}: the values do not "
                          f"fill the trailing dimensions {list(inner)} of every record")
    shapes = np.empty((n, col.ndim), "<u4")
    shapes[:, 0] = first
    shapes[:, 1:] = inner
    return Ragged(values, np.concatenate([[0], np.cumsum(first * per)]).astype(np.int64)), shapes


def convert_column(col: Column, arr: Any, row0: int) -> dict[str, Any]:
    """One column of a (null-checked) batch as ``{field: Writer.append batch}``."""
    arr = _storage(arr)
    if col.kind == "fixed":
        shape = tuple(col.shape or ())
        if _pa().types.is_fixed_size_binary(arr.type):
            raw = _filled(arr)
            buf = np.frombuffer(raw.buffers()[1], np.uint8)
            start = raw.offset * shape[0]
            return {col.field: buf[start:start + len(raw) * shape[0]].reshape(len(raw), *shape)}
        depth = len(shape)
        values = _numbers(_flat(arr, depth), col.dtype)
        if values.size != len(arr) * int(np.prod(shape, dtype=np.int64)):
            raise SchemaError(f"column {col.name!r} rows {row0}..{row0 + len(arr) - 1}: not "
                              f"every record has shape {list(shape)}")
        return {col.field: values.reshape(len(arr), *shape)}
    if col.kind == "ragged":
        arr = _filled(arr)
        return {col.field: Ragged(_numbers(arr.flatten(), col.dtype), _offsets(arr))}
    if col.kind == "bytes":
        return {col.field: _bytes(arr)}
    if col.kind == "media":
        return {col.field: _media(arr, col, row0)}
    ragged, shapes = _tensor(arr, col, row0)
    return {col.field: ragged, col.field + SHAPE_SUFFIX: shapes}


def convert_batch(cols: Sequence[Column], batch: Any, row0: int, nulls: str,
                  where: str) -> tuple[dict[str, Any], int]:
    """A record batch (or small table) as one ``Writer.append`` batch and its record count.

    ``row0`` is the batch's first row in the whole source (for messages), ``where`` names the
    input (a file, a dataset). With ``nulls="skip"`` rows holding a null are dropped first.

    Raises:
        SchemaError: ``nulls="error"`` and a null, naming the column and row.
    """
    masks = null_rows(cols, batch) if nulls != "fill" else {}
    if masks and nulls == "error":
        name, m = min(masks.items(), key=lambda kv: int(np.argmax(kv[1])))
        i = int(np.argmax(m))
        raise SchemaError(
            f"column {name!r} row {row0 + i} ({where}) is null or holds a null, and "
            f"nulls='error'; pass nulls='skip' to drop such rows or nulls='fill' to store "
            "zeros / empty records")
    if masks:
        keep = ~np.logical_or.reduce(list(masks.values()))
        batch = batch.filter(_pa().array(keep))
    out: dict[str, Any] = {}
    for c in cols:
        out.update(convert_column(c, batch.column(c.name), row0))
    return out, batch.num_rows
