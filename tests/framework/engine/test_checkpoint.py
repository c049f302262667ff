"""Checkpoint files: atomic, checksummed, safe to load; a corrupt or missing one is detected and skipped."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from framework.engine.catalog import SQLiteCatalog
from framework.engine.checkpoint import CheckpointStore, CorruptCheckpointError, load_verified, write_atomic
from framework.engine.signing import SignatureError, dumps_signed, loads_signed


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((3,), v)}, "optimizer": None, "visited": {0: [0, 1]}}


@pytest.fixture
def store(tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    s = CheckpointStore(str(tmp_path / "ckpt"), catalog)
    yield s
    s.close()
    catalog.close()


def test_checkpoint_round_trip_keeps_tensors_and_visits(store):
    store.submit(0, 0, 1, lambda: _state(1.0))
    assert store.flush() == []
    state, epoch, units = store.load_latest(0)
    assert torch.equal(state["model"]["w"], torch.ones(3)) and state["visited"] == {0: [0, 1]}
    assert (epoch, units) == (0, 1)


def test_checkpoint_corrupt_latest_falls_back_to_previous(store):
    store.submit(0, 0, 1, lambda: _state(1.0))
    store.flush()
    store.submit(0, 0, 2, lambda: _state(2.0))
    store.flush()
    with open(store.path(0, 2), "r+b") as f:
        f.seek(40)
        f.write(b"garbage!")
    state, _, units = store.load_latest(0)
    assert units == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert "corrupt_checkpoint" in set(store.catalog.events().kind)


def test_checkpoint_missing_everywhere_raises(store):
    store.submit(3, 0, 1, lambda: _state(1.0))
    store.flush()
    os.remove(store.path(3, 1))
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.load_latest(3)


def test_checkpoint_keeps_only_the_two_newest_files(store):
    for u in range(1, 5):
        store.submit(0, 0, u, lambda u=u: _state(float(u)))
        store.flush()
    assert sorted(os.listdir(store.directory)) == ["config_0_u3.pt", "config_0_u4.pt"]


def test_checkpoint_load_refuses_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = str(tmp_path / "evil.pt")
    with open(path, "wb") as f:
        pickle.dump({"model": Evil()}, f)
    digest, _ = write_atomic(_state(0.0), str(tmp_path / "ok.pt"))
    with pytest.raises(pickle.UnpicklingError):  # weights_only=True refuses the global, whatever the checksum says
        torch.load(path, weights_only=True)
    assert load_verified(str(tmp_path / "ok.pt"), digest)["visited"] == {0: [0, 1]}


def test_signed_pickle_detects_tampering(monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", "test-key")
    blob, sig = dumps_signed({"a": 1})
    assert loads_signed(blob, sig) == {"a": 1}
    with pytest.raises(SignatureError):
        loads_signed(blob.replace(b"a", b"b"), sig)
