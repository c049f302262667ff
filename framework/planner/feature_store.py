"""A feature store keyed by (layer key, sample id): columnar, memory-mapped numpy shards (Nautilus 4.2.3).

Layout under ``root``::

    <layer key>/shard_00000.npy   # (n, *feature_shape) one block of records, appended once, never rewritten
    <layer key>/ids_00000.npy     # (n,) int64 sample ids of that block

Each ``append`` writes one shard per layer (never one file per record); the index (sample id -> shard, row) is
rebuilt from the ids files when a store is reopened, so a crashed writer leaves at worst an unindexed temp file.
Shards are written to a temp name and renamed, so readers never see half a shard. The store knows nothing about
models, so other modules (an Egeria-style activation cache) can share it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FeatureStore:
    """Append-only features per layer key; ``read(key, ids)`` gathers rows in the order of ``ids``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, dict[int, tuple[int, int]]] = {}
        self._shards: dict[str, list[np.ndarray]] = {}
        for d in sorted(p for p in self.root.iterdir() if p.is_dir()):
            self._load_layer(d.name)

    def _dir(self, key: str) -> Path:
        return self.root / _SAFE.sub("_", key)

    def _load_layer(self, dirname: str) -> None:
        d = self.root / dirname
        index: dict[int, tuple[int, int]] = {}
        shards = []
        for s, ids_path in enumerate(sorted(d.glob("ids_*.npy"))):
            ids = np.load(ids_path)
            shards.append(np.load(d / ids_path.name.replace("ids_", "shard_"), mmap_mode="r"))
            for row, i in enumerate(ids.tolist()):
                index[int(i)] = (s, row)
        self._index[dirname] = index
        self._shards[dirname] = shards

    def keys(self) -> list[str]:
        return [k for k, v in self._index.items() if v]

    def __contains__(self, key: str) -> bool:
        return bool(self._index.get(_SAFE.sub("_", key)))

    def ids(self, key: str) -> np.ndarray:
        return np.fromiter(self._index.get(_SAFE.sub("_", key), {}), dtype=np.int64)

    def missing(self, key: str, ids: Sequence[int]) -> np.ndarray:
        """The ids (in order) that ``key`` does not hold yet."""
        index = self._index.get(_SAFE.sub("_", key), {})
        return np.asarray([i for i in np.asarray(ids).tolist() if int(i) not in index], dtype=np.int64)

    def nbytes(self, key: str | None = None) -> int:
        names = [_SAFE.sub("_", key)] if key is not None else list(self._shards)
        return sum(int(s.nbytes) for n in names for s in self._shards.get(n, []))

    def append(self, key: str, ids: Sequence[int], values: np.ndarray) -> None:
        """Store ``values[j]`` for sample ``ids[j]``; ids already present raise (features are immutable)."""
        ids_arr = np.asarray(ids, dtype=np.int64)
        values = np.ascontiguousarray(values)
        if ids_arr.ndim != 1 or len(ids_arr) != len(values):
            raise ValueError(f"`ids` has shape {ids_arr.shape}, but must be 1-D with one id per row of `values`")
        if len(np.unique(ids_arr)) != len(ids_arr):
            raise ValueError("`ids` holds duplicates, but every sample id must appear once")
        name = _SAFE.sub("_", key)
        index = self._index.setdefault(name, {})
        shards = self._shards.setdefault(name, [])
        dup = [int(i) for i in ids_arr.tolist() if int(i) in index]
        if dup:
            raise ValueError(f"`ids` {dup[:5]} are already stored for layer {key!r}; features are append-only")
        if shards and (shards[0].shape[1:] != values.shape[1:] or shards[0].dtype != values.dtype):
            raise ValueError(
                f"`values` has rows {values.shape[1:]} {values.dtype}, but layer {key!r} stores "
                f"{shards[0].shape[1:]} {shards[0].dtype}"
            )
        if not len(ids_arr):
            return
        d = self._dir(key)
        d.mkdir(exist_ok=True)
        s = len(shards)
        for stem, arr in (("shard", values), ("ids", ids_arr)):
            tmp = d / f".{stem}_{s:05d}.tmp.npy"
            np.save(tmp, arr)
            os.replace(tmp, d / f"{stem}_{s:05d}.npy")
        shards.append(np.load(d / f"shard_{s:05d}.npy", mmap_mode="r"))
        for row, i in enumerate(ids_arr.tolist()):
            index[int(i)] = (s, row)

    def read(self, key: str, ids: Sequence[int]) -> np.ndarray:
        """Rows of ``key`` for ``ids``, in that order (a copy, safe to hand to torch)."""
        name = _SAFE.sub("_", key)
        index, shards = self._index.get(name), self._shards.get(name)
        if not index:
            raise KeyError(f"layer {key!r} is not in the feature store")
        ids_list = np.asarray(ids).tolist()
        try:
            loc = np.asarray([index[int(i)] for i in ids_list], dtype=np.int64).reshape(-1, 2)
        except KeyError as e:
            raise KeyError(f"sample id {e.args[0]} is not stored for layer {key!r}") from None
        out = np.empty((len(ids_list), *shards[0].shape[1:]), dtype=shards[0].dtype)
        for s in np.unique(loc[:, 0]):
            sel = np.nonzero(loc[:, 0] == s)[0]
            out[sel] = shards[s][loc[sel, 1]]
        return out
