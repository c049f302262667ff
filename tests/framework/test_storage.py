"""Where runs live: the default root, URIs mirrored through pyarrow.fs (a local file-system URI here), run directories
that move, and reads that never write."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import write_atomic
from framework.store.storage import READ_PREFIX, STORAGE_ENV, RunStorage, default_root, is_uri


def _run_dir(path) -> str:
    """A finished run of one config with two checkpoints, built by hand."""
    os.makedirs(path / CHECKPOINT_DIR)
    catalog = SQLiteCatalog(str(path / CATALOG_FILE))
    catalog.set_meta(metric="valid_loss", mode="min", start_time=0.0)
    catalog.add_config(0, {"lr": 0.1}, "stopped")
    for units in (1, 2):
        ckpt = str(path / CHECKPOINT_DIR / f"config_0_u{units}.pt")
        digest, size = write_atomic({"model": {"w": torch.full((3,), float(units))}, "visited": {}}, ckpt)
        catalog.add_checkpoint(0, 0, units, ckpt, digest, size)
    catalog.add_epoch(0, 0, 0, {"valid_loss": 0.5})
    catalog.close()
    return str(path)


def test_the_default_root_is_outside_the_working_directory_and_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert default_root() == os.path.join(os.path.expanduser("~"), "modelhopper_runs")
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path / "elsewhere"))
    storage = RunStorage(None, "grid-1")
    assert storage.local == str(tmp_path / "elsewhere" / "grid-1") and storage.uri is None
    assert RunStorage("rel/run", "x").local == os.path.abspath("rel/run")


def test_a_uri_is_checked_before_any_work():
    assert is_uri("s3://bucket/x") and is_uri("file:///tmp/x") and not is_uri("./s3:/bucket/x")
    with pytest.raises(ValueError, match=r"`storage_path` is 'nosuchscheme://x/y', but pyarrow.fs cannot open it"):
        RunStorage("nosuchscheme://x/y", "run")


def test_checkpoint_paths_are_relative_so_a_moved_run_loads(tmp_path):
    run = _run_dir(tmp_path / "run")
    catalog = SQLiteCatalog(os.path.join(run, CATALOG_FILE), readonly=True)
    stored = catalog._read("SELECT path FROM checkpoints")
    catalog.close()
    assert sorted(p for (p,) in stored) == ["checkpoints/config_0_u1.pt", "checkpoints/config_0_u2.pt"]
    moved = shutil.move(run, str(tmp_path / "moved"))
    state = Result.open(moved).load_state(0)
    assert torch.equal(state["model"]["w"], torch.full((3,), 2.0))
    assert state["checkpoint"] == {"path": os.path.join(moved, "checkpoints", "config_0_u2.pt"), "epoch": 0,
                                   "units": 2, "latest": True}


def test_a_run_mirrored_to_a_uri_opens_from_the_uri(tmp_path, monkeypatch):
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path / "root"))
    uri = f"file://{tmp_path}/remote/run"
    storage = RunStorage(uri, "run")
    assert storage.local.startswith(str(tmp_path / "root" / ".working"))
    _run_dir(Path(storage.local))
    (Path(storage.local) / "checkpoints" / "config_0_u3.pt.tmp.1.2").write_bytes(b"crash")
    remote = tmp_path / "remote" / "run"
    (remote / "elsewhere").mkdir(parents=True)
    (remote / "elsewhere" / "run.db").write_bytes(b"another run under the same prefix")
    assert storage.push(force=True) and not storage.push()  # throttled: at most every sync_every_s
    assert (remote / "elsewhere" / "run.db").read_bytes() == b"another run under the same prefix"  # never deleted
    assert sorted(os.listdir(remote / "checkpoints")) == ["config_0_u1.pt", "config_0_u2.pt"]  # no temp files
    assert (remote / "run.db").exists() and not (remote / "run.db-wal").exists()
    os.remove(os.path.join(storage.local, CHECKPOINT_DIR, "config_0_u1.pt"))  # pruned locally: pruned remotely
    storage.push(force=True)
    assert sorted(os.listdir(remote / "checkpoints")) == ["config_0_u2.pt"]
    result = Result.open(uri)  # a read fetches a fresh copy: the working copy (maybe in use) is left alone
    assert result.storage_path != storage.local and os.path.exists(os.path.join(storage.local, "run.db"))
    shutil.rmtree(storage.local)  # the working copy is gone (another machine): open still fetches the mirror
    result = Result.open(uri)
    assert result.best_config_id == 0
    assert torch.equal(result.load_state(0)["model"]["w"], torch.full((3,), 2.0))
    with pytest.raises(FileNotFoundError, match="holds no run.db"):
        Result.open(f"file://{tmp_path}/remote/nothing")


def _mirrored_run(tmp_path, monkeypatch) -> str:
    """A run mirrored to a file:// URI, and the temporary folder of this test as the system's (so counting its
    entries sees no other process)."""
    monkeypatch.setenv(STORAGE_ENV, str(tmp_path / "root"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    uri = f"file://{tmp_path}/remote/run"
    storage = RunStorage(uri, "run")
    _run_dir(Path(storage.local))
    storage.push(force=True)
    shutil.rmtree(storage.local)
    return uri


def _copies() -> list[str]:
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(READ_PREFIX)]


def test_result_open_of_a_uri_removes_its_copy_when_closed(tmp_path, monkeypatch):
    uri = _mirrored_run(tmp_path, monkeypatch)
    for _ in range(5):
        with Result.open(uri) as result:
            assert len(_copies()) == 1
            assert torch.equal(result.load_state(0)["model"]["w"], torch.full((3,), 2.0))
    for _ in range(5):
        result = Result.open(uri)
        result.close()
        result.close()
    assert _copies() == []
    with pytest.raises(ValueError, match="this Result was closed: its copy of the run .* is removed"):
        result.load_state(0)
    assert result.best_config_id == 0  # what was read stays readable


def test_result_open_of_a_uri_keeps_its_copy_while_in_use_and_removes_it_when_collected(tmp_path, monkeypatch):
    uri = _mirrored_run(tmp_path, monkeypatch)
    best = Result.open(uri).get_best_result()  # the Result lives on in the config it returned
    gc.collect()
    assert len(_copies()) == 1 and best._result.load_state(0)["checkpoint"]["latest"]
    del best
    gc.collect()
    assert _copies() == []


def test_result_open_of_a_uri_removes_its_copy_at_interpreter_exit(tmp_path, monkeypatch):
    uri = _mirrored_run(tmp_path, monkeypatch)
    code = f"from framework.result import Result; r = Result.open({uri!r}); import sys; sys.r = r; print(r.storage_path)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TMPDIR": str(tmp_path / "tmp")}, cwd=os.getcwd())
    assert out.stdout.strip().startswith(str(tmp_path / "tmp" / READ_PREFIX))  # it did make a copy there
    assert _copies() == []


def test_show_of_a_uri_leaves_no_copy(tmp_path, monkeypatch, capsys):
    from framework.__main__ import main as cli

    uri = _mirrored_run(tmp_path, monkeypatch)
    assert cli(["show", uri]) == 0 and "valid_loss" in capsys.readouterr().out
    assert _copies() == []


def test_result_open_of_a_uri_that_holds_no_run_leaves_no_folder(tmp_path, monkeypatch):
    uri = _mirrored_run(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="holds no run.db"):
        Result.open(uri.replace("/remote/run", "/remote/nothing"))
    assert _copies() == []


def test_replay_of_a_uri_removes_its_copy_also_when_it_fails(tmp_path, monkeypatch):
    import framework  # not `from framework.runs.replay import replay`: that rebinds `framework.replay` to the module

    uri = _mirrored_run(tmp_path, monkeypatch)  # a run made by hand: its meta lacks what replay needs
    with pytest.raises(ValueError, match="lacks"):
        framework.replay(uri, out_path=str(tmp_path / "replayed"))
    assert _copies() == []
