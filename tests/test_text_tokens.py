"""Token arrays in, torch-ready tokens out: ``text()`` over a flat ``.bin``/``.npy``/ndarray/
memmap, strided or random windows, int64 tokens, inputs/targets shifted by one."""

from __future__ import annotations

import json

import numpy as np
import pytest

import headrace
from headrace import CheckpointError, ConfigError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50257, 5000).astype(np.uint16)
    toks.tofile(root / "train.bin")
    np.save(root / "train.npy", toks)
    return {"tokens": toks, "bin": str(root / "train.bin"), "npy": str(root / "train.npy"),
            "root": root}


def _all(loader):
    with loader:
        return list(loader)


def test_every_spelling_of_a_token_array_gives_the_same_windows(corpus):
    toks = corpus["tokens"]
    want = toks[: (len(toks) // 16) * 16].reshape(-1, 16).astype(np.int32)
    spellings = [headrace.text(corpus["bin"], dtype="uint16", seq_len=16, batch=32),
                 headrace.text(corpus["npy"], seq_len=16, batch=32),
                 headrace.text(toks, seq_len=16, batch=32),
                 headrace.text(np.memmap(corpus["bin"], dtype=np.uint16, mode="r"), seq_len=16,
                               batch=32)]
    for ld in spellings:
        assert ld.windows == len(toks) // 16
        got = np.concatenate([b["tokens"] for b in _all(ld)])
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_targets_are_the_next_tokens_contiguous_int64(corpus):
    toks = corpus["tokens"].astype(np.int64)
    ld = headrace.text(corpus["bin"], dtype="uint16", seq_len=32, batch=8, targets=True,
                       tokens_dtype="int64", shuffle=True, seed=3)
    assert ld.windows == (len(toks) - 33) // 32 + 1  # stride = seq_len; windows of 33 tokens
    n = 0
    for b in _all(ld):
        x, y, off = b["inputs"], b["targets"], b["offsets"]
        assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (len(off), 32)
        assert x.flags.c_contiguous and y.flags.c_contiguous
        for r, o in enumerate(off.tolist()):
            np.testing.assert_array_equal(x[r], toks[o:o + 32])
            np.testing.assert_array_equal(y[r], toks[o + 1:o + 33])
        n += len(off)
    assert n == ld.windows


def test_torch_cross_entropy_takes_the_targets_as_they_come(corpus):
    import torch
    with headrace.text(corpus["npy"], seq_len=16, batch=4, targets=True, tokens_dtype="int64",
                       to_torch=True) as ld:
        b = next(iter(ld))
    logits = torch.zeros(4 * 16, 50257)
    loss = torch.nn.functional.cross_entropy(logits, b["targets"].view(-1))
    assert torch.isfinite(loss) and b["inputs"].view(-1).shape == (64,)


def test_random_windows_are_nanogpts_get_batch_and_resume_exactly(corpus):
    toks = corpus["tokens"]
    kw = dict(dtype="uint16", seq_len=24, batch=6, windows="random", targets=True,
              tokens_dtype="int64", epochs=None, seed=11)
    with headrace.text(corpus["bin"], **kw) as ld:
        assert ld.windows == len(toks) - 24  # every offset i with i + 25 <= len
        run = [next(ld) for _ in range(8)]
        offs = np.concatenate([b["offsets"] for b in run])
        token = ld.checkpoint()
        more = [next(ld) for _ in range(3)]
    # drawn with replacement over all offsets (iid), not a fixed stride
    assert len(np.unique(offs % 24)) > 5
    with headrace.text(corpus["bin"], resume=token, **kw) as ld:
        for a in more:
            b = next(ld)
            np.testing.assert_array_equal(a["inputs"], b["inputs"])
            np.testing.assert_array_equal(a["targets"], b["targets"])
    assert json.loads(token)["kind"]


def test_resume_refuses_another_corpus_of_the_same_length(corpus, tmp_path):
    other = corpus["tokens"].copy()
    other[2500] ^= 1
    other.tofile(tmp_path / "other.bin")
    with headrace.text(corpus["bin"], dtype="uint16", seq_len=16, batch=4) as ld:
        next(ld)
        token = ld.checkpoint()
    with pytest.raises(CheckpointError):
        headrace.text(str(tmp_path / "other.bin"), dtype="uint16", seq_len=16, batch=4,
                      resume=token)


def test_token_stores_take_targets_and_int64_too(tmp_path):
    path = str(tmp_path / "tok.hr")
    with headrace.create(path, fields={"tokens": {"dtype": "int32", "shape": None}}) as w:
        w.append({"tokens": [np.arange(10, dtype=np.int32) + 100 * d for d in range(4)]})
        w.commit()
    with headrace.text(path, seq_len=8, batch=2, targets=True, tokens_dtype="int64",
                       eos_id=1) as ld:
        b = next(iter(ld))
        ld.close()
    x, y = b["inputs"], b["targets"]
    assert x.dtype == np.int64 and x.flags.c_contiguous and y.flags.c_contiguous
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # shifted by one
    np.testing.assert_array_equal(x[0], np.arange(8))


@pytest.mark.parametrize("call, match", [
    (lambda c: headrace.text(c["bin"], seq_len=8), "dtype="),
    (lambda c: headrace.text(c["bin"], dtype="float32", seq_len=8), "integers"),
    (lambda c: headrace.text(c["tokens"].reshape(50, 100), seq_len=8), "1-D"),
    (lambda c: headrace.text(c["tokens"].astype(np.float32), seq_len=8), "integers"),
    (lambda c: headrace.text(c["tokens"], dtype="uint32", seq_len=8), "carries its own"),
    (lambda c: headrace.text(c["tokens"][:5], seq_len=8), "fewer than one window"),
    (lambda c: headrace.text(c["tokens"], seq_len=8, tokens_dtype="int16"), "int64"),
    (lambda c: headrace.text(c["tokens"], seq_len=8, windows="sliding"), "random"),
    (lambda c: headrace.text(c["tokens"], seq_len=8, windows="random", stride=4), "stride"),
    (lambda c: headrace.text(c["tokens"], seq_len=8, stream=True), "stream"),
])
def test_clear_errors(corpus, call, match):
    with pytest.raises(ConfigError, match=match):
        call(corpus)


def test_odd_sized_bin_is_refused(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(ConfigError, match="whole number"):
        headrace.text(str(tmp_path / "odd.bin"), dtype="uint16", seq_len=2)


def test_a_fixed_shape_tokens_field_says_it_must_be_ragged(tmp_path):
    path = str(tmp_path / "fixed.hr")
    with headrace.create(path, fields={"tokens": {"dtype": "int32", "shape": [8]}}) as w:
        w.append({"tokens": np.zeros((3, 8), np.int32)})
        w.commit()
    with pytest.raises(ConfigError, match=r"ragged.*'shape': None"):
        headrace.text(path, seq_len=4)


@pytest.mark.parametrize("tokens", [np.zeros((3, 8), np.int32), np.arange(24, dtype=np.uint16),
                                    [np.zeros(5, np.float32)] * 3, [b"abcde"] * 3])
def test_a_packed_tokens_field_of_the_wrong_kind_names_dtype_shape_and_spelling(tmp_path, tokens):
    bad, good = str(tmp_path / "bad.hr"), str(tmp_path / "good.hr")
    headrace.pack_arrays(bad, tokens=tokens, progress=False)
    with pytest.raises(ConfigError, match=r"is ragged.*int32.*pack_arrays\(out, tokens=") as e:
        headrace.text(bad, seq_len=4)
    # the spelling the message gives packs a token field text() reads
    spelled = str(e.value).split("pack_arrays(out, tokens=")[1].split("), create(")[0]
    docs = [np.arange(6) + 10 * d for d in range(3)]
    headrace.pack_arrays(good, tokens=eval(spelled, {"np": np, "docs": docs}), progress=False)
    with headrace.text(good, seq_len=4, batch=1, eos_id=0, targets=True) as loader:
        assert sum(len(b["inputs"]) for b in loader) > 0


def test_pack_arrays_of_a_token_bin_says_how_to_read_it(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"not a \.npy file.*headrace\.text\(.*dtype=") as e:
        headrace.pack_arrays(tmp_path / "s", tokens=corpus["bin"])
    assert "np.memmap(" in str(e.value) and not (tmp_path / "s").exists()
    # what it points at works: the file read as it is, or mapped and packed as a field
    with headrace.text(corpus["bin"], dtype="uint16", seq_len=8, batch=4, targets=True) as loader:
        assert next(iter(loader))["inputs"].shape == (4, 8)
    headrace.pack_arrays(tmp_path / "s", tokens=np.memmap(corpus["bin"], dtype="uint16", mode="r"),
                         progress=False)
    with headrace.open(str(tmp_path / "s")) as st:
        np.testing.assert_array_equal(st.gather(np.arange(5))["tokens"], corpus["tokens"][:5])
