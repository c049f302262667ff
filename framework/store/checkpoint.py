"""Checkpoint files: atomic writes with a checksum, safe loads (`weights_only=True`), off the critical path.

torch is imported where a file is written or read, not with this module: the driver and the simulators import the
checkpoint store's vocabulary (`CorruptCheckpointError`, `CheckpointStore`) without loading torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from framework.store.catalog import SQLiteCatalog, UnsafePathError, confine


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file is missing, its checksum does not match the catalog, or it holds more than tensors and
    plain containers (the weights-only loader refuses it: it is never unpickled with code execution)."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


PARTIAL = ".tmp."  # in the name of a file being written (`write_atomic`); one left behind by a crash is never used


def write_atomic(state: dict[str, Any], path: str) -> tuple[str, int]:
    """torch.save to a temp file, fsync, rename over `path`. Returns (sha256, bytes)."""
    import torch

    tmp = f"{path}{PARTIAL}{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    digest, size = _sha256(tmp), os.path.getsize(tmp)
    os.replace(tmp, path)
    return digest, size


def write_later(fetch: Callable[[], Any], path: str) -> Callable[[], tuple[str, int]]:
    """What `Backend.save` returns for a backend that has no faster path: a function that fetches the state
    (`fetch()`: the backend's `get(handle, self_contained=True)`) and writes it (`write_atomic`) when the checkpoint
    store's thread calls it."""
    return lambda: write_atomic(fetch(), path)


def remove_partial(directory: str) -> int:
    """Remove the temporary files a crashed writer left in `directory`; returns how many."""
    _confine_folder(directory)
    partial = [f for f in os.listdir(directory) if PARTIAL in f] if os.path.isdir(directory) else []
    for f in partial:
        os.remove(os.path.join(directory, f))
    return len(partial)


def _confine_folder(directory: str) -> None:
    """A run's `checkpoints` folder that is a link out of the run directory is refused before anything in it is
    written or removed."""
    directory = os.path.abspath(directory)
    confine(os.path.dirname(directory), os.path.basename(directory), "the checkpoint folder")


def load_latest_verified(catalog: Any, config_id: int) -> tuple[dict[str, Any], int, int, list[tuple[str, str]]]:
    """The newest checkpoint of a config that verifies, read only: (state, epoch, units, skipped), where `skipped`
    lists the newer checkpoints that failed as (path, reason) and `state["checkpoint"]` says which file was loaded
    ({"path", "epoch", "units", "latest"}). Raises `CorruptCheckpointError` when none verifies."""
    skipped: list[tuple[str, str]] = []
    for epoch, units, stored, digest in catalog.checkpoints(config_id, resolve=False):
        try:
            path = catalog.resolve(stored, config_id, units)  # a row that leads outside the run is unusable
            state = load_verified(path, digest)
            state["checkpoint"] = {"path": path, "epoch": epoch, "units": units, "latest": not skipped}
            return state, epoch, units, skipped
        except (CorruptCheckpointError, UnsafePathError) as e:
            skipped.append((str(stored), str(e)))
    reasons = "; ".join(r for _, r in skipped) or "none written"
    raise CorruptCheckpointError(f"no valid checkpoint for config {config_id}: {reasons}")


def load_verified(path: str, sha256: str) -> dict[str, Any]:
    """Load a checkpoint after checking its checksum; never unpickles arbitrary objects.

    Raises `CorruptCheckpointError` (naming `path`) for a missing file, a checksum mismatch, and a file the
    weights-only unpickler refuses even though its checksum matches (a crafted or foreign pickle), so
    `CheckpointStore.load_latest` falls back to the previous checkpoint in every case.
    """
    if not os.path.exists(path):
        raise CorruptCheckpointError(f"checkpoint {path} is missing")
    actual = _sha256(path)
    if actual != sha256:
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt: sha256 {actual[:12]}... != recorded {sha256[:12]}...")
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever the weights-only unpickler refuses is unusable, like a bad checksum
        raise CorruptCheckpointError(
            f"checkpoint {path} is not a weights-only file, refused by the safe loader: {_refusal_reason(e)}"
        ) from e


def _refusal_reason(e: Exception) -> str:
    """The first sentence of torch's reason for refusing a file, without its advice to retry with
    weights_only=False or to allowlist the file's globals (both would run the file's code)."""
    text = str(e).split("WeightsUnpickler error:", 1)[-1]
    skip = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "weights_only" not in ln]
    reason = " ".join(ln for ln in lines if not ln.startswith(skip)).split(". ")[0].strip()
    return f"{type(e).__name__}: {reason[:300] or 'no reason given'}"


class CheckpointStore:
    """Keeps the latest (and the previous) checkpoint of every config in `directory`.

    `submit(config_id, epoch, units, fetch=..., started=...)` queues a write; a pool of `writers` background
    threads does it, so the driver's dispatch loop never waits on disk. `fetch() -> state` hands the state over, to
    be written here; `started() -> (sha256, bytes)` waits for a write already under way elsewhere (the worker that
    holds the state writes `path(config_id, units)`: `Backend.save`), and the thread only records it. Queued writes
    for one config are coalesced (only the newest is kept: a superseded write already under way is waited for and
    its file removed), and a config's writes are recorded in order. The two newest files per config are kept, so a
    corrupt latest file can fall back to the previous one.
    """

    def __init__(self, directory: str, catalog: SQLiteCatalog, keep: int = 2, writers: int = 4) -> None:
        _confine_folder(directory)
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.catalog = catalog
        self.keep = keep
        # config -> (epoch, units, write(path) -> (sha256, bytes), whether it is under way already)
        self._latest: dict[int, tuple[int, int, Callable[[str], tuple[str, int]], bool]] = {}
        # started, then coalesced away: (its file, to remove once written, or None when a newer write has its name)
        self._superseded: list[tuple[str | None, Callable[[str], tuple[str, int]]]] = []
        self._writing: set[int] = set()  # configs a thread is writing now
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._threads = [threading.Thread(target=self._loop, name=f"checkpoint-writer-{i}", daemon=True)
                         for i in range(writers)]
        for t in self._threads:
            t.start()

    def path(self, config_id: int, units: int) -> str:
        return os.path.join(self.directory, f"config_{config_id}_u{units}.pt")

    def submit(
        self,
        config_id: int,
        epoch: int,
        units: int,
        fetch: Callable[[], dict] | None = None,
        *,
        started: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        """Queue the state of `config_id` after `units` training units (in `epoch`): `fetch` gives the state, or
        `started` waits for its write to `path(config_id, units)`, begun elsewhere."""
        if started is not None:
            write = lambda path, started=started: started()  # noqa: E731
        elif fetch is not None:
            write = lambda path, fetch=fetch: write_atomic(fetch(), path)  # noqa: E731
        else:
            raise TypeError("submit() needs `fetch` or `started`")
        with self._lock:
            old = self._latest.get(config_id)
            if old is not None and old[3]:  # its file is removed once written, unless the newer write has its name
                keep = old[1] == units
                self._superseded.append((None if keep else self.path(config_id, old[1]), old[2]))
            fresh = old is None and config_id not in self._writing
            self._latest[config_id] = (epoch, units, write, started is not None)
        if old is not None and old[3]:
            self._queue.put(-1)  # a thread waits for the superseded write and removes its file
        if fresh:
            self._queue.put(config_id)

    def _loop(self) -> None:
        while True:
            config_id = self._queue.get()
            if config_id is None:
                self._queue.task_done()
                return
            if config_id == -1:
                with self._lock:
                    path, write = self._superseded.pop(0)
                try:
                    write(path)
                    if path is not None:
                        os.remove(path)
                except Exception:  # noqa: BLE001 - a write nobody needs any more
                    pass
                finally:
                    self._queue.task_done()
                continue
            with self._lock:
                epoch, units, write, _ = self._latest.pop(config_id)
                self._writing.add(config_id)
            try:
                path = self.path(config_id, units)
                digest, size = write(path)
                self.catalog.add_checkpoint(config_id, epoch, units, path, digest, size)
                # the older files go by the name this store gives them, in its own folder: never by a stored path
                for old in self.catalog.checkpoint_units(config_id)[self.keep :]:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(self.path(config_id, old))
            except Exception as e:  # noqa: BLE001 - recorded and surfaced by flush()
                self._errors.append(f"config {config_id}: {e!r}")
            finally:
                with self._lock:
                    self._writing.discard(config_id)
                    again = config_id in self._latest  # a newer state came while this one was written
                if again:
                    self._queue.put(config_id)
                self._queue.task_done()

    def flush(self) -> list[str]:
        """Wait until every queued write is on disk; return the errors seen so far."""
        self._queue.join()
        return list(self._errors)

    def close(self) -> None:
        self.flush()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)

    def load_latest(self, config_id: int) -> tuple[dict[str, Any], int, int]:
        """Newest verified checkpoint of a config as (state, epoch, units); falls back to older ones if corrupt,
        logging a `corrupt_checkpoint` event for each one skipped."""
        state, epoch, units, skipped = load_latest_verified(self.catalog, config_id)
        state.pop("checkpoint")  # what resumes: the state exactly as it was saved
        for path, error in skipped:
            self.catalog.add_event("corrupt_checkpoint", config_id=config_id, path=path, error=error)
        return state, epoch, units
