"""mx8 1.0.7's ``mx8_checkpoint_v1`` tokens given to ``headrace.mx8``'s ``resume=``.

A local mx8 loader reads its records in id order, so its ``data_loader`` token (``manifest_hash``,
``schema_version``, ``epoch``, ``next_sample_id``, ``end_id``) is an exact position: the loader is
built as asked, the token is checked as mx8 checks it (same messages), and the loader moves to
``next_sample_id`` of its range, where mx8's batches continue. What the loader then checkpoints is
headrace's token over the same range, so a later restart with the same call resumes too.

The other kinds cannot be resumed exactly: a ``distributed_loader`` token lists the 65 536-sample
leases mx8's coordinator handed out (headrace ranks read round-robin batches), and a
``mix_loader`` token restores mx8's schedule but not its sources' positions (mx8 itself continues
"best effort" from wherever the sources are).
"""

from __future__ import annotations

from typing import Any

from headrace._base.errors import CheckpointError

__all__ = ["parse", "resume_at"]

_MAGIC = b"mx8_checkpoint_v1"


def parse(resume: Any) -> dict[str, str] | None:
    """The fields of an mx8 ``data_loader`` token, ``None`` for anything else (headrace's own
    tokens and state dicts); other mx8 kinds raise ``CheckpointError`` saying why."""
    if not isinstance(resume, bytes | bytearray) or not bytes(resume).startswith(_MAGIC):
        return None
    lines = bytes(resume).decode("utf-8", "replace").splitlines()
    fields = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    kind = fields.get("kind", "?")
    if kind == "data_loader":
        missing = [k for k in ("manifest_hash", "schema_version", "epoch", "next_sample_id",
                               "end_id") if k not in fields]
        if missing or not all(fields[k].isdigit() for k in ("epoch", "next_sample_id",
                                                             "end_id")):
            raise CheckpointError(f"unsupported checkpoint token format: an mx8 data_loader "
                                  f"token needs integer next_sample_id/end_id/epoch and a "
                                  f"manifest_hash (missing: {missing or 'none'})")
        return fields
    if kind == "distributed_loader":
        why = ("it lists the sample ranges mx8's coordinator leased (completed ranges), and "
               "headrace has no coordinator: its ranks read round-robin batches, so no headrace "
               "position is the same stream")
    elif kind == "mix_loader":
        why = ("it restores mx8's schedule but not where its sources were (mx8 continues 'best "
               "effort' from the sources' current positions); resume each source with its own "
               "token (the hex source_checkpoints, bytes.fromhex(...)) and mix them again, or "
               "use headrace's mix token, which restores schedule and sources exactly")
    else:
        why = "only mx8 data_loader tokens name a position headrace can read"
    raise CheckpointError(f"resume= is an mx8 {kind!r} checkpoint token that headrace cannot "
                          f"resume exactly: {why}. Start again, or from the sample range you "
                          "know was read (start=, end=)")


def resume_at(loader: Any, token: dict[str, str], *, epoch: int | None = 0) -> None:
    """Move ``loader`` (just built, nothing delivered) to where mx8's ``token`` stopped.

    Checks what mx8 checks, in its words: schema version, manifest hash (the loader's data must
    be the mx8 pack or manifest the token came from), epoch and ``end_id`` (the loader's range
    end), and ``next_sample_id <= end_id``. ``epoch=None``: not checked (mx8's image loader
    keeps its augmentation ``epoch`` out of its tokens, which always say 0).
    """
    state = dict(loader.state_dict())
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
    loader.load_state_dict(state)
