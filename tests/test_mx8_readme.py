"""mx8 1.0.7's README examples, run verbatim with only the import changed
(``import mx8`` -> ``import headrace.mx8 as mx8``).

The snippets below are the README's Python blocks, character for character, except that import
line. Their placeholders are pointed at generated data: ``/path/to/imagefolder`` and
``/path/to/mx8-dataset`` become folders under ``tmp_path`` and the bucket named ``bucket`` is a
fresh bucket on the test S3 server, reached through mx8's own environment variable
``MX8_S3_ENDPOINT_URL`` (with ``MX8_MANIFEST_STORE_ROOT`` for the snapshots). Left out: the
fragments that are not code (``mx8.pack_dir(..., label_mode=...)`` with a literal ``...``, the
``mx8.Constraints(max_inflight_bytes=..., ...)`` naming notes).
"""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
from tests._images import encode, gradient, imagefolder

from _s3_server import new_bucket, shared_server
from headrace._remote.objstore import ObjectStore, S3Options

QUICKSTART = '''
import headrace.mx8 as mx8

mx8.pack_dir(
    "/path/to/imagefolder",
    out="/path/to/mx8-dataset",
    shard_mb=512,
    label_mode="imagefolder",
    require_labels=True,
)

loader = mx8.image(
    "/path/to/mx8-dataset@refresh",
    batch=64,
    inflight=256 * 1024 * 1024,
    resize=(224, 224),  # (H,W); optional
)

print(loader.classes)  # ["cat", "dog", ...] if labels.tsv exists

for images, labels in loader:
    pass
'''

ZERO_MANIFEST = '''
import headrace.mx8 as mx8

loader = mx8.load(
    "s3://bucket/raw-prefix/",
    recursive=True,  # default
    profile="balanced",
)

for batch in loader:
    pass
'''

MIX = '''
import headrace.mx8 as mx8

loader_a = mx8.load("s3://bucket/dataset_a/@refresh", profile="balanced", tune=True)
loader_b = mx8.load("s3://bucket/dataset_b/@refresh", profile="balanced", tune=True)

mixed = mx8.mix(
    [loader_a, loader_b],
    weights=[1, 1],   # fairness baseline (50:50)
    seed=0,
    epoch=0,
)

for batch in mixed:
    pass

print(mixed.stats())
'''

SKEWED = '''
mixed = mx8.mix([loader_a, loader_b], weights=[7, 3], seed=0, epoch=0)
'''

BOUNDED = '''
import headrace.mx8 as mx8

loader = mx8.image(
    "/path/to/mx8-dataset@refresh",
    batch=64,
    inflight=256 * 1024 * 1024,
    queue=8,
    prefetch=4,
)

for step, (images, labels) in enumerate(loader):
    if step % 100 == 0:
        print(loader.stats())  # includes ram_high_water_bytes
'''

DONT = '''
# ❌ Don't do this (will grow RSS regardless of any loader)
all_batches = list(loader)
'''


@pytest.fixture
def readme_env(tmp_path, monkeypatch):
    """The README's placeholders pointed at generated data; returns the substitutions."""
    imagefolder(tmp_path / "imagefolder", {"cat": 70, "dog": 60}, h=48, w=40)
    server = shared_server()
    bucket = new_bucket(server)
    s3 = ObjectStore(bucket, options=S3Options(endpoint=server.endpoint,
                                               access_key_id="testing",
                                               secret_access_key="testing"))
    for i in range(9):
        s3.put(f"raw-prefix/{'sub/' if i % 3 else ''}{i}.jpg", encode(gradient(16, 16, phase=i)))
    for name, n in (("dataset_a", 40), ("dataset_b", 24)):
        for i in range(n):
            s3.put(f"{name}/{i:03d}.bin", bytes([i]) * (10 + i))
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HEADRACE_S3_ENDPOINT", "AWS_PROFILE",
                "WORLD_SIZE", "RANK", "MX8_JOB_ID", "MX8_COORD_URL", "HEADRACE_MANIFEST_STORE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("MX8_S3_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("MX8_MANIFEST_STORE_ROOT", str(tmp_path / "manifests"))
    return {"/path/to/imagefolder": str(tmp_path / "imagefolder"),
            "/path/to/mx8-dataset": str(tmp_path / "mx8-dataset"),
            "s3://bucket/": f"s3://{bucket}/"}


def _run(snippet: str, subs: dict[str, str], namespace: dict) -> str:
    for placeholder, real in subs.items():
        snippet = snippet.replace(placeholder, real)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "<mx8 README>", "exec"), namespace)
    return out.getvalue()


def test_quickstart_and_bounded_memory(readme_env):
    ns: dict = {}
    printed = _run(QUICKSTART, readme_env, ns)
    assert printed.strip() == "['cat', 'dog']"
    images, labels = ns["images"], ns["labels"]  # the last batch of the loop
    assert tuple(images.shape) == (130 - 64 * 2, 3, 224, 224) and str(images.dtype) == (
        "torch.float32")
    assert labels.tolist() == [1, 1]
    printed = _run(BOUNDED, readme_env, ns)
    assert printed.count("ram_high_water_bytes") == 1  # step 0 of 3
    assert ns["step"] == 2
    # the anti-pattern, on a fresh loader (the README's, built as above): it does hold every
    # batch at once
    _run(BOUNDED.split("\nfor step")[0], readme_env, ns)
    _run(DONT, readme_env, ns)
    assert [len(labels) for _, labels in ns["all_batches"]] == [64, 64, 2]


def test_zero_manifest_load_of_a_raw_s3_prefix(readme_env):
    ns: dict = {}
    _run(ZERO_MANIFEST, readme_env, ns)
    batch = ns["batch"]  # the only batch: 9 objects, recursive
    assert batch.sample_ids == list(range(9)) and len(batch.offsets) == 10
    assert ns["loader"].stats()["delivered_samples_total"] == 9


def test_mix_of_two_s3_datasets(readme_env):
    ns: dict = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        printed = _run(MIX, readme_env, ns)
    assert not seen, [str(w.message) for w in seen]  # tune=True is headrace's autotuner
    stats = ns["mixed"].stats()
    assert ns["loader_a"].stats()["autotune_enabled"] is True
    assert "mix_schedule_ticks" in printed
    # 40 and 24 records in batches of 512: one batch each, then both end together
    assert stats["mix_source_delivered_samples_total"] == [40, 24]
    assert stats["mix_schedule_ticks"] == 2
    _run(SKEWED, readme_env, ns)
    assert ns["mixed"].stats()["mix_normalized_weights"] == [0.7, 0.3]
