"""Every test pins dataset snapshots in its own manifest store, and starts with no solo-probe
verdicts of earlier tests (``_engine.solo`` keeps them per process: a test's engines would
otherwise start parked or not depending on which tests ran before it).

A plain folder link reuses the snapshot pinned at its first listing (mx8's semantics). pytest
reuses ``/tmp/pytest-of-<user>/pytest-<n>`` numbers once old runs are cleaned up, so a test that
shared the user's manifest cache would find the snapshot an earlier run pinned for the same path
and read it as stale (``LinkError ... changed after snapshot``). Subprocesses inherit the variable.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_manifest_store(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_MANIFEST_STORE", str(tmp_path_factory.mktemp("manifests")))


@pytest.fixture(autouse=True)
def _no_solo_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace._engine import solo

    monkeypatch.setattr(solo, "_VERDICTS", {})
