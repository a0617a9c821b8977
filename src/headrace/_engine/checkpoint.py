"""Checkpoint tokens: a few integers that say exactly what the consumer has received.

A token is compact JSON (ASCII bytes, at most ``MAX_TOKEN_BYTES``) tagged with ``FORMAT``. Because
order is a pure function of ``(mode, seed, N, position)``, the position of the first global sample
not yet delivered is enough to continue the same stream; the other keys exist to refuse a resume
that would silently read a different stream (other data, seed, batch size or order).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from headrace._base.errors import CheckpointError

__all__ = ["FORMAT", "MAX_TOKEN_BYTES", "LoaderState", "decode", "encode", "encoder",
           "fingerprint_key", "validate"]

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


def encode(state: LoaderState) -> bytes:
    """Serialize ``state`` to a token of at most ``MAX_TOKEN_BYTES`` bytes."""
    body = {K_FORMAT: FORMAT, K_KIND: "loader", **asdict(state)}
    body["fingerprint"] = fingerprint_key(state.fingerprint)
    token = json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(token) > MAX_TOKEN_BYTES:  # only possible with absurd integers; refuse, never truncate
        raise CheckpointError(f"checkpoint token would be {len(token)} bytes "
                              f"(> {MAX_TOKEN_BYTES}); this is a bug, please report it")
    return token


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
    """Parse a token made by ``encode``.

    Raises:
        CheckpointError: not bytes, empty, too large, not a headrace token, or malformed.
    """
    if isinstance(token, bytearray | memoryview):
        token = bytes(token)
    if not isinstance(token, bytes):
        raise CheckpointError(f"resume must be the bytes returned by checkpoint(), got "
                              f"{type(token).__name__}")
    if not token:
        raise CheckpointError("empty checkpoint token")
    if len(token) > MAX_TOKEN_BYTES:
        raise CheckpointError(f"checkpoint token is {len(token)} bytes; headrace tokens are at "
                              f"most {MAX_TOKEN_BYTES}")
    try:
        body = json.loads(token.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError("unsupported checkpoint token format (not a headrace token; "
                              f"expected JSON tagged {FORMAT!r})") from None
    if not isinstance(body, dict) or body.get(K_FORMAT) != FORMAT:
        got = body.get(K_FORMAT) if isinstance(body, dict) else None
        raise CheckpointError(f"unsupported checkpoint token format {got!r}; expected {FORMAT!r}")
    if body.get(K_KIND) != "loader":
        raise CheckpointError(f"unsupported checkpoint kind {body.get(K_KIND)!r} for a Loader "
                              "(expected 'loader')")
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


def validate(token: LoaderState, current: LoaderState, *, first_epoch: int,
             last_epoch: int | None) -> None:
    """Refuse a token that would resume a different stream than ``current`` reads.

    ``first_epoch``/``last_epoch`` (exclusive; None when endless) bound the epochs this loader
    reads; a token from outside them is refused (a token at the very end resumes as exhausted).

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
    lo = first_epoch * token.length
    hi = None if last_epoch is None else last_epoch * token.length
    if token.position < lo or (hi is not None and token.position > hi):
        span = f"[{first_epoch}, {last_epoch})" if last_epoch is not None else f">= {first_epoch}"
        raise CheckpointError(f"resume epoch mismatch: token epoch={token.epoch} "
                              f"(position {token.position}) is outside this loader's epochs "
                              f"{span}; pass epoch={token.epoch}")
