"""Checkpoint tokens: a few integers that say exactly what the consumer has received.

A token is compact JSON (ASCII bytes, at most ``MAX_TOKEN_BYTES`` for one loader) tagged with
``FORMAT`` and a ``kind``. Because order is a pure function of ``(mode, seed, N, position)``, the
position of the first global sample not yet delivered is enough to continue the same stream; the
other keys exist to refuse a resume that would silently read a different stream (other data,
seed, batch size or order).

Every loader kind speaks this one format: ``checkpoint()`` returns the token, ``state_dict()`` the
same JSON object decoded (a plain dict, the torchdata ``StatefulDataLoader`` convention), and
``resume=`` / ``load_state_dict()`` accept either. A composite loader (``headrace.mix``) nests its
sources' state dicts inside its own body: :func:`encode_body` / :func:`decode_body` are the
format's two halves for any ``kind``, and :func:`as_token` / :func:`as_state` convert between a
token and its dict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from headrace._base.errors import CheckpointError

__all__ = ["FORMAT", "MAX_TOKEN_BYTES", "LoaderState", "adopt_epochs", "as_state", "as_token",
           "decode", "decode_body", "encode", "encode_body", "encoder", "fingerprint_key",
           "validate"]

FORMAT = "headrace-ckpt-1"
MAX_TOKEN_BYTES = 1024
_MAX_FINGERPRINT_CHARS = 160

# Token keys, named once. Values: ints, except fingerprint and order (str).
K_FORMAT = "format"
K_KIND = "kind"


@dataclass(frozen=True)
class LoaderState:
    """What a loader's consumer has received, plus what must match on resume.

    Attributes:
        position: global position of the first sample not yet delivered (counts every rank's
            samples: rank ``r`` of ``W`` reads positions ``position + (k*W + r)*batch ...``).
        epoch: the epoch ``position`` falls in (``position // length`` for a non-empty source).
        seed, order, batch, length: must match the resuming loader.
        start, end: the record range ``[start, end)`` the order maps into (``load(start=, end=)``).
        fingerprint: the source's data version (store identity and generation); must match.
        rank, world_size: informational; a different world size resumes the same global stream.
    """

    position: int
    epoch: int
    seed: int
    order: str
    batch: int
    length: int
    start: int
    end: int
    fingerprint: str
    rank: int
    world_size: int


def fingerprint_key(fingerprint: str) -> str:
    """The form stored in a token: the fingerprint itself, or its sha256 when it is long."""
    if len(fingerprint) <= _MAX_FINGERPRINT_CHARS:
        return fingerprint
    return "sha256:" + hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()


def encode_body(kind: str, body: Mapping[str, Any], *,
                max_bytes: int = MAX_TOKEN_BYTES) -> bytes:
    """A token of ``kind`` holding ``body`` (JSON values; ``format``/``kind`` come first).

    Raises:
        CheckpointError: the token would exceed ``max_bytes`` (refused, never truncated).
    """
    full = {K_FORMAT: FORMAT, K_KIND: kind}
    full.update((k, v) for k, v in body.items() if k not in (K_FORMAT, K_KIND))
    try:
        token = json.dumps(full, separators=(",", ":"), ensure_ascii=True,
                           allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"a {kind} checkpoint holds a value JSON cannot carry: {e}") from None
    if len(token) > max_bytes:
        raise CheckpointError(f"checkpoint token would be {len(token)} bytes "
                              f"(> {max_bytes}); this is a bug, please report it")
    return token


def decode_body(token: Any, *, kind: str, max_bytes: int = MAX_TOKEN_BYTES,
                what: str = "this loader") -> dict[str, Any]:
    """The JSON object of a token made by :func:`encode_body` with this ``kind``.

    ``token`` may also be the dict itself (a ``state_dict()``); it is checked the same way.

    Raises:
        CheckpointError: not bytes or a state dict, empty, too large, not a headrace token,
            or of another kind.
    """
    if isinstance(token, Mapping):
        body: Any = dict(token)
    else:
        if isinstance(token, bytearray | memoryview):
            token = bytes(token)
        if not isinstance(token, bytes):
            raise CheckpointError(f"resume must be the bytes returned by checkpoint() (or the "
                                  f"dict returned by state_dict()), got {type(token).__name__}")
        if not token:
            raise CheckpointError("empty checkpoint token")
        if len(token) > max_bytes:
            raise CheckpointError(f"checkpoint token is {len(token)} bytes; headrace tokens "
                                  f"are at most {max_bytes}")
        try:
            body = json.loads(token.decode("ascii"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise CheckpointError("unsupported checkpoint token format (not a headrace token; "
                                  f"expected JSON tagged {FORMAT!r})") from None
    if not isinstance(body, dict) or body.get(K_FORMAT) != FORMAT:
        got = body.get(K_FORMAT) if isinstance(body, dict) else None
        raise CheckpointError(f"unsupported checkpoint token format {got!r}; expected {FORMAT!r}")
    if body.get(K_KIND) != kind:
        raise CheckpointError(f"unsupported checkpoint kind {body.get(K_KIND)!r} for {what} "
                              f"(expected {kind!r})")
    return body


def as_token(state: Any) -> bytes:
    """``state`` (a token or a ``state_dict()``) as token bytes, unchanged when already bytes."""
    if isinstance(state, Mapping):
        kind = state.get(K_KIND)
        return encode_body(kind if isinstance(kind, str) else "?", state,
                           max_bytes=1 << 62)
    if isinstance(state, bytearray | memoryview):
        return bytes(state)
    out: bytes = state  # anything else: decode() says what is wrong with it
    return out


def as_state(token: bytes) -> dict[str, Any]:
    """A token's JSON object: what ``state_dict()`` returns (plain, JSON-able values)."""
    body = json.loads(token)
    assert isinstance(body, dict)
    return body


def encode(state: LoaderState) -> bytes:
    """Serialize ``state`` to a token of at most ``MAX_TOKEN_BYTES`` bytes."""
    body = asdict(state)
    body["fingerprint"] = fingerprint_key(state.fingerprint)
    return encode_body("loader", body)


def encoder(state: LoaderState) -> Callable[[int, int], bytes]:
    """``fn(position, epoch)``: ``encode`` of ``state`` at that position, byte for byte.

    Everything but the position and epoch is constant for a loader, so it is serialized once
    here (a loader's ``checkpoint()`` may run every step); each call formats two integers.
    """
    marked = encode(replace(state, position=0, epoch=0))
    key = b'"position":0,"epoch":0,'
    at = marked.index(key)  # the first keys are fixed: format, kind, position, epoch
    head = marked[:at] + b'"position":'
    tail = marked[at + len(key) - 1:]  # from the comma after the epoch
    room = MAX_TOKEN_BYTES - (len(marked) - 2)  # bytes left for the two integers

    def encode_at(position: int, epoch: int) -> bytes:
        pos, ep = b"%d" % position, b"%d" % epoch
        if len(pos) + len(ep) > room:  # as encode: refuse, never truncate
            return encode(replace(state, position=position, epoch=epoch))
        return head + pos + b',"epoch":' + ep + tail

    return encode_at


def decode(token: Any) -> LoaderState:
    """Parse a token made by ``encode`` (or its ``state_dict()`` form).

    Raises:
        CheckpointError: not bytes, empty, too large, not a headrace token, or malformed.
    """
    body = decode_body(token, kind="loader", what="a Loader")
    values: dict[str, Any] = {}
    for f in fields(LoaderState):
        v = body.get(f.name)
        want_str = f.name in ("order", "fingerprint")
        ok = isinstance(v, str) if want_str else (isinstance(v, int) and not isinstance(v, bool))
        if not ok:
            raise CheckpointError(f"checkpoint token has a missing or bad {f.name!r}: {v!r}")
        values[f.name] = v
    state = LoaderState(**values)
    if state.position < 0 or state.batch < 1 or state.length < 0 or state.world_size < 1:
        raise CheckpointError(f"checkpoint token holds impossible values: {state}")
    return state


def validate(token: LoaderState, current: LoaderState) -> None:
    """Refuse a token that would resume a different stream than ``current`` reads.

    Raises:
        CheckpointError: naming each mismatched key with the token's and the current value.
    """
    problems = []
    for key in ("fingerprint", "length", "start", "end", "seed", "order", "batch"):
        a = getattr(token, key)
        b = getattr(current, key)
        if key == "fingerprint":
            b = fingerprint_key(b)
        if a != b:
            problems.append(f"{key} mismatch: token={a!r} current={b!r}")
    if problems:
        hint = ("the data changed (a new generation or another dataset)"
                if any(p.startswith(("fingerprint", "length")) for p in problems)
                else "resume with the same seed, order and batch size as the checkpointed run")
        raise CheckpointError("cannot resume from this checkpoint: " + "; ".join(problems)
                              + f" ({hint})")


def adopt_epochs(token: LoaderState, *, first_epoch: int,
                 epochs: int | None) -> tuple[int, int | None]:
    """The epochs ``[first, end)`` (``end`` None: endless) a loader restored from ``token`` reads.

    A token inside the loader's own epochs (``first_epoch`` .. ``first_epoch + epochs``, its very
    end included: that resumes as finished) keeps them. A token from elsewhere moves the loader to
    the token's epoch and keeps the epoch count: a loader built with ``epochs=1`` and restored
    from a token of epoch 2 reads the rest of epoch 2.
    """
    n = token.length
    end = None if epochs is None else first_epoch + epochs
    if token.position >= first_epoch * n and (end is None or token.position <= end * n):
        return first_epoch, end
    first = token.position // n if n else token.epoch
    return first, None if epochs is None else first + epochs
