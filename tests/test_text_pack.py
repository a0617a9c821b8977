"""pack_text and the tokenizer adapters: inputs (.txt/.jsonl, folders, S3, stores), tokenizer
identity in attrs, special ids, bad UTF-8 policy, Hugging Face tokenizers built offline."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import headrace
from _s3_server import new_bucket, s3_env, shared_server
from headrace._pack.tokenizer import ByteTokenizer, as_tokenizer
from headrace._remote.objstore import ObjectStore, S3Options


def word_tokenizer() -> Tokenizer:
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "<s>": 2, "[PAD]": 3}
    for i, w in enumerate(["the", "cat", "sat", "on", "mat", "a", "dog"]):
        vocab[w] = 4 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>", "<s>", "[PAD]"])
    return tok


def tokens(path):
    with headrace.open(path) as st:
        return [r.tolist() for r in st.gather(np.arange(len(st)), "tokens")["tokens"].to_list()]


def test_byte_tokenizer_roundtrip():
    bt = as_tokenizer(None)
    assert isinstance(bt, ByteTokenizer)
    (ids,) = bt.encode_batch(["hé"])
    assert ids.dtype == np.int32 and ids.tolist() == [104, 0xC3, 0xA9]
    assert bt.decode([256, *ids.tolist(), 257]) == "hé"
    assert (bt.bos_id, bt.eos_id, bt.pad_id, bt.vocab_size) == (256, 257, 258, 259)


def test_hf_tokenizer_object_and_file(tmp_path):
    tok = word_tokenizer()
    a = as_tokenizer(tok)
    assert (a.bos_id, a.eos_id, a.pad_id) == (2, 1, 3)
    assert [x.tolist() for x in a.encode_batch(["the cat", "a dog sat"])] == [[4, 5], [9, 10, 6]]
    tok.save(str(tmp_path / "tokenizer.json"))
    b = as_tokenizer(str(tmp_path / "tokenizer.json"))
    assert b.sha256 == a.sha256 and b.name == "tokenizer.json"
    with pytest.raises(headrace.ConfigError, match="never downloads"):
        as_tokenizer("gpt2")


def test_callable_tokenizer_checks_its_output():
    t = as_tokenizer(lambda s: {"input_ids": [len(s)]})
    assert t.encode_batch(["abc"])[0].tolist() == [3]
    with pytest.raises(headrace.ConfigError, match="1-D sequence of int ids"):
        as_tokenizer(lambda s: [[1, 2]]).encode_batch(["x"])
    with pytest.raises(headrace.ConfigError, match="is not a tokenizer"):
        as_tokenizer(42)


def test_pack_folder_txt_and_jsonl_in_sorted_order(tmp_path):
    raw = tmp_path / "raw"
    (raw / "sub").mkdir(parents=True)
    (raw / "b.txt").write_text("the cat\nsat")
    (raw / "a.jsonl").write_text('{"text": "a dog"}\n\n{"text": "the mat", "id": 3}\n')
    (raw / "sub" / "c.txt").write_text("on")
    (raw / ".hidden.txt").write_text("the")
    (raw / "notes.md").write_text("ignored")
    tok = word_tokenizer()
    info = headrace.pack_text(str(raw), str(tmp_path / "out.hr"), tokenizer=tok)
    assert info["documents"] == 4 and info["tokens"] == 8 and info["skipped"] == 0
    assert tokens(tmp_path / "out.hr") == [[9, 10], [4, 8], [4, 5, 6], [7]]
    with headrace.open(tmp_path / "out.hr") as st:
        attrs = st.attrs["text"]
    assert attrs["tokenizer_sha256"] == as_tokenizer(tok).sha256
    assert (attrs["bos_id"], attrs["eos_id"], attrs["pad_id"]) == (2, 1, 3)
    assert attrs["documents"] == 4 and attrs["field"] == "tokens"
    # one document per line
    headrace.pack_text(str(raw / "b.txt"), str(tmp_path / "lines.hr"), tokenizer=tok,
                       txt_mode="line")
    assert tokens(tmp_path / "lines.hr") == [[4, 5], [6]]
    # and the loader picks up the special ids from the store
    with headrace.text(str(tmp_path / "out.hr"), seq_len=4, add_bos=True, batch=8) as ld:
        assert next(ld)["tokens"].tolist() == [[2, 9, 10, 1], [2, 4, 8, 1], [2, 4, 5, 6],
                                               [1, 2, 7, 1]]


def test_bad_utf8_and_bad_jsonl_policy(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "docs.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n{"txt": "x"}\n'
                                     b'not json\n{"text": "\\ud800"}\n{"text": "fine"}\n')
    with pytest.raises(headrace.DecodeError, match=r"document 1 \(.*docs\.jsonl line 2\)") as ei:
        headrace.pack_text(str(raw), str(tmp_path / "e.hr"))
    assert ei.value.record_id == 1 and "docs.jsonl line 2" in ei.value.path
    assert not (tmp_path / "e.hr").exists()  # nothing half-made is left
    info = headrace.pack_text(str(raw), str(tmp_path / "s.hr"), on_decode_error="skip")
    assert info["documents"] == 2 and info["skipped"] == 4
    assert tokens(tmp_path / "s.hr") == [list(b"ok"), list(b"fine")]
    with pytest.raises(headrace.ConfigError, match="decode_error_policy"):
        headrace.pack_text(str(raw), str(tmp_path / "x.hr"), on_decode_error="ignore")
    with pytest.raises(headrace.ConfigError, match=r"no \.txt or \.jsonl"):
        headrace.pack_text(str(tmp_path / "s.hr" / "chunks"), str(tmp_path / "y.hr"))


def test_pack_from_a_store_with_a_text_field(tmp_path):
    src = str(tmp_path / "texts.hr")
    with headrace.create(src, fields={"text": "bytes", "label": "int64"}) as w:
        w.append({"text": [b"the cat", b"", b"a dog"], "label": np.arange(3)})
        w.commit()
    headrace.pack_text(src, str(tmp_path / "t.hr"), tokenizer=word_tokenizer())
    assert tokens(tmp_path / "t.hr") == [[4, 5], [], [9, 10]]
    with pytest.raises(headrace.ConfigError, match="no ragged bytes field 'body'"):
        headrace.pack_text(src, str(tmp_path / "u.hr"), text_key="body")
    # raw text in a store also goes straight into the text loader (packed to a temp store)
    with headrace.text(src, tokenizer=word_tokenizer(), seq_len=3, batch=4,
                       cache_dir=str(tmp_path)) as ld:
        assert next(ld)["tokens"].tolist() == [[4, 5, 1], [1, 9, 10], [1, 1, 1]]


def test_pack_from_s3_prefix(tmp_path):
    server = shared_server()
    bucket = new_bucket(server)
    c = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint, access_key_id="testing",
                                              secret_access_key="testing"))
    c.put("corpus/1.jsonl", b"".join(json.dumps({"text": t}).encode() + b"\n"
                                     for t in ["the cat", "sat on"]))
    c.put("corpus/0.txt", b"a dog")
    c.put("corpus/skip.bin", b"\x00")
    c.put("other/2.txt", b"the")
    with s3_env(server.endpoint):
        info = headrace.pack_text(f"s3://{bucket}/corpus/", str(tmp_path / "s3.hr"),
                                  tokenizer=word_tokenizer())
    assert info["documents"] == 3
    assert tokens(tmp_path / "s3.hr") == [[9, 10], [4, 5], [6, 7]]


def test_mx8_pack_of_text_files(tmp_path):
    import mx8

    raw = tmp_path / "raw"
    raw.mkdir()
    for i, t in enumerate(["the cat", "a dog sat", "on the mat"]):
        (raw / f"{i}.txt").write_text(t)
    mx8.pack_dir(str(raw), out=str(tmp_path / "mx8"))
    tok = word_tokenizer()
    headrace.pack_text(str(tmp_path / "mx8"), str(tmp_path / "from-mx8.hr"), tokenizer=tok)
    headrace.pack_text(str(raw), str(tmp_path / "from-raw.hr"), tokenizer=tok)
    assert tokens(tmp_path / "from-mx8.hr") == tokens(tmp_path / "from-raw.hr") == [
        [4, 5], [9, 10, 6], [7, 4, 8]]
    # and mx8.text's rows, read straight from the pack while tokenizing
    with headrace.text(str(tmp_path / "mx8"), stream=True, packing="pad", tokenizer=tok,
                       seq_len=3, batch=2, pad_id=0) as ld:
        got = [row for b in ld for row in b["tokens"].tolist()]
    assert got == [[4, 5, 1], [9, 10, 6], [1, 0, 0], [7, 4, 8], [1, 0, 0]]
