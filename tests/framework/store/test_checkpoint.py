"""Checkpoint files: atomic, checksummed, safe to load; a corrupt or missing one is detected and skipped."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle

import pytest
import torch

from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore, CorruptCheckpointError, load_verified
from framework.store.signing import SignatureError, dumps_signed, loads_signed


def _state(v: float) -> dict:
    return {"model": {"w": torch.full((3,), v)}, "optimizer": None, "visited": {0: [0, 1]}}


@pytest.fixture
def store(tmp_path):
    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    s = CheckpointStore(str(tmp_path / "checkpoints"), catalog)
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


def test_a_write_of_the_same_state_queued_twice_keeps_its_file(tmp_path):
    """A config's final state queued again under the same name (a stop and its last unit's checkpoint) while the
    first write still waits: the superseded write is waited for, and the file both name stays on disk."""
    import threading

    from framework.store.checkpoint import write_atomic

    catalog = SQLiteCatalog(str(tmp_path / "run.db"))
    store = CheckpointStore(str(tmp_path / "checkpoints"), catalog, writers=1)
    gate = threading.Event()
    try:
        store.submit(9, 0, 1, lambda: gate.wait() and _state(9.0))  # holds the only writer thread
        for _ in range(2):  # both started elsewhere (a worker writes the file), both queued behind config 9
            store.submit(1, 1, 4, started=lambda: write_atomic(_state(4.0), store.path(1, 4)))
        gate.set()
        assert store.flush() == []
        state, epoch, units = store.load_latest(1)
        assert (epoch, units) == (1, 4) and torch.equal(state["model"]["w"], torch.full((3,), 4.0))
    finally:
        store.close()
        catalog.close()


def test_signed_pickle_detects_tampering(monkeypatch):
    monkeypatch.setenv("MODELHOPPER_SECRET", "test-key-" * 4)
    blob, sig = dumps_signed({"a": 1})
    assert loads_signed(blob, sig) == {"a": 1}
    with pytest.raises(SignatureError):
        loads_signed(blob.replace(b"a", b"b"), sig)


# ---- our loader refuses crafted files (through load_verified, CheckpointStore and Result, not torch.load) -------


class _Payload:
    """Unpickling this creates `marker`: the proof that a loader executed code from a checkpoint file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _write_with(writer: str, obj, path: str) -> str:
    """Write `obj` with torch.save or a raw pickle.dump; return the file's sha256 (what a tampered catalog records)."""
    with open(path, "wb") as f:
        if writer == "torch.save":
            torch.save(obj, f)
        else:
            pickle.dump(obj, f)
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


WRITERS = ["torch.save", "pickle.dump"]
# torch warns that it meets a raw pickle's protocol; the refusal is what these tests check
_RAW_PICKLE_WARNING = pytest.mark.filterwarnings("ignore:Detected pickle protocol")


@_RAW_PICKLE_WARNING
@pytest.mark.parametrize("writer", WRITERS)
def test_load_verified_refuses_a_crafted_pickle_with_a_matching_checksum(tmp_path, writer):
    marker, path = tmp_path / "pwned", str(tmp_path / "evil.pt")
    digest = _write_with(writer, {"model": _Payload(str(marker)), "optimizer": None, "visited": {}}, path)
    with pytest.raises(CorruptCheckpointError, match="evil.pt") as info:
        load_verified(path, digest)
    assert not marker.exists()
    # never relay torch's advice to retry unsafely or to allowlist the file's globals
    assert "weights_only` set to `False" not in str(info.value) and "add_safe_globals" not in str(info.value)


@_RAW_PICKLE_WARNING
@pytest.mark.parametrize("writer", WRITERS)
def test_checkpoint_store_skips_a_crafted_latest_file_to_the_previous_one(store, tmp_path, writer):
    marker = tmp_path / "pwned"
    store.submit(0, 0, 1, lambda: _state(1.0))
    store.flush()
    path = store.path(0, 2)
    digest = _write_with(writer, {"model": _Payload(str(marker)), "optimizer": None, "visited": {}}, path)
    store.catalog.add_checkpoint(0, 0, 2, path, digest, os.path.getsize(path))
    state, _, units = store.load_latest(0)
    assert units == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    events = store.catalog.events()
    assert path in " ".join(events[events.kind == "corrupt_checkpoint"].detail)
    assert not marker.exists()


def test_checkpoint_store_with_only_a_crafted_file_raises_corrupt(store, tmp_path):
    marker, path = tmp_path / "pwned", store.path(5, 1)
    digest = _write_with("torch.save", {"model": _Payload(str(marker))}, path)
    store.catalog.add_checkpoint(5, 0, 1, path, digest, os.path.getsize(path))
    with pytest.raises(CorruptCheckpointError, match="config 5"):
        store.load_latest(5)
    assert not marker.exists()


@_RAW_PICKLE_WARNING
@pytest.mark.parametrize("writer", WRITERS)
def test_load_verified_refuses_flipped_bytes_under_the_old_checksum(tmp_path, writer):
    path = str(tmp_path / "state.pt")
    digest = _write_with(writer, _state(1.0), path)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    i = data.index(torch.ones(1).numpy().tobytes())  # the tensor payload: the file would still load, with new weights
    data[i + 3] ^= 0x01
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(CorruptCheckpointError, match="state.pt"):
        load_verified(path, digest)


def _run_with_checkpoints(tmp_path, files: list[tuple[int, object]]) -> tuple[str, str]:
    """A run directory whose config 0 has checkpoint files `(units, obj)` written with torch.save."""
    from framework.result import CATALOG_FILE, CHECKPOINT_DIR

    os.makedirs(tmp_path / CHECKPOINT_DIR)
    catalog = SQLiteCatalog(str(tmp_path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    catalog.add_config(0, {"lr": 0.1}, "stopped")
    for units, obj in files:
        path = str(tmp_path / CHECKPOINT_DIR / f"config_0_u{units}.pt")
        digest = _write_with("torch.save", obj, path)
        catalog.add_checkpoint(0, 0, units, path, digest, os.path.getsize(path))
    catalog.close()
    return str(tmp_path), str(tmp_path / "pwned")


def test_result_load_state_refuses_a_crafted_checkpoint(tmp_path):
    from framework.result import Result

    run, marker = _run_with_checkpoints(tmp_path, [(1, {"model": _Payload(str(tmp_path / "pwned"))})])
    with pytest.raises(CorruptCheckpointError, match="config_0_u1.pt"):
        Result(run).load_state(0)
    assert not os.path.exists(marker)


def test_result_load_state_falls_back_past_a_crafted_checkpoint(tmp_path):
    from framework.result import Result

    run, marker = _run_with_checkpoints(tmp_path, [(1, _state(1.0)), (2, {"model": _Payload(str(tmp_path / "pwned"))})])
    before = os.path.getmtime(os.path.join(run, "run.db"))
    with pytest.warns(UserWarning, match=r"config 0: loaded its checkpoint after 1 training units .*config_0_u2.pt"):
        state = Result(run).load_state(0)
    assert torch.equal(state["model"]["w"], torch.ones(3))
    assert state["checkpoint"]["units"] == 1 and state["checkpoint"]["latest"] is False
    assert state["checkpoint"]["path"].endswith("config_0_u1.pt")
    assert not os.path.exists(marker)
    # a read never writes into the run: no event, the catalog untouched
    assert Result(run).events.empty and os.path.getmtime(os.path.join(run, "run.db")) == before


def test_result_load_model_says_which_checkpoint_it_loaded(tmp_path, caplog):
    from framework.result import Result

    run, _ = _run_with_checkpoints(tmp_path, [(1, _state(1.0)), (2, _state(2.0))])
    with caplog.at_level(logging.INFO, logger="framework.result"):
        model = Result(run).load_model(0, model_fn=lambda config: (_OneTensor(), None))
    assert torch.equal(model.w, torch.full((3,), 2.0))
    assert "config 0: loaded its latest checkpoint" in caplog.text and "config_0_u2.pt" in caplog.text


class _OneTensor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
