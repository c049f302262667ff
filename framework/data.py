"""Partitioned datasets: each partition is loaded once by the worker(s) that hold it and never moves again."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from framework.store.catalog import CatalogError, confine


def _as_tensor(a: Any) -> torch.Tensor:
    t = a.detach().cpu() if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
    if t.dtype == torch.float64:
        t = t.float()
    return t


def concat_data(parts: Sequence[Any]) -> Any:
    """Concatenate several partitions' data into one (used by the full-data baselines).

    Supports tuples and dicts of tensors or arrays (concatenated field by field), tensors, arrays and plain lists.
    Anything else raises `TypeError` naming the type, so a user with a custom `input_fn` knows to return one of these.
    """
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, tuple):
        return tuple(concat_data([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):  # fields by name (a `to_tensors` or a torch dataset's dict examples)
        return {k: concat_data([p[k] for p in parts]) for k in first}
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


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in `obj` (tuples, lists and dicts are walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def data_len(data: Any) -> int:
    """Number of examples in a partition's data (a tuple's first field's; a dict of fields' first one's, such as the
    features `extract` makes)."""
    if isinstance(data, tuple) and data:
        return data_len(data[0])
    if isinstance(data, dict) and data:
        return data_len(next(iter(data.values())))
    return len(data)


def _check_valid_fraction(valid_fraction: Any) -> None:
    """The share of the rows that validate, when a constructor splits one data set in two."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"`valid_fraction` is {valid_fraction!r}, but must be in (0, 1)")


def _check_reader_args(num_partitions: Any, columns: Any, label: Any, to_tensors: Any) -> None:
    """The arguments the source constructors share, checked before anything is listed or read."""
    if num_partitions is not None and (isinstance(num_partitions, bool) or not isinstance(num_partitions, int)
                                       or num_partitions < 1):
        raise ValueError(f"`num_partitions` is {num_partitions!r}, but must be an int >= 1 or None")
    if columns is not None and (isinstance(columns, str) or not isinstance(columns, Sequence) or not columns
                                or not all(isinstance(c, str) for c in columns)):
        raise TypeError(f"`columns` is {columns!r}, but must be a non-empty list of column names or None (all)")
    if label is not None and not isinstance(label, str):
        raise TypeError(f"`label` is {label!r}, but must be a column name or None (no label: the data is `(x,)`)")
    if to_tensors is not None and not callable(to_tensors):
        raise TypeError(f"`to_tensors` is {to_tensors!r}, but must be callable (run on the worker) or None")


@dataclass
class PartitionedDataset:
    """Training and validation data split into partitions, plus where each partition lives.

    Each train partition `j` is paired with validation partition `j`; a worker that holds partition `j` holds both.
    Entries are in-memory data (what `from_arrays` makes: a tuple `(x, y)` of tensors), a `framework.sources.Source`
    (what `from_parquet`, `from_hf_dataset`, `from_torch_dataset`, `from_webdataset` and `from_ray_dataset` make:
    the worker that holds the partition calls its `read()`; `input_fn` is not called for it), or anything the user's
    `input_fn(entry)` turns into data on the worker (what `from_files` keeps: a path or URI).

    Attributes:
        train: one entry per partition.
        valid: one entry per partition (same length as `train`).
        in_memory: True when entries already are data (`from_arrays`).
        replicas: how many workers hold each partition (Cerebro 5.5); ignored when `availability` is given.
        availability: optional explicit map partition -> worker indices.
        memory_limit: bytes a worker may hold (None: no limit): a partition, or the partitions one worker holds
            under the placement, whose estimated size (`partition_bytes`) exceeds it is an error before any work.
    """

    train: list[Any]
    valid: list[Any]
    in_memory: bool = False
    replicas: int = 1
    availability: dict[int, list[int]] | None = None
    memory_limit: int | None = None
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
        if self.memory_limit is not None:
            if isinstance(self.memory_limit, bool) or not isinstance(self.memory_limit, int) or self.memory_limit < 1:
                raise ValueError(f"`memory_limit` is {self.memory_limit!r}, but must be an int >= 1 (bytes per "
                                 "worker) or None")
            for j, nbytes in enumerate(self.partition_bytes()):
                if nbytes > self.memory_limit:
                    raise ValueError(f"partition {j} is estimated at {nbytes:,} bytes (train and valid), but "
                                     f"`memory_limit` is {self.memory_limit:,} bytes per worker: ask for more "
                                     "partitions or a larger limit")

    @property
    def num_partitions(self) -> int:
        """How many partitions the data has (train partition `j` is paired with valid partition `j`)."""
        return len(self.train)

    def partition_bytes(self) -> list[int]:
        """Each partition's estimated bytes (train and valid), known without reading data files: a source's
        `estimated_bytes()`, in-memory data's own size. An entry with no estimate (a torch dataset, a `from_files`
        entry) raises: `memory_limit` cannot be checked against it."""
        from framework.sources import Source

        def size(entry: Any, j: int) -> int:
            if self.in_memory:
                return tensor_bytes(entry)
            nbytes = entry.estimated_bytes() if isinstance(entry, Source) else None
            if nbytes is None:
                what = entry.describe()["kind"] if isinstance(entry, Source) else type(entry).__name__
                raise ValueError(f"`memory_limit` is {self.memory_limit!r}, but partition {j} ({what}) has no size "
                                 "known without reading it: pass memory_limit=None")
            return nbytes

        return [size(t, j) + size(v, j) for j, (t, v) in enumerate(zip(self.train, self.valid))]

    def _check_memory(self, held: Mapping[int, Sequence[int]]) -> None:
        """`held`: worker -> the partitions it holds; each worker's estimated bytes must fit `memory_limit`."""
        if self.memory_limit is None:
            return
        sizes = self.partition_bytes()
        for w, parts in sorted(held.items()):
            total = sum(sizes[p] for p in parts)
            if total > self.memory_limit:
                raise ValueError(f"worker {w} would hold partitions {sorted(parts)}, estimated at {total:,} bytes, but "
                                 f"`memory_limit` is {self.memory_limit:,} bytes per worker: use more workers, fewer "
                                 "replicas or a larger limit")

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
        _check_valid_fraction(valid_fraction)
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

    @classmethod
    def from_parquet(
        cls, train: Any, valid: Any, *, num_partitions: int | None = None, columns: Sequence[str] | None = None,
        label: str | None = "label", to_tensors: Callable | None = None, replicas: int = 1,
        memory_limit: int | None = None,
    ) -> PartitionedDataset:
        """Partitions of Parquet files, each read (memory-mapped) by the worker that holds it.

        `train`, `valid`: a file, a directory (its `*.parquet` files) or a list of files. The driver lists and stats
        them and never opens them. With at least `num_partitions` files (default: one partition per train file),
        each partition is whole files, balanced by size; with fewer, files are cut into row shares that the worker
        finds in the file's footer. The worker reads `columns` (default: all) and `label` and returns `(x, y)`
        (`framework.sources.table_to_tensors`), or `to_tensors(table)` (a `pyarrow.Table`; it runs on the
        worker). A column the files lack fails the load with an error naming it and the file (the schema is in the
        footer, which only the worker reads).
        """
        from framework.sources import ParquetSource

        return cls._of_files(ParquetSource, train, valid, num_partitions, (columns, label, to_tensors), replicas,
                             memory_limit)

    @classmethod
    def from_hf_dataset(
        cls, train: Any, valid: Any, *, num_partitions: int | None = None, columns: Sequence[str] | None = None,
        label: str | None = "label", to_tensors: Callable | None = None, replicas: int = 1,
        memory_limit: int | None = None,
    ) -> PartitionedDataset:
        """Partitions of a Hugging Face dataset's Arrow files, each memory-mapped by the worker that holds it.

        `train`, `valid`: the folder `datasets.Dataset.save_to_disk` wrote (of a `DatasetDict`: one split's
        folder), or a `datasets.Dataset` backed by Arrow cache files (what `load_dataset` returns); one held only in
        memory, or a view with an indices mapping (after `select`, `shuffle`, `filter`), is refused with what to do
        (`save_to_disk`, `flatten_indices`). The driver reads the folder's metadata (state.json, dataset_info.json)
        and checks `columns` and `label` against it; partitions and conversion are `from_parquet`'s.
        """
        from framework.sources import ArrowSource, check_columns, hf_arrow_files

        found = {}
        for param, value in (("train", train), ("valid", valid)):
            files, names = hf_arrow_files(param, value)
            if names:
                check_columns(names, columns, label, f"`{param}`")
            found[param] = files
        return cls._of_files(ArrowSource, found["train"], found["valid"], num_partitions, (columns, label, to_tensors),
                             replicas, memory_limit)

    @classmethod
    def from_webdataset(
        cls, train: Any, valid: Any, *, keys: Sequence[str], num_partitions: int | None = None,
        decode: str | None = None, to_tensors: Callable | None = None, replicas: int = 1,
        memory_limit: int | None = None,
    ) -> PartitionedDataset:
        """Partitions of WebDataset tar shards (a file, a directory of `*.tar` or a list), whole shards balanced by
        size, read by the worker that holds them with `webdataset` (`pip install modelhopper[webdataset]`).

        Each sample's `keys` (e.g. `("npy", "cls")`) make a tuple, decoded with webdataset's `decode` handler (None:
        its defaults) and collated to tensors, or `to_tensors(samples)` makes the data.
        """
        from framework.sources import WebDatasetSource, file_partitions, import_webdataset, list_files

        import_webdataset()
        if isinstance(keys, str) or not isinstance(keys, Sequence) or not keys:
            raise TypeError(f"`keys` is {keys!r}, but must be a non-empty list of sample keys, e.g. ('npy', 'cls')")
        _check_reader_args(num_partitions, None, "label", to_tensors)
        files = {p: list_files(p, v, (".tar",)) for p, v in (("train", train), ("valid", valid))}
        n = num_partitions or len(files["train"])
        parts = {p: file_partitions(p, f, n, shares=False) for p, f in files.items()}
        make = [[WebDatasetSource([f for f, _, _ in pieces], keys, decode, to_tensors) for pieces in parts[p]]
                for p in ("train", "valid")]
        return cls(make[0], make[1], replicas=replicas, memory_limit=memory_limit)

    @classmethod
    def from_torch_dataset(
        cls, dataset: Any, num_partitions: int, *, valid: Any = None, valid_fraction: float = 0.2,
        seed: int | None = 0,
        to_tensors: Callable | None = None, replicas: int = 1,
    ) -> PartitionedDataset:
        """Partitions of a map-style `torch.utils.data.Dataset`, indexed by the worker that holds each one.

        The dataset object travels pickled to the workers (through Ray); each worker shuffles the row numbers once
        with `seed` and indexes its own slice (`dataset[i]`), then collates the examples (`(x, y)` examples give a
        tuple of tensors, dicts a dict) or calls `to_tensors(examples)`. The driver calls only `len(dataset)`.
        `seed=None` keeps the dataset's order: each partition is a contiguous range of rows, which a dataset over a
        memory-mapped file reads as a range (shuffled rows touch every page of the file, whichever partition).
        `valid`: a dataset of its own, else `valid_fraction` of `dataset`'s rows. run.db records the dataset's type
        and length, not its data: resume and replay need it passed again (`dataset=`). There is no `memory_limit`:
        a torch dataset's size is not known without reading it.
        """
        from framework.sources import TorchSource

        datasets_ = {"dataset": dataset} if valid is None else {"dataset": dataset, "valid": valid}
        for param, d in datasets_.items():
            if isinstance(d, torch.utils.data.IterableDataset) or not (hasattr(d, "__getitem__")
                                                                     and hasattr(d, "__len__")):
                raise TypeError(f"`{param}` is a {type(d).__name__}, but must be a map-style torch Dataset "
                                "(__getitem__ and __len__): an iterable one cannot be partitioned by row")
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"`num_partitions` is {num_partitions!r}, but must be an int >= 1")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"`seed` is {seed!r}, but must be an int or None (the dataset's order)")
        _check_reader_args(num_partitions, None, "label", to_tensors)
        n = len(dataset)
        if valid is None:
            _check_valid_fraction(valid_fraction)
            n_valid = int(round(n * valid_fraction))
            pairs = (("train", dataset, n, n_valid, n - n_valid), ("valid", dataset, n, n_valid, n_valid))
        else:
            pairs = (("train", dataset, n, 0, n), ("valid", valid, len(valid), 0, len(valid)))
        made = {}
        for split, d, size, n_valid, rows in pairs:
            if rows < num_partitions:
                raise ValueError(f"`num_partitions` is {num_partitions}, but the {split} split has {rows} rows: each "
                                 "partition needs at least one")
            made[split] = [TorchSource(d, size, n_valid, seed, split, j, num_partitions, to_tensors)
                           for j in range(num_partitions)]
        return cls(made["train"], made["valid"], replicas=replicas)

    @classmethod
    def from_ray_dataset(
        cls, dataset: Any, num_partitions: int, *, valid: Any = None, valid_fraction: float = 0.2,
        columns: Sequence[str] | None = None, label: str | None = "label", to_tensors: Callable | None = None,
        replicas: int = 1, memory_limit: int | None = None,
    ) -> PartitionedDataset:
        """Partitions of a Ray Data dataset, split by Ray Data (`Dataset.split(num_partitions, equal=True)`: equal
        row counts, at most `num_partitions - 1` rows left out) into blocks that stay in Ray's object store.

        Each partition keeps its blocks' object refs; the worker that holds it fetches them (from the node that
        holds each block, never through the driver's process) and converts the table like `from_parquet`. No
        locality hints: the split is made before the workers exist, and Ray Data takes hints only as actor handles.
        `valid`: a dataset of its own, else the last `valid_fraction` of `dataset`'s rows
        (`train_test_split`). run.db records row counts only: resume and replay need the dataset passed again.
        Ray is the run's own (`ensure_ray`, before Ray Data runs anything here): a process that a plain
        `ray.init()` attached to the cluster `ray start` started on this machine is refused with a `RuntimeError`.
        """
        import ray.data

        for param, d in (("dataset", dataset), ("valid", valid)):
            if d is not None and not isinstance(d, ray.data.Dataset):
                raise TypeError(f"`{param}` is a {type(d).__name__}, but must be a ray.data.Dataset")
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"`num_partitions` is {num_partitions!r}, but must be an int >= 1")
        _check_reader_args(num_partitions, columns, label, to_tensors)
        if valid is None:
            _check_valid_fraction(valid_fraction)
        from framework.cluster.ray_start import ensure_ray
        from framework.cluster.spares import release_spare_workers

        ensure_ray()  # the engine's Ray check before Ray Data runs anything (its plain ray.init() is refused)
        release_spare_workers({"CPU": 1})  # (earlier runs' idle worker actors must leave Ray Data's tasks a CPU)
        if valid is None:
            dataset, valid = dataset.train_test_split(test_size=valid_fraction)
        from framework.sources import RayDataSource, check_columns

        made = {}
        for split, d in (("train", dataset), ("valid", valid)):
            if to_tensors is None:
                check_columns(d.schema().names, columns, label, f"the {split} Ray dataset")
            parts = d.split(num_partitions, equal=True)
            if parts[0].count() == 0:
                raise ValueError(f"`num_partitions` is {num_partitions}, but the {split} split has fewer rows: each "
                                 "partition needs at least one")
            made[split] = [RayDataSource(s.to_arrow_refs(), s.count(), s.size_bytes(), split, j, num_partitions,
                                         columns, label, to_tensors) for j, s in enumerate(parts)]
        return cls(made["train"], made["valid"], replicas=replicas, memory_limit=memory_limit)

    @classmethod
    def _of_files(cls, source: type, train: Any, valid: Any, num_partitions: int | None, args: tuple,
                  replicas: int, memory_limit: int | None) -> PartitionedDataset:
        """`from_parquet` and `from_hf_dataset`: files listed and statted, cut into partitions (`file_partitions`)."""
        from framework.sources import file_partitions, list_files

        _check_reader_args(num_partitions, *args)
        files = {p: list_files(p, v, source.suffixes) for p, v in (("train", train), ("valid", valid))}
        n = num_partitions or len(files["train"])
        made = [[source(pieces, *args) for pieces in file_partitions(p, files[p], n)] for p in ("train", "valid")]
        return cls(made[0], made[1], replicas=replicas, memory_limit=memory_limit)

    # ---- placement ----------------------------------------------------------------------------------------------
    def placement(self, num_workers: int) -> dict[int, list[int]]:
        """partition -> workers holding it. Default: partition j on workers j, j+1, ..., j+replicas-1 (mod p)."""
        if self.availability is not None:
            bad = {w for ws in self.availability.values() for w in ws if not 0 <= w < num_workers}
            if bad:
                raise ValueError(f"`availability` names workers {sorted(bad)}, but only 0..{num_workers - 1} exist")
            placed = {p: sorted(set(ws)) for p, ws in self.availability.items()}
        else:
            if self.replicas > num_workers:
                raise ValueError(f"`replicas` is {self.replicas}, but must be <= the number of workers ({num_workers})")
            placed = {
                j: sorted({(j + k) % num_workers for k in range(self.replicas)}) for j in range(self.num_partitions)
            }
        self._check_memory({w: [p for p, ws in placed.items() if w in ws] for w in range(num_workers)})
        return placed

    def worker_entries(self, per_partition: bool = True) -> dict[int, tuple[list[Any], list[Any]]]:
        """What workers load: `{partition: ([train entry], [valid entry])}`; `per_partition=False` (the full-data
        baselines) gives one "partition" 0 that is all the data."""
        if per_partition:
            return {p: ([self.train[p]], [self.valid[p]]) for p in range(self.num_partitions)}
        self._check_memory({0: list(range(self.num_partitions))})  # every worker holds all of it
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
    def load(cls, directory: str, description: Mapping[str, Any], dataset: PartitionedDataset | None = None
             ) -> PartitionedDataset:
        """Inverse of `save` (never unpickles). Partitions from a source that run.db cannot rebuild (a torch or
        Ray dataset, a `to_tensors` function: `Source.restorable`) come from `dataset`, the run's dataset passed
        again, which must describe the very partitions the run recorded."""
        if dataset is not None:
            if description["kind"] != "files" or dataset.in_memory:
                raise ValueError("`dataset` is given, but the run's run.db holds its data itself: leave dataset out")
            if not isinstance(dataset, PartitionedDataset):
                raise TypeError(f"`dataset` is a {type(dataset).__name__}, but must be a framework.PartitionedDataset")
            for split in ("train", "valid"):
                given = [encode_entry(e) for e in getattr(dataset, split)]
                if given != description[split]:
                    j = next((j for j, (a, b) in enumerate(zip(given, description[split])) if a != b),
                             min(len(given), len(description[split])))
                    raise ValueError(f"`dataset` is not the run's: its {split} partition {j} is "
                                     f"{given[j] if j < len(given) else None!r}, the run's "
                                     f"{description[split][j] if j < len(description[split]) else None!r}")
            return cls(list(dataset.train), list(dataset.valid), replicas=dataset.replicas)
        if description["kind"] == "files":
            from framework.sources import UnavailableSource

            back = cls.from_files([decode_entry(e) for e in description["train"]],
                                  [decode_entry(e) for e in description["valid"]])
            lost = sorted({e.description.get("kind", "?") for e in (*back.train, *back.valid)
                           if isinstance(e, UnavailableSource)})
            if lost:
                raise ValueError(f"the run read its partitions from a source run.db cannot rebuild ({', '.join(lost)}"
                                 ": a torch or Ray dataset, or a `to_tensors` function): pass the same dataset again"
                                 ", as dataset=... to ModelSelection.resume() or replay()")
            return back

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
    resume hand `input_fn` what the run did). Strings, numbers, booleans and None stay as they are. A
    `framework.sources.Source` is kept as its `describe()`."""
    from framework.sources import Source

    if isinstance(entry, (str, int, float, bool)) or entry is None:
        return entry
    if isinstance(entry, Source):
        return {"__type__": "source", "value": entry.describe()}
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
        if kind == "source":
            from framework.sources import Source

            return Source.restore(value)
        raise ValueError(f"unknown dataset entry type {kind!r} in the run's description")
    return obj
