"""Pins the public surface: the sorted ``__all__``, lazy imports, and no heavy imports."""

import subprocess
import sys

import headrace

EXPECTED = sorted([
    "CheckpointError", "ConfigError", "CorruptionError", "DecodeError", "FormatVersionError",
    "HeadraceError", "LinkError", "LoaderError", "NotAStoreError", "PackWorkerError", "RecordIndexError",
    "RecordTooLargeError", "RemoteError", "SchemaError", "StoreError", "StoreExistsError",
    "StoreFullError", "WriterBusyError", "WriterClosedError", "__version__",
    "FieldSpec", "Ragged", "Store", "Writer", "create", "open", "verify",
    "pack", "resolve", "resolve_manifest_hash",
    "Constraints", "DataLoader", "Loader", "MemoryCapError", "RuntimeConfig", "load", "stats",
    "ImageLoader", "image", "pack_dir",
    "Dataset", "pack_arrays", "pack_arrow", "pack_webdataset",
    "Sampler",
    "DistributedDataLoader", "MixedLoader", "mix", "run",
    "TextLoader", "pack_text", "text",
    "AudioLoader", "VideoLoader", "audio", "video",
    "plot",
])


def test_all_is_pinned_and_sorted():
    assert headrace.__all__ == EXPECTED
    assert sorted(headrace.__all__) == headrace.__all__


def test_every_export_resolves():
    for name in headrace.__all__:
        assert getattr(headrace, name) is not None, name


def test_import_pulls_in_no_framework_or_s3_sdk():
    code = (
        "import sys, headrace\n"
        "[getattr(headrace, n) for n in headrace.__all__]\n"
        "bad = [m for m in ('torch', 'jax', 'jaxlib', 'flax', 'boto3', 'botocore', 'obstore',"
        " 's3fs', 'matplotlib', 'blosc2') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
