"""Partitioned datasets: each partition is loaded once by the worker(s) that hold it and never moves again."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from framework.engine.catalog import CatalogError, confine


def _as_tensor(a: Any) -> torch.Tensor:
    t = a.detach().cpu() if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
    if t.dtype == torch.float64:
        t = t.float()
    return t


def concat_data(parts: Sequence[Any]) -> Any:
    """Concatenate several partitions' data into one (used by the full-data baselines).

    Supports tuples/lists of tensors or arrays (concatenated element-wise), tensors, arrays and plain lists. Anything
    else raises `TypeError` naming the type, so a user with a custom `input_fn` knows to return one of these.
    """
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(concat_data([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts))
    if isinstance(first, np.ndarray):
        return np.concatenate(list(parts))
    if isinstance(first, list):
        return [x for p in parts for x in p]
    raise TypeError(
        f"cannot concatenate partitions of type {type(first).__name__}; the full-data executors need input_fn to "
        "return a tuple of tensors/arrays, a tensor, an array or a list"
    )


def shard_data(data: Any, index: int, count: int) -> Any:
    """Share `index` of `count` of a partition's data (every `count`-th example from `index`): what a member of a
    gang that shares one partition's pass trains on. Same types as `concat_data`, and dicts of them."""
    if count == 1:
        return data
    if isinstance(data, tuple):
        return tuple(shard_data(d, index, count) for d in data)
    if isinstance(data, dict):
        return {k: shard_data(v, index, count) for k, v in data.items()}
    if isinstance(data, (torch.Tensor, np.ndarray, list)):
        return data[index::count]
    raise TypeError(f"cannot share a partition of type {type(data).__name__} among a gang's workers; input_fn must "
                    "return a tuple or dict of tensors/arrays, a tensor, an array or a list")


def data_len(data: Any) -> int:
    """Number of examples in a partition's data (a tuple's first field's; a dict of fields' first one's, such as the
    features `extract` makes)."""
    if isinstance(data, tuple) and data:
        return data_len(data[0])
    if isinstance(data, dict) and data:
        return data_len(next(iter(data.values())))
    return len(data)


@dataclass
class PartitionedDataset:
    """Training and validation data split into partitions, plus where each partition lives.

    Each train partition `j` is paired with validation partition `j`; a worker that holds partition `j` holds both.
    Entries are either in-memory data (what `from_arrays` makes: a tuple `(x, y)` of tensors) or anything the user's
    `input_fn(entry)` turns into data on the worker (what `from_files` keeps: a path or URI).

    Attributes:
        train: one entry per partition.
        valid: one entry per partition (same length as `train`).
        in_memory: True when entries already are data (`from_arrays`).
        replicas: how many workers hold each partition (Cerebro 5.5); ignored when `availability` is given.
        availability: optional explicit map partition -> worker indices.
    """

    train: list[Any]
    valid: list[Any]
    in_memory: bool = False
    replicas: int = 1
    availability: dict[int, list[int]] | None = None
    _meta: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.train, list) or len(self.train) == 0:
            raise ValueError(f"`train` has {len(self.train) if self.train is not None else 0} partitions, but must have at least 1")
        if len(self.valid) != len(self.train):
            raise ValueError(
                f"`valid` has {len(self.valid)} partitions, but must have as many as `train` ({len(self.train)})"
            )
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"`replicas` is {self.replicas!r}, but must be an int >= 1")
        if self.availability is not None:
            missing = set(range(self.num_partitions)) - set(self.availability)
            if missing:
                raise ValueError(f"`availability` has no workers for partitions {sorted(missing)}")
            for p, ws in self.availability.items():
                if not ws:
                    raise ValueError(f"`availability[{p}]` is empty, but every partition needs at least one worker")

    @property
    def num_partitions(self) -> int:
        """How many partitions the data has (train partition `j` is paired with valid partition `j`)."""
        return len(self.train)

    # ---- constructors -----------------------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        x: Any,
        y: Any,
        num_partitions: int,
        valid_fraction: float = 0.2,
        seed: int = 0,
        replicas: int = 1,
    ) -> PartitionedDataset:
        """Shuffle once with `seed`, split into train/valid, then each into `num_partitions` partitions.

        Float64 features become float32; integer labels stay integer (use them with cross-entropy).
        """
        x_t, y_t = _as_tensor(x), _as_tensor(y)
        if len(x_t) != len(y_t):
            raise ValueError(f"`x` has {len(x_t)} rows but `y` has {len(y_t)}; they must match")
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"`num_partitions` is {num_partitions!r}, but must be an int >= 1")
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"`valid_fraction` is {valid_fraction!r}, but must be in (0, 1)")
        n = len(x_t)
        n_valid = int(round(n * valid_fraction))
        if n - n_valid < num_partitions or n_valid < num_partitions:
            raise ValueError(
                f"`num_partitions` is {num_partitions}, but {n} rows with valid_fraction={valid_fraction} leave "
                f"{n - n_valid} train and {n_valid} valid rows: each partition needs at least one of each"
            )
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
        valid_idx, train_idx = perm[:n_valid], perm[n_valid:]

        def split(idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
            return [(x_t[chunk].contiguous(), y_t[chunk].contiguous()) for chunk in torch.tensor_split(idx, num_partitions)]

        return cls(split(train_idx), split(valid_idx), in_memory=True, replicas=replicas)

    @classmethod
    def from_files(cls, train: Sequence[Any], valid: Sequence[Any], replicas: int = 1) -> PartitionedDataset:
        """One entry per partition (a path or URI); the user's `input_fn(entry)` reads it on the worker."""
        return cls(list(train), list(valid), in_memory=False, replicas=replicas)

    # ---- placement ----------------------------------------------------------------------------------------------
    def placement(self, num_workers: int) -> dict[int, list[int]]:
        """partition -> workers holding it. Default: partition j on workers j, j+1, ..., j+replicas-1 (mod p)."""
        if self.availability is not None:
            bad = {w for ws in self.availability.values() for w in ws if not 0 <= w < num_workers}
            if bad:
                raise ValueError(f"`availability` names workers {sorted(bad)}, but only 0..{num_workers - 1} exist")
            return {p: sorted(set(ws)) for p, ws in self.availability.items()}
        if self.replicas > num_workers:
            raise ValueError(f"`replicas` is {self.replicas}, but must be <= the number of workers ({num_workers})")
        return {
            j: sorted({(j + k) % num_workers for k in range(self.replicas)}) for j in range(self.num_partitions)
        }

    def worker_entries(self, per_partition: bool = True) -> dict[int, tuple[list[Any], list[Any]]]:
        """What workers load: `{partition: ([train entry], [valid entry])}`; `per_partition=False` (the full-data
        baselines) gives one "partition" 0 that is all the data."""
        if per_partition:
            return {p: ([self.train[p]], [self.valid[p]]) for p in range(self.num_partitions)}
        return {0: (list(self.train), list(self.valid))}

    # ---- persistence (replay and resume need the very same partitions) ------------------------------------------
    def save(self, directory: str) -> dict[str, Any]:
        """Write in-memory partitions as .npy files under `directory`; return a JSON-able description."""
        if not self.in_memory:
            return {"kind": "files", "train": [encode_entry(e) for e in self.train],
                    "valid": [encode_entry(e) for e in self.valid]}
        os.makedirs(directory, exist_ok=True)
        digests = {}  # recorded in the run's signed meta: resume and replay train on exactly these bytes
        for split, parts in (("train", self.train), ("valid", self.valid)):
            for j, part in enumerate(parts):
                for i, arr in enumerate(part):
                    buf = io.BytesIO()
                    np.save(buf, arr.numpy(), allow_pickle=False)
                    name = f"{split}_{j}_{i}.npy"
                    with open(os.path.join(directory, name), "wb") as f:
                        f.write(buf.getvalue())
                    digests[name] = hashlib.sha256(buf.getvalue()).hexdigest()
        return {"kind": "arrays", "num_partitions": self.num_partitions, "fields": len(self.train[0]),
                "sha256": digests}

    @classmethod
    def load(cls, directory: str, description: Mapping[str, Any]) -> PartitionedDataset:
        """Inverse of `save` (never unpickles)."""
        if description["kind"] == "files":
            return cls.from_files([decode_entry(e) for e in description["train"]],
                                  [decode_entry(e) for e in description["valid"]])

        digests = description.get("sha256") or {}

        def field(name: str) -> torch.Tensor:
            # a file that is a link out of the run's data folder is refused, never read; an edited one is refused
            with open(confine(directory, name, "the dataset"), "rb") as f:
                data = f.read()
            if name in digests and hashlib.sha256(data).hexdigest() != digests[name]:
                raise CatalogError(f"the dataset file {os.path.join(directory, name)} is not the one the run wrote "
                                   "(its sha256 differs from the one recorded in run.db)")
            return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))

        def read(split: str, j: int) -> tuple[torch.Tensor, ...]:
            return tuple(field(f"{split}_{j}_{i}.npy") for i in range(description["fields"]))

        n = description["num_partitions"]
        return cls([read("train", j) for j in range(n)], [read("valid", j) for j in range(n)], in_memory=True)


def encode_entry(entry: Any) -> Any:
    """A `from_files` entry as JSON that keeps its type: `Path`, tuples and dicts come back as they were (replay and
    resume hand `input_fn` what the run did). Strings, numbers, booleans and None stay as they are."""
    if isinstance(entry, (str, int, float, bool)) or entry is None:
        return entry
    if isinstance(entry, os.PathLike):
        return {"__type__": "path", "value": os.fspath(entry)}
    if isinstance(entry, tuple):
        return {"__type__": "tuple", "value": [encode_entry(v) for v in entry]}
    if isinstance(entry, list):
        return [encode_entry(v) for v in entry]
    if isinstance(entry, dict):
        if not all(isinstance(k, str) for k in entry):
            raise TypeError(f"a dataset entry {entry!r} has non-string keys: JSON cannot keep them")
        return {"__type__": "dict", "value": {k: encode_entry(v) for k, v in entry.items()}}
    raise TypeError(f"a dataset entry is a {type(entry).__name__} ({entry!r}); entries must be paths, strings, "
                    "numbers, or tuples, lists and dicts of them, so that replay and resume can store them")


def decode_entry(obj: Any) -> Any:
    """Inverse of `encode_entry` (a run from before type tags gets its strings back, as it stored them)."""
    if isinstance(obj, list):
        return [decode_entry(v) for v in obj]
    if isinstance(obj, dict) and "__type__" in obj:
        kind, value = obj["__type__"], obj["value"]
        if kind == "path":
            return Path(value)
        if kind == "tuple":
            return tuple(decode_entry(v) for v in value)
        if kind == "dict":
            return {k: decode_entry(v) for k, v in value.items()}
        raise ValueError(f"unknown dataset entry type {kind!r} in the run's description")
    return obj
