"""Activation cache of a frozen prefix, keyed by sample id, with prefetching (Egeria section 4.3).

`ActivationStore` is the small contract (put/get rows by integer sample id) so that the planner's feature store
(columnar memory-mapped arrays keyed by sample id) can later implement it and the two caches become one.
`MemmapActivationStore` implements it with fixed-size shards of ``np.memmap`` files (never one file per sample):
rows are appended in first-seen order and an id -> row index maps sample ids to rows. Float tensors are stored with
their own dtype, so a cached activation is bit-identical to the one that was put.

`ActivationPrefetcher` knows the upcoming order of sample-id batches (the data loader's future) and reads their
activations on a background thread, a few batches ahead of the training loop.
"""

from __future__ import annotations

import abc
import json
import queue
import shutil
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch


def _as_ids(sample_ids: torch.Tensor | Sequence[int] | np.ndarray) -> np.ndarray:
    ids = sample_ids.detach().cpu().numpy() if isinstance(sample_ids, torch.Tensor) else np.asarray(sample_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"`sample_ids` has shape {ids.shape} and dtype {ids.dtype}, but must be a 1-d integer array")
    return ids.astype(np.int64, copy=False)


class ActivationStore(abc.ABC):
    """Rows of one fixed shape and dtype, keyed by integer sample id.

    Implementations must return exactly the bytes that were put, must accept puts of ids already present (they
    overwrite), and need not be thread-safe for concurrent puts; `get` may run on a prefetch thread while the
    training thread calls `contains`.
    """

    @abc.abstractmethod
    def put(self, sample_ids: torch.Tensor | Sequence[int], rows: torch.Tensor) -> None:
        """Store ``rows[i]`` under ``sample_ids[i]``; `rows` is ``(len(sample_ids), *row_shape)``."""

    @abc.abstractmethod
    def get(self, sample_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The rows of `sample_ids` as a new CPU tensor ``(len(sample_ids), *row_shape)``; KeyError if one is missing."""

    @abc.abstractmethod
    def contains(self, sample_ids: torch.Tensor | Sequence[int]) -> bool:
        """True when every id of `sample_ids` has a row."""

    def flush(self) -> None:  # noqa: B027 - optional hook, a no-op for in-memory stores
        """Make every row durable (called before the owning controller's state leaves the worker)."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Drop every row (and the files behind them)."""

    @abc.abstractmethod
    def __len__(self) -> int: ...


class MemmapActivationStore(ActivationStore):
    """`ActivationStore` on memory-mapped shard files ``shard_00000.npy``... under `directory`.

    Args:
        directory: created if missing; the store owns it (``clear`` removes its shards).
        shard_rows: rows per shard file.
    """

    def __init__(self, directory: str | Path, shard_rows: int = 4096) -> None:
        if isinstance(shard_rows, bool) or not isinstance(shard_rows, int) or shard_rows < 1:
            raise ValueError(f"`shard_rows` is {shard_rows!r}, but must be an int >= 1")
        self.directory = Path(directory)
        self.shard_rows = shard_rows
        self._row_of: dict[int, int] = {}
        self._shards: list[np.memmap] = []
        self._row_shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        self._reopen()

    def _reopen(self) -> None:
        """Pick up the rows that a previous store in `directory` flushed (e.g. before a model hop)."""
        meta_path, ids_path = self.directory / "meta.json", self.directory / "ids.npy"
        if not (meta_path.exists() and ids_path.exists()):
            return
        meta = json.loads(meta_path.read_text())
        if meta["shard_rows"] != self.shard_rows:
            return
        self._row_shape, self._dtype = tuple(meta["row_shape"]), np.dtype(meta["dtype"])
        ids = np.load(ids_path)
        shards = (len(ids) + self.shard_rows - 1) // self.shard_rows
        self._shards = [
            np.lib.format.open_memmap(self.directory / f"shard_{i:05d}.npy", mode="r+") for i in range(shards)
        ]
        self._row_of = {int(sid): row for row, sid in enumerate(ids.tolist())}

    def flush(self) -> None:
        """Write the shards and the id index to disk, so a new store on the same directory sees every row."""
        if self._row_shape is None:
            return
        for shard in self._shards:
            shard.flush()
        ids = np.empty(len(self._row_of), dtype=np.int64)
        for sid, row in self._row_of.items():
            ids[row] = sid
        tmp = self.directory / "ids.tmp.npy"
        np.save(tmp, ids)
        tmp.replace(self.directory / "ids.npy")

    def __len__(self) -> int:
        return len(self._row_of)

    def _shard(self, index: int) -> np.memmap:
        while len(self._shards) <= index:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"shard_{len(self._shards):05d}.npy"
            shape = (self.shard_rows, *self._row_shape)  # type: ignore[misc]
            self._shards.append(np.lib.format.open_memmap(path, mode="w+", dtype=self._dtype, shape=shape))
        return self._shards[index]

    def put(self, sample_ids: torch.Tensor | Sequence[int], rows: torch.Tensor) -> None:
        ids = _as_ids(sample_ids)
        array = rows.detach().cpu().contiguous().numpy()  # (N, *row_shape)
        if array.shape[0] != len(ids):
            raise ValueError(f"`rows` has {array.shape[0]} rows, but must have one per sample id ({len(ids)})")
        if self._row_shape is None:
            self._row_shape, self._dtype = tuple(array.shape[1:]), array.dtype
            (self.directory).mkdir(parents=True, exist_ok=True)
            meta = {"row_shape": list(self._row_shape), "dtype": str(self._dtype), "shard_rows": self.shard_rows}
            (self.directory / "meta.json").write_text(json.dumps(meta))
        if tuple(array.shape[1:]) != self._row_shape or array.dtype != self._dtype:
            raise ValueError(
                f"`rows` has row shape {tuple(array.shape[1:])} and dtype {array.dtype}, "
                f"but must match the store's {self._row_shape} and {self._dtype}"
            )
        for i, sid in enumerate(ids.tolist()):
            row = self._row_of.get(sid, len(self._row_of))
            self._shard(row // self.shard_rows)[row % self.shard_rows] = array[i]
            self._row_of[sid] = row  # registered after the write, so a concurrent reader never sees a blank row

    def get(self, sample_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        ids = _as_ids(sample_ids)
        if self._row_shape is None:
            raise KeyError(f"sample id {int(ids[0]) if len(ids) else None} is not cached (the store is empty)")
        out = np.empty((len(ids), *self._row_shape), dtype=self._dtype)
        for i, sid in enumerate(ids.tolist()):
            row = self._row_of.get(sid)
            if row is None:
                raise KeyError(f"sample id {sid} is not cached")
            out[i] = self._shards[row // self.shard_rows][row % self.shard_rows]
        return torch.from_numpy(out)

    def contains(self, sample_ids: torch.Tensor | Sequence[int]) -> bool:
        return all(sid in self._row_of for sid in _as_ids(sample_ids).tolist())

    def clear(self) -> None:
        self._shards.clear()
        self._row_of.clear()
        self._row_shape = self._dtype = None
        if self.directory.exists():
            shutil.rmtree(self.directory)


class ActivationPrefetcher:
    """Reads the activations of upcoming sample-id batches from a store on a background thread.

    Call `schedule` with the future batches in order (e.g. the next epoch's id batches), then `take` once per
    training step with that step's ids. A batch is served from the prefetch queue when it is the next scheduled one
    and was cached; otherwise `take` reads it synchronously (a miss) or returns None if it is not in the store.

    Args:
        depth: how many batches may be read ahead (Egeria keeps about five in memory).
    """

    def __init__(self, store: ActivationStore, depth: int = 4) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"`depth` is {depth!r}, but must be an int >= 1")
        self.store = store
        self.depth = depth
        self.hits = 0
        self.misses = 0
        self._ready: queue.Queue[tuple[np.ndarray, torch.Tensor | None] | None] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active = False  # a read-ahead plan is being served

    def schedule(self, id_batches: Iterable[torch.Tensor | Sequence[int]]) -> None:
        """Replace the read-ahead plan with `id_batches` (consumed lazily, in order)."""
        self.stop()
        self._stop.clear()
        self._ready = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._run, args=(iter(id_batches),), daemon=True)
        self._active = True
        self._thread.start()

    def _run(self, batches: Iterable[torch.Tensor | Sequence[int]]) -> None:
        for batch in batches:
            ids = _as_ids(batch)
            try:
                rows = self.store.get(ids) if self.store.contains(ids) else None
            except KeyError:
                rows = None
            if not self._offer((ids, rows)):
                return
        self._offer(None)

    def _offer(self, item: tuple[np.ndarray, torch.Tensor | None] | None) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def take(self, sample_ids: torch.Tensor | Sequence[int]) -> torch.Tensor | None:
        """The cached activations of `sample_ids`, or None when they are not (all) in the store."""
        ids = _as_ids(sample_ids)
        pending = None
        if self._active:
            try:
                # the reader is at most `depth` batches ahead; a short wait here beats a synchronous read
                pending = self._ready.get(timeout=1.0)
            except queue.Empty:
                pending = None
            if pending is None:
                self._active = False  # plan exhausted (or stalled): read synchronously from now on
        if pending is not None and pending[1] is not None and np.array_equal(pending[0], ids):
            self.hits += 1
            return pending[1]
        self.misses += 1
        return self.store.get(ids) if self.store.contains(ids) else None

    def stop(self) -> None:
        """Stop reading ahead (joins the background thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        self._active = False
