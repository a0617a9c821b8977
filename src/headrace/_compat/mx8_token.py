"""mx8 1.0.7's ``mx8_checkpoint_v1`` tokens given to ``headrace.mx8``'s ``resume=``.

A local mx8 loader reads its records in id order, so its ``data_loader`` token (``manifest_hash``,
``schema_version``, ``epoch``, ``next_sample_id``, ``end_id``) is an exact position: the loader is
built as asked, the token is checked as mx8 checks it (same messages), and the loader moves to
``next_sample_id`` of its range, where mx8's batches continue. What the loader then checkpoints is
headrace's token over the same range, so a later restart with the same call resumes too.

A ``mix_loader`` token carries mx8's schedule (ticks, the SWRR current values, counters) and every
source's data_loader token: headrace restores both, so the rest is the stream the uninterrupted
mix yields (mx8 restores the schedule only and continues from wherever the sources are). A
``distributed_loader`` token cannot be resumed exactly: it lists the 65 536-sample leases mx8's
coordinator handed out, and headrace ranks read round-robin batches.
"""

from __future__ import annotations

from typing import Any

from headrace._base.errors import CheckpointError

__all__ = ["mix_state", "moved", "parse", "resume_at"]

_MAGIC = b"mx8_checkpoint_v1"


def parse(resume: Any, *, kind: str = "data_loader") -> dict[str, str] | None:
    """The fields of an mx8 token of ``kind`` (``data_loader`` or ``mix_loader``), ``None`` for
    anything else (headrace's own tokens and state dicts); another mx8 kind raises
    ``CheckpointError`` with mx8's ``unsupported checkpoint kind`` and why."""
    if not isinstance(resume, bytes | bytearray) or not bytes(resume).startswith(_MAGIC):
        return None
    lines = bytes(resume).decode("utf-8", "replace").splitlines()
    fields = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    got = fields.get("kind", "?")
    if got == kind:
        need = _NEEDS[kind]
        missing = [k for k in need if k not in fields]
        if missing or not all(fields[k].isdigit() for k in need if k in _SCALARS):
            raise CheckpointError(f"unsupported checkpoint token format: an mx8 {kind} token "
                                  f"needs {', '.join(need)} (missing or not integers: "
                                  f"{missing or 'some'})")
        return fields
    if got == "distributed_loader":
        why = ("it lists the sample ranges mx8's coordinator leased (completed ranges), and "
               "headrace has no coordinator: its ranks read round-robin batches, so no headrace "
               "position is the same stream. Start again, or from the sample range you know "
               "was read (start=, end=)")
    elif got in _NEEDS:
        why = (f"a {got} token resumes "
               + ("one source (mx8.load(..., resume=token)), not this loader"
                  if got == "data_loader" else "mx8.mix(..., resume=token), not this loader"))
    else:
        why = "headrace reads mx8's data_loader and mix_loader tokens"
    raise CheckpointError(f"unsupported checkpoint kind {got}: resume= is an mx8 {got!r} "
                          f"checkpoint token; {why}")


_SCALARS = ("schema_version", "epoch", "next_sample_id", "end_id", "seed", "source_count",
            "schedule_ticks")
_NEEDS = {
    "data_loader": ("manifest_hash", "schema_version", "epoch", "next_sample_id", "end_id"),
    "mix_loader": ("seed", "epoch", "source_count", "schedule_ticks", "scheduler_current",
                   "active", "source_checkpoints"),
}


def moved(state: dict[str, Any], token: dict[str, str], *,
          epoch: int | None = 0) -> dict[str, Any]:
    """A loader's fresh ``state_dict()`` moved to where mx8's data_loader ``token`` stopped (see
    :func:`resume_at`)."""
    state = dict(state)
    _moved_body(state, token, epoch)
    return state


def resume_at(loader: Any, token: dict[str, str], *, epoch: int | None = 0) -> None:
    """Move ``loader`` (just built, nothing delivered) to where mx8's ``token`` stopped.

    Checks what mx8 checks, in its words: schema version, manifest hash (the loader's data must
    be the mx8 pack or manifest the token came from), epoch and ``end_id`` (the loader's range
    end), and ``next_sample_id <= end_id``. ``epoch=None``: not checked (mx8's image loader
    keeps its augmentation ``epoch`` out of its tokens, which always say 0).
    """
    loader.load_state_dict(moved(loader.state_dict(), token, epoch=epoch))


def _moved_body(state: dict[str, Any], token: dict[str, str], epoch: int | None) -> None:
    if state.get("kind") != "loader":
        raise CheckpointError("an mx8 data_loader token resumes a single loader (load, image, "
                              "text, audio, DataLoader), not this one")
    if token["schema_version"] != "0":
        raise CheckpointError(f"resume_from schema_version mismatch: "
                              f"token={token['schema_version']} current=0")
    fp = str(state["fingerprint"])
    current = fp.split(":", 1)[1] if fp.startswith("mx8:") else fp
    if token["manifest_hash"] != current:
        raise CheckpointError(f"resume_from manifest_hash mismatch: "
                              f"token={token['manifest_hash']} current={current} (an mx8 token "
                              "resumes the mx8 pack or dataset link it was taken on)")
    if epoch is not None and int(token["epoch"]) != epoch:
        raise CheckpointError(f"resume_from epoch mismatch: token={token['epoch']} "
                              f"current={epoch}")
    nxt, end_id = int(token["next_sample_id"]), int(token["end_id"])
    start, end = int(state["start"]), int(state["end"])
    if end_id != end:
        raise CheckpointError(f"resume_from end_id mismatch: token={end_id} current={end}")
    if nxt > end_id:
        raise CheckpointError("invalid checkpoint token range (next_sample_id > end_id)")
    if nxt < start:
        raise CheckpointError(f"the mx8 token stopped before sample {nxt}, which is before this "
                              f"loader's start={start}: pass start <= {nxt} (mx8 reads from the "
                              "token's sample whatever start says)")
    if state["order"] != "sequential" or int(state["world_size"]) != 1:
        raise CheckpointError("an mx8 data_loader token is a position in a local sequential "
                              "read; this loader reads another order or one rank's share")
    length = int(state["length"])
    state["position"] = int(state["position"]) + (nxt - start)
    state["epoch"] = state["position"] // length if length else int(state["epoch"])


#: mx8 mix token lists -> headrace mix state keys (the same counters, one per source)
_MIX_LISTS = {"scheduler_current": "scheduler_current", "active": "active",
              "delivered_batches": "delivered_batches", "delivered_samples": "delivered_samples",
              "delivered_bytes": "delivered_bytes", "starvation_total": "starvation_total",
              "source_exhausted_total": "exhausted_total", "steps_since_emit": "steps_since_emit"}


def mix_state(state: dict[str, Any], token: dict[str, str]) -> dict[str, Any]:
    """A mix's fresh ``state_dict()`` moved to where mx8's mix_loader ``token`` stopped: mx8's
    schedule (ticks, SWRR current values, counters) and every source at its own data_loader
    token (mx8 restores the schedule only; the sources' tokens are in the mix token, so
    headrace puts them back too). Checks mx8's seed/epoch/source_count, in its words."""
    state = dict(state)
    for key in ("seed", "epoch", "source_count"):
        if int(token[key]) != int(state[key]):
            raise CheckpointError(f"resume_from {key} mismatch: token={token[key]} "
                                  f"current={state[key]}")
    n = int(state["source_count"])
    for theirs, ours in _MIX_LISTS.items():
        raw = token.get(theirs)
        if raw is None:
            continue
        values = [int(v) for v in raw.split(",")] if raw else []
        if len(values) != n:
            raise CheckpointError(f"unsupported checkpoint token format: {theirs} has "
                                  f"{len(values)} values for {n} sources")
        state[ours] = values
    state["schedule_ticks"] = int(token["schedule_ticks"])
    state["snapshot_emitted_total"] = int(token.get("snapshot_emitted_total", "0"))
    hexes = token["source_checkpoints"].split(";")
    if len(hexes) != n:
        raise CheckpointError(f"unsupported checkpoint token format: {len(hexes)} "
                              f"source_checkpoints for {n} sources")
    sources = []
    for i, (h, src) in enumerate(zip(hexes, state["sources"], strict=True)):
        try:
            blob = bytes.fromhex(h)
        except ValueError:
            raise CheckpointError(f"unsupported checkpoint token format: source_checkpoints "
                                  f"entry {i} is not hex") from None
        fields = parse(blob)
        if fields is None:
            raise CheckpointError(f"unsupported checkpoint token format: source_checkpoints "
                                  f"entry {i} is not an mx8 data_loader token")
        sources.append(moved(src, fields))
    state["sources"] = sources
    return state
