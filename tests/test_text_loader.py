"""headrace.text: exact windows (concat and pad), boundaries, masks, BOS/EOS, resume, sharding."""

from __future__ import annotations

import itertools
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import headrace
from _loader_util import run_checkpoint_roundtrip
from headrace._modal.text import WindowSource, window_counts

BOS, EOS = 2, 1
DOCS = [[10, 11, 12], [20, 21], [], [30, 31, 32, 33, 34]]


def ints(s: str) -> list[int]:
    """A whitespace-separated-ints "tokenizer": the text says which ids to expect."""
    return [int(x) for x in s.split()]


ints.bos_id = BOS  # type: ignore[attr-defined]
ints.eos_id = EOS  # type: ignore[attr-defined]


def token_store(tmp_path, docs, name="tok.hr"):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join(map(str, d)) or " "}) + "\n"
                           for d in docs))
    out = str(tmp_path / name)
    info = headrace.pack_text(str(src), out, tokenizer=ints)
    assert info["documents"] == len(docs)
    return out


@pytest.fixture
def store(tmp_path):
    return token_store(tmp_path, DOCS)


def rows(loader):
    toks, masks, docs = [], [], []
    for b in loader:
        assert b["tokens"].dtype == np.int32 and b["tokens"].shape[1] == loader.sequence_length
        toks += b["tokens"].tolist()
        masks += b["mask"].astype(int).tolist() if b["mask"] is not None else []
        docs += b["doc_ids"].tolist()
    return toks, masks, docs


def reference(docs, *, seq_len, stride, bos, eos, packing, pad, drop_last=False):
    """Independent model: build the block stream(s), then slide while not yet at the end."""
    blocks = [([BOS] if bos else []) + d + ([EOS] if eos else []) for d in docs]
    stream = list(itertools.chain.from_iterable(blocks))
    seqs = [(stream, 0)] if packing == "concat" else [(b, i) for i, b in enumerate(blocks)]
    doc_of = [i for i, b in enumerate(blocks) for _ in b]
    out = []
    for s, d in seqs:
        a = 0
        while a < len(s):
            row = s[a:a + seq_len]
            if not (drop_last and packing == "concat" and len(row) < seq_len):
                first = doc_of[a] if packing == "concat" else d
                out.append((row + [pad] * (seq_len - len(row)),
                            [1] * len(row) + [0] * (seq_len - len(row)), first))
            if a + seq_len >= len(s):
                break
            a += stride
    return out


def test_concat_exact_windows_hand_computed(store):
    # stream: 10 11 12 E 20 21 E E 30 31 32 33 34 E (14 tokens)
    ld = headrace.text(store, seq_len=4, batch=3, pad_id=0)
    assert (ld.sequence_length, ld.stride, ld.windows, len(ld)) == (4, 4, 4, 2)
    toks, masks, docs = rows(ld)
    assert toks == [[10, 11, 12, 1], [20, 21, 1, 1], [30, 31, 32, 33], [34, 1, 0, 0]]
    assert masks == [[1] * 4, [1] * 4, [1] * 4, [1, 1, 0, 0]]
    assert docs == [0, 1, 3, 3]
    # stride < seq_len overlaps, stride > seq_len skips
    toks, _, _ = rows(headrace.text(store, seq_len=4, stride=3, batch=8, pad_id=0))
    assert toks == [[10, 11, 12, 1], [1, 20, 21, 1], [1, 1, 30, 31], [31, 32, 33, 34],
                    [34, 1, 0, 0]]
    toks, _, _ = rows(headrace.text(store, seq_len=4, stride=6, batch=8, pad_id=0))
    assert toks == [[10, 11, 12, 1], [1, 1, 30, 31], [34, 1, 0, 0]]
    toks, _, _ = rows(headrace.text(store, seq_len=4, batch=3, drop_last=True))
    assert toks == [[10, 11, 12, 1], [20, 21, 1, 1], [30, 31, 32, 33]]
    toks, _, _ = rows(headrace.text(store, seq_len=4, batch=2, drop_last=True))  # full batches
    assert toks == [[10, 11, 12, 1], [20, 21, 1, 1]]
    toks, _, _ = rows(headrace.text(store, seq_len=4, batch=3, tail="drop"))
    assert toks == [[10, 11, 12, 1], [20, 21, 1, 1], [30, 31, 32, 33]]


def test_pad_exact_rows_like_mx8(store):
    ld = headrace.text(store, seq_len=4, batch=2, packing="pad", pad_id=0)
    toks, masks, docs = rows(ld)
    assert toks == [[10, 11, 12, 1], [20, 21, 1, 0], [1, 0, 0, 0], [30, 31, 32, 33],
                    [34, 1, 0, 0]]
    assert masks == [[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    assert docs == [0, 1, 2, 3, 3]
    # padding defaults to the EOS id (mx8); a document of exactly seq_len is one full row
    toks, masks, _ = rows(headrace.text(store, seq_len=6, packing="pad", batch=8))
    assert toks[1] == [20, 21, 1, 1, 1, 1] and masks[1] == [1, 1, 1, 0, 0, 0]
    assert toks[3] == [30, 31, 32, 33, 34, 1] and masks[3] == [1] * 6
    # without EOS an empty document has no tokens and so no row
    toks, _, docs = rows(headrace.text(store, seq_len=4, packing="pad", add_eos=False,
                                       batch=8, pad_id=0))
    assert docs == [0, 1, 3, 3] and toks[2] == [30, 31, 32, 33] and toks[3] == [34, 0, 0, 0]


def test_bos_eos_and_mask_off(store):
    toks, _, _ = rows(headrace.text(store, seq_len=5, add_bos=True, add_eos=False, batch=8,
                                    pad_id=0))
    assert list(itertools.chain.from_iterable(toks)) == [2, 10, 11, 12, 2, 20, 21, 2, 2, 30, 31, 32, 33, 34, 0]
    ld = headrace.text(store, seq_len=4, return_mask=False, batch=8)
    b = next(ld)
    assert b["mask"] is None and b["tokens"].shape == (4, 4)
    ld.close()


@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_matches_reference_model_over_a_grid(tmp_path, packing):
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 100, int(n)).tolist() for n in rng.integers(0, 12, 25)]
    docs[3] = []
    path = token_store(tmp_path, docs)
    for seq_len, stride, bos, eos, drop in itertools.product(
            (1, 3, 7, 16), (1, 2, 7, 20), (False, True), (False, True), (False, True)):
        if drop and packing == "pad":
            continue
        want = reference(docs, seq_len=seq_len, stride=stride, bos=bos, eos=eos,
                         packing=packing, pad=0, drop_last=drop)
        with headrace.text(path, seq_len=seq_len, stride=stride, add_bos=bos, add_eos=eos,
                           packing=packing, pad_id=0, batch=5, drop_last=drop,
                           threads=1) as ld:
            toks, masks, dids = rows(ld)
        if drop:  # and full batches of 5 only
            want = want[:len(want) // 5 * 5]
        assert toks == [w[0] for w in want], (seq_len, stride, bos, eos, drop)
        assert masks == [w[1] for w in want]
        assert dids == [w[2] for w in want]


def test_window_counts_rule():
    L = np.array([0, 1, 8, 9, 10, 12])
    assert window_counts(L, 8, 8).tolist() == [0, 1, 1, 2, 2, 2]
    assert window_counts(L, 8, 4).tolist() == [0, 1, 1, 2, 2, 2]
    assert window_counts(L, 8, 12).tolist() == [0, 1, 1, 1, 1, 1]
    assert window_counts(L, 8, 8, full_only=True).tolist() == [0, 0, 1, 1, 1, 1]


def test_truncate_error_and_bad_arguments(store):
    with pytest.raises(ValueError, match=r"token sequence too long for sample_id=3 \(tokens=6 > "
                                         r"sequence_length=4\)"):
        headrace.text(store, seq_len=4, truncate="error", packing="pad")
    headrace.text(store, seq_len=6, truncate="error", packing="pad").close()
    with pytest.raises(headrace.ConfigError, match="sequence_length must be > 0"):
        headrace.text(store, seq_len=0)
    with pytest.raises(headrace.ConfigError, match=r'invalid truncate="left" \(expected: right\|error\)'):
        headrace.text(store, truncate="left")
    with pytest.raises(headrace.ConfigError, match='invalid decode_error_policy="ignore"'):
        headrace.text(store, on_decode_error="ignore")
    with pytest.raises(headrace.ConfigError, match="packing="):
        headrace.text(store, packing="greedy")
    with pytest.raises(headrace.ConfigError, match="stride must be > 0"):
        headrace.text(store, stride=0)


def test_missing_special_ids(tmp_path):
    out = str(tmp_path / "plain.hr")
    with headrace.create(out, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
        w.append({"tokens": [np.arange(5, dtype=np.int32)]})
        w.commit()
    with pytest.raises(headrace.ConfigError, match="add_eos=True but tokenizer has no known EOS"):
        headrace.text(out, seq_len=4)
    with pytest.raises(headrace.ConfigError, match="add_bos=True but tokenizer has no known BOS"):
        headrace.text(out, seq_len=4, add_bos=True, add_eos=False)
    toks, _, _ = rows(headrace.text(out, seq_len=4, eos_id=99, pad_id=0))
    assert toks == [[0, 1, 2, 3], [4, 99, 0, 0]]


def test_tokenizer_mismatch_is_refused(store):
    with pytest.raises(headrace.ConfigError, match="tokens were made by tokenizer"):
        headrace.text(store, tokenizer="bytes")
    headrace.text(store, tokenizer=ints).close()  # the same callable is accepted
    # the ids the store recorded are used when no tokenizer is given
    toks, _, _ = rows(headrace.text(store, seq_len=14, add_bos=True, add_eos=False, batch=1))
    assert toks[0][:4] == [BOS, 10, 11, 12]


def _big_store(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.integers(3, 1000, int(n)).tolist() for n in rng.integers(0, 40, 60)]
    return token_store(tmp_path, docs, name="big.hr"), docs


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("packing", ["concat", "pad"])
def test_resume_is_exact_at_many_points(tmp_path, shuffle, packing):
    path, _ = _big_store(tmp_path)

    def make(resume=None):
        return headrace.text(path, seq_len=16, stride=12, batch=7, packing=packing,
                             shuffle=shuffle, seed=5, epochs=2, add_bos=True, resume=resume,
                             threads=2)

    with make() as ld:
        n = len(ld)
    run_checkpoint_roundtrip(make, [0, 1, 2, n // 3, n // 2 + 1, n - 1, n])


def test_shuffle_is_a_permutation_of_windows_per_epoch(tmp_path):
    path, _ = _big_store(tmp_path)
    with headrace.text(path, seq_len=16, batch=8, epochs=1) as seq:
        ref, _, _ = rows(seq)
    with headrace.text(path, seq_len=16, batch=8, shuffle=True, seed=3, epochs=2) as ld:
        ids = []
        got = []
        for b in ld:
            ids += ld.last_ids.tolist()
            got += b["tokens"].tolist()
    n = len(ref)
    assert sorted(ids[:n]) == list(range(n)) and sorted(ids[n:]) == list(range(n))
    assert ids[:n] != list(range(n)) and ids[:n] != ids[n:]
    assert [got[i] for i in np.argsort(ids[:n])] == ref


def test_world_size_sharding_covers_every_window_once(tmp_path):
    path, _ = _big_store(tmp_path)
    with headrace.text(path, seq_len=16, batch=4) as ld:
        total = ld.windows
    seen, counts = [], []
    for rank in range(3):
        with headrace.text(path, seq_len=16, batch=4, shuffle=True, seed=9, rank=rank,
                           world_size=3) as ld:
            rows = 0
            for b in ld:
                assert b["tokens"].shape[1:] == (16,)
                seen += ld.last_ids.tolist()
                rows += len(b["tokens"])
            counts.append(rows)
    # tail="pad" (several ranks): ceil(windows / 3) windows on every rank, as DistributedSampler
    assert counts == [-(-total // 3)] * 3
    assert set(seen) == set(range(total)) and total <= len(seen) < total + 3


def test_raw_text_folder_is_packed_to_a_temp_store(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("hi")
    (raw / "b.txt").write_bytes(b"\xff\xfe bad")
    (raw / "c.txt").write_text("é")
    with pytest.raises(headrace.DecodeError, match=r"document 1 .*b\.txt") as ei:
        headrace.text(str(raw), seq_len=4, cache_dir=str(tmp_path))
    assert ei.value.record_id == 1
    assert sorted(os.listdir(tmp_path)) == ["raw"]  # no temp store left behind
    ld = headrace.text(str(raw), seq_len=4, on_decode_error="skip", cache_dir=str(tmp_path))
    toks, masks, docs = rows(ld)
    assert toks == [[104, 105, 257, 0xC3], [0xA9, 257, 257, 257]]
    assert masks == [[1, 1, 1, 1], [1, 1, 0, 0]] and docs == [0, 1]
    assert ld.stats()["decode_errors_total"] == 1
    assert ld.stats()["tokens_delivered_total"] == 8
    ld.close()
    assert sorted(os.listdir(tmp_path)) == ["raw"]


def test_to_torch_and_repr(store):
    import torch

    with headrace.text(store, seq_len=4, batch=2, to_torch=True) as ld:
        b = next(ld)
        assert isinstance(b["tokens"], torch.Tensor) and b["tokens"].dtype == torch.int32
        assert b["mask"].dtype == torch.bool
        assert "TextLoader(" in repr(ld)
        s = ld.stats()
        assert s["windows"] == 4 and s["documents"] == 4 and s["tokens_total"] == 14


def test_checkpoint_from_other_settings_is_refused(store):
    with headrace.text(store, seq_len=4, batch=2) as ld:
        next(ld)
        tok = ld.checkpoint()
    with pytest.raises(headrace.CheckpointError):
        headrace.text(store, seq_len=4, stride=3, batch=2, resume=tok)


def test_raw_text_resume_repacks_to_the_same_stream(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(6):
        (raw / f"{i}.txt").write_text("word " * (3 + 5 * i))

    def make(resume=None):
        return headrace.text(str(raw), seq_len=8, batch=2, shuffle=True, seed=4,
                             cache_dir=str(tmp_path), resume=resume)

    with make() as ld:
        n = len(ld)
    run_checkpoint_roundtrip(make, [1, n // 2, n - 1])


def test_hf_tokenizer_file_end_to_end(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "[EOS]": 1, "[BOS]": 2, "x": 3, "y": 4},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[EOS]", "[BOS]"])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    (tmp_path / "d.jsonl").write_text('{"text": "x y"}\n{"text": "y y x z"}\n')
    headrace.pack_text(str(tmp_path / "d.jsonl"), str(tmp_path / "t.hr"), tokenizer=path)
    with headrace.text(str(tmp_path / "t.hr"), tokenizer=path, seq_len=5, add_bos=True,
                       batch=4) as ld:
        toks, masks, _ = rows(ld)
    assert toks == [[2, 3, 4, 1, 2], [4, 4, 3, 0, 1]] and masks == [[1] * 5, [1] * 5]
    assert headrace.stats(ld, raw=True)["tokens_delivered_total"] == 10


def test_empty_token_store_is_refused(tmp_path):
    out = str(tmp_path / "empty.hr")
    with headrace.create(out, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
        w.commit()
    with pytest.raises(headrace.ConfigError, match="holds no token windows"):  # never empty
        headrace.text(out, seq_len=4, eos_id=1)


def test_checkpoint_resumes_on_another_world_size(tmp_path):
    path, _ = _big_store(tmp_path)
    with headrace.text(path, seq_len=16, batch=4, shuffle=True, seed=2) as ld:
        total = ld.windows
    seen = []
    tokens = []
    for rank in range(2):
        with headrace.text(path, seq_len=16, batch=4, shuffle=True, seed=2, rank=rank,
                           world_size=2, tail="partial") as ld:
            for _ in range(3):
                next(ld)
                seen += ld.last_ids.tolist()
            tokens.append(ld.checkpoint())
    with headrace.text(path, seq_len=16, batch=4, shuffle=True, seed=2,
                       resume=tokens[0]) as ld:
        for _ in ld:
            seen += ld.last_ids.tolist()
    assert sorted(seen) == list(range(total))


def test_stream_tokenizes_in_the_loader_like_mx8(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    texts = ["ab", "hello world", "é" * 5, "x" * 9, "q"]
    for i, t in enumerate(texts):
        (raw / f"{i}.txt").write_text(t)
    packed = str(tmp_path / "p.hr")
    headrace.pack_text(str(raw), packed)
    with headrace.text(packed, seq_len=4, stride=3, packing="pad", add_bos=True,
                       batch=64) as ld:
        want, want_mask, want_docs = rows(ld)
    ms = str(tmp_path / "manifests")
    with headrace.text(str(raw), stream=True, packing="pad", seq_len=4, stride=3, add_bos=True,
                       batch=2, store=ms) as ld:
        assert ld.windows is None and ld.documents == 5
        got, got_mask, got_docs = [], [], []
        sizes = []
        for b in ld:
            sizes.append(len(b["tokens"]))
            got += b["tokens"].tolist()
            got_mask += b["mask"].astype(int).tolist()
            got_docs += b["doc_ids"].tolist()
    assert (got, got_mask, got_docs) == (want, want_mask, want_docs)
    assert len(sizes) == 3 and sizes != [2, 2, 1]  # batch counts documents; rows vary

    def make(resume=None):
        return headrace.text(str(raw), stream=True, packing="pad", seq_len=4, batch=2,
                             shuffle=True, seed=1, store=ms, resume=resume)

    run_checkpoint_roundtrip(make, [1, 2])
    with pytest.raises(headrace.ConfigError, match="stream=True cuts each document"):
        headrace.text(str(raw), stream=True, store=ms)


def test_stream_bad_utf8_policy(tmp_path):
    src = str(tmp_path / "texts.hr")
    with headrace.create(src, fields={"text": "bytes"}) as w:
        w.append({"text": [b"ok", b"\xc3(", b"fine"]})
        w.commit()
    with headrace.text(src, stream=True, packing="pad", seq_len=8, batch=8) as ld, \
            pytest.raises(headrace.DecodeError, match="document 1 is not valid UTF-8") as ei:
        next(ld)
    assert ei.value.record_id == 1
    with headrace.text(src, stream=True, packing="pad", seq_len=8, batch=1,
                       on_decode_error="skip", pad_id=0) as ld:
        toks, _, docs = rows(ld)
        assert ld.stats()["decode_errors_total"] == 1
    assert toks == [[111, 107, 257, 0, 0, 0, 0, 0], [102, 105, 110, 101, 257, 0, 0, 0]]
    assert docs == [0, 2]
    with headrace.text(src, stream=True, packing="pad", seq_len=2, batch=8,
                       truncate="error", on_decode_error="skip") as ld, \
            pytest.raises(headrace.ConfigError, match="sample_id=0 \\(tokens=3"):
        next(ld)


def test_compressed_token_store_gives_the_same_windows(tmp_path, store):
    out = str(tmp_path / "z.hr")
    with headrace.create(out, fields={"tokens": {"dtype": "int32", "shape": None,
                                                 "codec": "zstd"}},
                         attrs={"text": {"eos_id": EOS, "bos_id": BOS}}) as w:
        w.append({"tokens": [np.asarray(d, np.int32) for d in DOCS]})
        w.commit()
    for kw in ({"stride": 3}, {"packing": "pad", "add_bos": True}):
        with headrace.text(out, seq_len=4, batch=3, **kw) as a, \
                headrace.text(store, seq_len=4, batch=3, **kw) as b:
            assert rows(a) == rows(b)
    with headrace.text(out, seq_len=4) as ld, pytest.raises(headrace.RecordIndexError):
        ld.source.gather(np.array([ld.windows]))


@settings(max_examples=40, deadline=None)
@given(docs=st.lists(st.lists(st.integers(3, 99), max_size=12), max_size=12),
       seq_len=st.integers(1, 10), stride=st.integers(1, 12), bos=st.booleans(),
       eos=st.booleans(), packing=st.sampled_from(["concat", "pad"]), drop=st.booleans())
def test_window_source_matches_reference_property(docs, seq_len, stride, bos, eos, packing,
                                                   drop):
    drop = drop and packing == "concat"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.hr")
        with headrace.create(path, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
            if docs:
                w.append({"tokens": [np.asarray(d, np.int32) for d in docs]})
            w.commit()
        with headrace.open(path) as store:
            src = WindowSource(store, field="tokens", packing=packing, seq_len=seq_len,
                               stride=stride, add_bos=bos, add_eos=eos, bos_id=BOS,
                               eos_id=EOS, pad_id=0, drop_last=drop, return_mask=True,
                               truncate="right")
            want = reference(docs, seq_len=seq_len, stride=stride, bos=bos, eos=eos,
                             packing=packing, pad=0, drop_last=drop)
            assert len(src) == len(want)
            if want:
                ids = np.random.default_rng(0).permutation(len(want))
                got = src.gather(ids)
                assert got["tokens"].tolist() == [want[i][0] for i in ids]
                assert got["mask"].astype(int).tolist() == [want[i][1] for i in ids]
                assert got["doc_ids"].tolist() == [want[i][2] for i in ids]
