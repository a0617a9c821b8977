"""loaderx 0.4.1's README examples, run verbatim with only the import changed
(``from loaderx import`` -> ``from headrace.loaderx import``).

The snippets are the README's two code blocks, character for character but that line: the
NumPy-to-Blosc2 conversion (its ``arr.npy`` is generated here) and the Quick Start (its
``train_data.b2nd`` / ``train_label.b2nd`` are Blosc2 arrays written here). They run in a
temporary working folder, as the README's relative paths expect. The checks are what its README and
observed behaviour say: endless batches of 256 (``batch_size=256``), ``{'data', 'label'}`` rows
that belong together; ``tests/test_loaderx_wheel.py`` runs the Quick Start with the real loaderx
0.4.1 wheel too and compares what both print.
"""

from __future__ import annotations

import contextlib
import io

import blosc2
import numpy as np

CONVERT = '''
import blosc2
import numpy as np

np_arr = np.load('arr.npy',mmap_mode='r')
b2_arr = blosc2.asarray(np_arr, urlpath="arr.b2nd", mode="w")
'''

QUICKSTART = '''
from headrace.loaderx import Dataset, DataLoader

dataset = Dataset('train_data.b2nd')
labelset = Dataset('train_label.b2nd')

loader = DataLoader(dataset, labelset)

for i, batch in enumerate(loader):
    if i >= 256:
        break

print(batch['data'].shape)
print(batch['label'].shape)
'''


def _run(code: str) -> tuple[dict[str, object], str]:
    scope: dict[str, object] = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<loaderx README>", "exec"), scope)
    return scope, out.getvalue()


def test_readme_convert_block_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arr = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    np.save(tmp_path / "arr.npy", arr)
    scope, _ = _run(CONVERT)
    np.testing.assert_array_equal(blosc2.open("arr.b2nd")[:], arr)
    np.testing.assert_array_equal(scope["b2_arr"][:], arr)  # type: ignore[index]


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    n = 1000  # fewer records than the 257 batches of 256 the loop reads: the loader is endless
    blosc2.asarray(np.arange(n * 8, dtype=np.float32).reshape(n, 8),
                   urlpath="train_data.b2nd", mode="w")
    blosc2.asarray(np.arange(n, dtype=np.int64), urlpath="train_label.b2nd", mode="w")
    scope, printed = _run(QUICKSTART)
    assert printed == "(256, 8)\n(256,)\n"
    batch = scope["batch"]
    data, label = np.asarray(batch["data"]), np.asarray(batch["label"])  # type: ignore[index]
    np.testing.assert_array_equal(data[:, 0], label * 8)  # each row with its own label
    assert scope["i"] == 256
    scope["loader"].close()  # type: ignore[attr-defined]
