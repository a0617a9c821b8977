"""Byte-aware batching on the loaders of variable-size records other than ``load`` (images,
audio files, documents): ``headrace.mx8`` against the real mx8 1.0.7 wheel on the same pack, and
headrace's own ``image``/``audio``/``text(stream=True)`` over the same files raw, packed by
``headrace.pack_dir`` and as the mx8 pack. mx8 counts each record's stored (encoded) bytes, its
manifest ``byte_length``; so does headrace."""

from __future__ import annotations

import random

import mx8 as real
import numpy as np
import pytest
from tests._images import encode
from tests._media import sine, write_audio
from tokenizers import Tokenizer, models, pre_tokenizers

import headrace
import headrace.mx8 as mx8
from headrace import ConfigError

CUTS = [dict(target_bytes=10000), dict(batch_bytes=8000),
        dict(target_bytes=7000, batch_bytes=8000), dict(target_bytes=20000)]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """30 JPEGs of 1-6 KB (random sizes and qualities) in two classes, raw and mx8-packed."""
    root = tmp_path_factory.mktemp("bimg")
    rng = random.Random(1)
    for i in range(30):
        d = root / "raw" / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        h, w = rng.randint(20, 90), rng.randint(20, 90)
        pixels = np.random.default_rng(i).integers(0, 255, (h, w, 3), np.uint8)
        (d / f"{i:02d}.jpg").write_bytes(encode(pixels, quality=rng.randint(50, 95)))
    real.pack_dir(str(root / "raw"), out=str(root / "pk"), shard_mb=1)
    headrace.pack_dir(str(root / "raw"), out=str(root / "hr"))
    return root


def _image_splits(loader):
    return [labels.tolist() for _images, labels in loader]


@pytest.mark.parametrize("kw", CUTS)
def test_image_batches_cut_by_encoded_bytes_as_mx8(images, tmp_path, kw):
    want = _image_splits(real.image(str(images / "pk"), batch=8, resize=(16, 16),
                                    store=str(tmp_path / "ms"), **kw))
    assert len(want) > 30 // 8 + 1  # the bytes, not batch=8, cut these batches
    assert _image_splits(mx8.image(str(images / "pk"), batch=8, resize=(16, 16), **kw)) == want
    by_name = {"target_bytes": "target_batch_bytes", "batch_bytes": "max_batch_bytes"}
    long = mx8.ImageLoader(str(images / "pk"), batch_size_samples=8, resize_hw=(16, 16),
                           **{by_name[k]: v for k, v in kw.items()})
    assert _image_splits(long) == want
    for where in ("raw", "hr", "pk"):  # headrace's own loader: folder, store, mx8 pack
        with headrace.image(str(images / where), batch=8, resize=(16, 16), **kw) as ld:
            assert [b.tolist() for _x, b in ld] == want, where


@pytest.mark.parametrize("inflight", [20000, 40000])
def test_image_loaders_inflight_cap_alone_cuts_by_encoded_bytes_as_mx8(images, tmp_path,
                                                                       inflight):
    """mx8's ImageLoader without max_batch_bytes cuts batches to its derived ceiling (here the
    inflight cap itself, under 4 MiB), ending each at 90% of it. (headrace's cap counts the
    decoded batch, mx8's the encoded one: 8x8 outputs keep the decoded batches under it.)"""
    kw = dict(batch_size_samples=16, resize_hw=(8, 8), max_inflight_bytes=inflight)
    want = []
    for _images, labels in real.ImageLoader(str(images / "pk"), manifest_store=str(tmp_path),
                                            **kw):
        want.append(labels.tolist())
        del _images, labels  # the wheel blocks while held batches use the cap
    assert len(want) > 30 // 16 + 1
    assert _image_splits(mx8.ImageLoader(str(images / "pk"), **kw)) == want


def test_image_byte_batches_shuffle_resume_and_count(images):
    kw = dict(batch=8, resize=(16, 16), target_bytes=9000, shuffle=True, seed=5, epochs=3)
    with headrace.image(str(images / "hr"), **kw) as ld:
        n = len(ld)
        ids = []
        for _ in ld:
            ids.append(ld.last_ids.tolist())
    assert n == len(ids)
    per_epoch = [sum(len(b) for b in ids[:k]) for k in range(len(ids) + 1)]
    assert {30, 60, 90} <= set(per_epoch)  # no batch crosses an epoch
    with headrace.image(str(images / "hr"), **kw) as ld:
        for _ in range(5):
            next(ld)
        token = ld.checkpoint()
    with headrace.image(str(images / "hr"), resume=token, **kw) as again:
        assert len(again) == len(ids) - 5
        assert [again.last_ids.tolist() for _ in again] == ids[5:]


def test_an_image_past_batch_bytes_is_a_clear_error(images, tmp_path):
    with pytest.raises(RuntimeError, match=r"sample 0 has byte_length \d+ > max_batch_bytes 1000"):
        list(real.image(str(images / "pk"), batch=8, resize=(16, 16), batch_bytes=1000,
                        store=str(tmp_path / "ms")))
    with pytest.raises(ConfigError, match=r"record 0 has \d+ bytes > batch_bytes 1000; raise "
                                          r"batch_bytes to at least \d+ \(the largest record\)"):
        mx8.image(str(images / "pk"), batch=8, resize=(16, 16), batch_bytes=1000)


@pytest.fixture(scope="module")
def sounds(tmp_path_factory):
    root = tmp_path_factory.mktemp("baud")
    for i, n in enumerate([800, 3000, 200, 1500, 4000, 2500, 100, 3600, 900, 1200]):
        write_audio(str(root / "raw" / f"{i}.wav"), sine(300 + 20 * i, 8000, n), 8000)
    real.pack_dir(str(root / "raw"), out=str(root / "pk"))
    return root


@pytest.mark.parametrize("kw", [dict(target_bytes=6000), dict(batch_bytes=9000),
                                dict(target_bytes=4000, batch_bytes=8200)])
def test_audio_batches_cut_by_file_bytes_as_mx8(sounds, tmp_path, kw):
    want = [b.sample_ids.tolist() for b in real.audio(str(sounds / "pk"), samples=64, batch=4,
                                                       store=str(tmp_path / "ms"), **kw)]
    assert len(want) > 3
    for where in ("pk", "raw"):
        got = [b.sample_ids.tolist() for b in mx8.audio(str(sounds / where), samples=64,
                                                         batch=4, **kw)]
        assert got == want, where
        with headrace.audio(str(sounds / where), samples=64, batch=4, as_dict=True,
                            **kw) as ld:
            assert [b["ids"].tolist() for b in ld] == want, where


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    root = tmp_path_factory.mktemp("btxt")
    words = ["the", "cat", "sat", "on", "mat", "a", "dog"]
    rng = random.Random(2)
    for i in range(20):
        (root / "raw").mkdir(exist_ok=True)
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        (root / "raw" / f"{i:02d}.txt").write_text(text)
    real.pack_dir(str(root / "raw"), out=str(root / "pk"))
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{w: 2 + i for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(root / "tokenizer.json"))
    return root


@pytest.mark.parametrize("kw", [dict(target_bytes=200), dict(batch_bytes=350)])
def test_text_stream_documents_cut_by_bytes_as_mx8(docs, tmp_path, kw):
    tok = str(docs / "tokenizer.json")
    want = [b.sample_ids.tolist() for b in real.text(str(docs / "pk"), tokenizer=tok, seq_len=8,
                                                      stride=8, batch=16,
                                                      store=str(tmp_path / "ms"), **kw)]
    assert len(want) > 2
    for where in ("pk", "raw"):
        with headrace.text(str(docs / where), tokenizer=tok, seq_len=8, stride=8, batch=16,
                           packing="pad", stream=True, **kw) as ld:
            assert [b["doc_ids"].tolist() for b in ld] == want, where
    with pytest.raises(ConfigError, match="token windows are all seq_len=8 tokens"):
        headrace.text(str(docs / "raw"), tokenizer=tok, seq_len=8, **kw)
