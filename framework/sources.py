"""Data sources: a recipe for one partition's data, read by the worker that holds the partition.

A `Source` is what a `PartitionedDataset` keeps as a partition's entry when its data lives elsewhere (Parquet files,
a Hugging Face dataset saved to disk, a `torch.utils.data.Dataset`, WebDataset shards, a Ray Data dataset). The
driver builds sources from what it can learn without reading the data (file names and sizes, `len(dataset)`, Ray
Data's block metadata); the worker that holds the partition calls `read()` once, when it loads, and keeps the data.

The contract:

* `read()` runs on the worker and returns the partition's data: by default a tuple `(x, y)` of tensors (the
  feature columns stacked as `x`, the label column as `y`), the form `from_arrays` gives and `step_fn`'s
  `x, y = batch` takes; a source's `to_tensors` callable, when given, makes the data instead (it runs on the worker
  too, so it must pickle).
* `describe()` is a JSON dict with a `"kind"` that names the source's class in `Source.registry`; the run's run.db
  keeps it, and `Source.restore` rebuilds the source from it for resume and replay. A source that cannot be rebuilt
  from JSON (a torch or Ray dataset, or any source with a `to_tensors` function) says so with `restorable = False`;
  a run made from it is resumed or replayed with the same dataset passed again (`dataset=`).
* `estimated_bytes()` is the partition's size as the driver can know it without reading the data (`os.stat` of the
  files, Ray Data's metadata), or None when it cannot (a torch dataset); `memory_limit` checks use it.

Nothing here imports Ray, pyarrow, `datasets` or `webdataset` at module level: each source imports what it reads
with when it reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from framework.fingerprints import DataChangedError, file_print, regular_file, schema_change
from framework.registry import Registry

__all__ = [
    "ArrowSource",
    "DataChangedError",
    "ParquetSource",
    "RayDataSource",
    "Source",
    "TorchSource",
    "UnavailableSource",
    "WebDatasetSource",
    "table_to_tensors",
]

#: a piece of a file: (path, k, m) is the k-th of m equal shares of the file's rows (m = 1: the whole file)
Piece = tuple[str, int, int]


class Source:
    """One partition's data, read on the worker that holds it (see the module's docstring for the contract).

    Subclasses set `kind` (the name `describe()` records) and are registered under it when they are defined;
    `Source.restore(description)` rebuilds one from what `describe()` gave. Instances must pickle (Ray ships them to
    the workers) and must not read the data before `read()`.
    """

    #: the name `describe()` records under "kind" and `Source.restore` looks up
    kind: ClassVar[str] = ""
    #: kind -> class of every source defined
    registry: ClassVar[Registry[type[Source]]] = Registry("source kind")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            taken = Source.registry.get(cls.kind)
            if taken is not None and (taken.__module__, taken.__qualname__) == (cls.__module__, cls.__qualname__):
                del Source.registry[cls.kind]  # the same class defined again (a notebook cell run twice): the new one
            Source.registry.add(cls.kind, cls)

    @property
    def restorable(self) -> bool:
        """Whether `Source.restore(self.describe())` rebuilds this source (else resume and replay need the data
        passed again)."""
        return True

    def read(self) -> Any:
        """The partition's data; called on the worker, once per load."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON dict with "kind" and what `from_description` needs to rebuild this source."""
        raise NotImplementedError

    def estimated_bytes(self) -> int | None:
        """The partition's size as known without reading it (None: not known)."""
        return None

    def files(self) -> list[str]:
        """The files this source reads (absolute, resolved paths; none for a source that is not files)."""
        return []

    def fingerprint(self) -> dict[str, Any]:
        """What identifies what `read()` read, computed on the worker after it (`fingerprint_change` compares two):
        each file's path, size, modification time, schema (table files) and a hash of its bytes (`file_print`)."""
        return {"files": [file_print(f) for f in self.files()]}

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Source:
        """The source `describe()` described (the class of `description["kind"]`)."""
        raise NotImplementedError

    @staticmethod
    def restore(description: dict[str, Any]) -> Source:
        """The source a run.db's `description` names; an `UnavailableSource` for one that JSON cannot rebuild."""
        kind = description.get("kind") if isinstance(description, dict) else None
        cls = Source.registry.get(kind) if isinstance(kind, str) else None
        if cls is None or cls is UnavailableSource:
            raise ValueError(f"a dataset entry names the source kind {kind!r}, but the known kinds are "
                             f"{sorted(k for k in Source.registry if k != UnavailableSource.kind)}")
        if not description.get("restorable", True):
            return UnavailableSource(description)
        return cls.from_description(description)


class UnavailableSource(Source):
    """A partition that run.db describes but cannot rebuild (a torch or Ray dataset, a `to_tensors` function):
    resume and replay need the dataset passed again; reading it is an error that says so."""

    kind = "unavailable"

    def __init__(self, description: dict[str, Any]) -> None:
        self.description = dict(description)

    @property
    def restorable(self) -> bool:
        """Never: this is what stands for a source that JSON could not keep."""
        return False

    def read(self) -> Any:
        """Raises: the data is not in run.db."""
        raise ValueError(f"the run's partition {self.description!r} is not in its run.db; pass the same dataset "
                         "again as dataset=... to resume() or replay()")

    def describe(self) -> dict[str, Any]:
        """The description run.db holds."""
        return dict(self.description)


def _ref(fn: Callable | None) -> str | None:
    """`module:qualname` of a `to_tensors` function, for the record (never imported back)."""
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


# ---- tables to tensors -----------------------------------------------------------------------------------------
def _column_array(column: Any, name: str, where: str) -> np.ndarray:
    """A pyarrow column as a numpy array of shape (N, ...): numbers as they are, (nested) lists of numbers whose
    rows have equal lengths as extra dimensions."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr.type, pa.ExtensionType):  # e.g. Hugging Face's Array2D: lists underneath
        arr = arr.storage
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise ValueError(f"column {name!r} of {where} has {arr.null_count} missing rows; fill them, or pass "
                             "to_tensors=... to convert the table yourself")
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
        else:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            if lengths.size and (lengths != lengths[0]).any():
                raise ValueError(f"column {name!r} of {where} holds lists of different lengths ({int(lengths.min())}"
                                 f" to {int(lengths.max())}); pass to_tensors=... to pad or convert them yourself")
            size = int(lengths[0]) if lengths.size else 0
        shape.append(size)
        arr = arr.flatten()
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise TypeError(f"column {name!r} of {where} is of type {column.type}, which has no default conversion to "
                        "a tensor (numbers and lists of numbers have); pass to_tensors=... (a function of the "
                        "pyarrow.Table, run on the worker) or leave the column out with columns=[...]")
    if arr.null_count:
        raise ValueError(f"column {name!r} of {where} has {arr.null_count} missing values; fill them, or pass "
                         "to_tensors=... to convert the table yourself")
    return arr.to_numpy(zero_copy_only=False).reshape(shape)


def _tensor(a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.bool_:
        a = a.astype(np.int64)
    if not a.flags.writeable:  # a view of Arrow's (memory-mapped) buffers: the tensor gets memory of its own
        a = a.copy()
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.float() if t.dtype == torch.float64 else t.long() if t.dtype in (torch.int8, torch.int16, torch.int32,
                                                                               torch.uint8) else t


def table_to_tensors(table: Any, columns: Sequence[str] | None, label: str | None, where: str = "the table"
                     ) -> tuple[torch.Tensor, ...]:
    """The default conversion of a partition's `pyarrow.Table`: `(x, y)`.

    `x`: one feature column as a tensor of its shape (N, ...) (a list column of equal-length rows gains a
    dimension); several columns of numbers stacked as float32 (N, F). `y`: the `label` column, (N,) or (N, ...)
    (`label=None`: the data is `(x,)`). Float64 becomes float32; integers and booleans become int64. Anything else
    raises naming the column and `where`, and asks for `to_tensors`.
    """
    names = list(table.column_names)
    features = list(columns) if columns is not None else [n for n in names if n != label]
    if not features:
        raise ValueError(f"{where} has no feature column besides the label {label!r} (its columns: {names})")
    arrays = [_column_array(table.column(c), c, where) for c in features]
    if len(arrays) == 1:
        x = _tensor(arrays[0])
    else:
        wide = [c for c, a in zip(features, arrays) if a.ndim != 1]
        if wide:
            raise ValueError(f"columns {wide} of {where} hold lists, which cannot be stacked with the other feature "
                             f"columns {features}; name one column with columns=[...] or pass to_tensors=...")
        x = torch.from_numpy(np.stack([a.astype(np.float32) for a in arrays], axis=1))
    if label is None:
        return (x,)
    return x, _tensor(_column_array(table.column(label), label, where))


def _missing_columns(names: Sequence[str], columns: Sequence[str] | None, label: str | None) -> list[str]:
    wanted = [*(columns or []), *([label] if label is not None else [])]
    return [c for c in wanted if c not in names]


def check_columns(names: Sequence[str], columns: Sequence[str] | None, label: str | None, where: str) -> None:
    """Raise a `ValueError` naming each of `columns` and `label` that `names` (the columns of `where`) lacks."""
    missing = _missing_columns(names, columns, label)
    if missing:
        which = "`label`" if missing == [label] and label not in (columns or []) else "`columns`/`label`"
        raise ValueError(f"{which} name column(s) {missing}, but {where} has no such column (its columns: "
                         f"{list(names)})")


# ---- files ------------------------------------------------------------------------------------------------------
def list_files(param: str, value: Any, suffixes: tuple[str, ...]) -> list[str]:
    """The files `value` names (a file, a directory: its files ending with `suffixes`, sorted; or a list of
    files), each an absolute, resolved path checked to be a regular file (a FIFO, device or socket is refused: reading
    one would block or never end), a directory's inside it (a link out of it is refused); the driver only lists and
    stats them."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if os.path.isdir(path):
            found = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(suffixes))
            if not found:
                raise ValueError(f"`{param}` is {path!r}, a directory that holds no file ending with {suffixes}")
            return [regular_file(param, f, inside=os.path.realpath(path)) for f in found]
        values = [path]
    elif isinstance(value, Sequence) and value and all(isinstance(v, (str, os.PathLike)) for v in value):
        values = [os.fspath(v) for v in value]
    else:
        raise TypeError(f"`{param}` is {value!r}, but must be a file, a directory or a non-empty list of files")
    return [regular_file(param, path) for path in values]


def balance(sizes: Sequence[int], n: int) -> list[list[int]]:
    """`n` groups of the indices of `sizes` (len(sizes) >= n), each non-empty, by size as evenly as the greedy
    rule does: the largest first, each into the group that holds the fewest bytes (ties: the lowest group). The
    indices of a group come sorted, and the groups by their first index (n files: partition j is file j)."""
    assert 1 <= n <= len(sizes)
    groups: list[list[int]] = [[] for _ in range(n)]
    held = [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        g = min(range(n), key=lambda g: (held[g], g))
        groups[g].append(i)
        held[g] += sizes[i]
    return sorted(sorted(g) for g in groups)


def apportion(sizes: Sequence[int], n: int) -> list[int]:
    """How many shares each file is cut into when `n` partitions come from fewer files: in proportion to its size
    (largest remainders), at least one each, summing to `n`."""
    assert n >= len(sizes) >= 1
    total = sum(sizes) or 1
    quotas = [n * s / total for s in sizes]
    shares = [max(1, int(q)) for q in quotas]
    while sum(shares) < n:
        shares[max(range(len(sizes)), key=lambda i: (quotas[i] - shares[i], -i))] += 1
    while sum(shares) > n:
        shares[max((i for i in range(len(sizes)) if shares[i] > 1), key=lambda i: (shares[i] - quotas[i], -i))] -= 1
    return shares


def file_partitions(param: str, files: Sequence[str], n: int, *, shares: bool = True) -> list[list[Piece]]:
    """`n` partitions of `files` as pieces: whole files balanced by size when there are at least `n` files, else
    each file cut into row shares (`apportion`), which the worker picks out of the file's own index. `shares=False`
    (a format without one) refuses the latter."""
    sizes = [os.stat(f).st_size for f in files]
    if n > sum(sizes):  # (a share needs a row, and a row a byte at least)
        raise ValueError(f"`num_partitions` is {n}, but `{param}`'s {len(files)} file(s) hold {sum(sizes)} bytes: "
                         "each partition needs at least one row")
    if len(files) >= n:
        return [[(files[i], 0, 1) for i in group] for group in balance(sizes, n)]
    if not shares:
        raise ValueError(f"`num_partitions` is {n}, but `{param}` has only {len(files)} file(s), and each partition "
                         "reads whole files of this format: ask for at most that many partitions, or write more "
                         "shards")
    return [[(f, k, m)] for f, m in zip(files, apportion(sizes, n)) for k in range(m)]


def _piece_bytes(pieces: Sequence[Piece]) -> int:
    return sum(os.stat(f).st_size // m for f, _, m in pieces)


def _check_share(path: str, k: int, m: int, a: int, b: int, num_rows: int) -> None:
    if b <= a:
        raise ValueError(f"{path}: share {k + 1} of {m} holds no rows (the file has {num_rows} rows for {m} "
                         "partitions): ask for fewer partitions")


def _share(num_rows: int, k: int, m: int) -> tuple[int, int]:
    """Rows [a, b) of the k-th of m shares of `num_rows`."""
    return k * num_rows // m, (k + 1) * num_rows // m


class _TableSource(Source):
    """Pieces of files that hold tables (Parquet, Arrow), converted by `table_to_tensors` or `to_tensors`."""

    suffixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, pieces: Sequence[Piece], columns: Sequence[str] | None = None, label: str | None = "label",
                 to_tensors: Callable | None = None) -> None:
        self.pieces = [(str(f), int(k), int(m)) for f, k, m in pieces]
        self.columns = list(columns) if columns is not None else None
        self.label, self.to_tensors = label, to_tensors

    @property
    def restorable(self) -> bool:
        """JSON keeps files and columns, not a `to_tensors` function."""
        return self.to_tensors is None

    def _read_piece(self, path: str, k: int, m: int) -> Any:
        raise NotImplementedError

    def table(self) -> Any:
        """The partition as one `pyarrow.Table` (the pieces' rows in order). Every file is a regular file (checked
        before it is opened), readable (else an error naming it), of the first file's schema (else an error naming
        the file and the column)."""
        import pyarrow as pa

        self._schemas: dict[str, list[list[str]]] = {}
        tables = []
        for path, k, m in self.pieces:
            regular_file("the data", path)
            try:
                table = self._read_piece(path, k, m)
            except (pa.ArrowException, OSError, EOFError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(f"{path} cannot be read as {self.kind.capitalize()} ({first}): is it truncated, "
                                 f"empty or not a {self.kind.capitalize()} file?") from None
            tables.append(table)
        first_path, first = next(iter(self._schemas.items()))
        for path, schema in self._schemas.items():
            if schema != first:
                raise ValueError(f"{path}: {schema_change(first, schema)} against {first_path}; every file of a "
                                 "source must have the columns and types of the first")
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _keep_schema(self, path: str, schema: Any) -> None:
        self._schemas[path] = [[f.name, str(f.type)] for f in schema]

    def files(self) -> list[str]:
        """The pieces' files, once each."""
        return list(dict.fromkeys(f for f, _, _ in self.pieces))

    def fingerprint(self) -> dict[str, Any]:
        """Each file's print (`file_print`) and its schema as read."""
        schemas = getattr(self, "_schemas", {})
        return {"files": [{**file_print(f), "schema": schemas.get(f)} for f in self.files()]}

    def read(self) -> Any:
        """The pieces' rows as `(x, y)` (`table_to_tensors`), or what `to_tensors(table)` makes of them."""
        table = self.table()
        if self.to_tensors is not None:
            return self.to_tensors(table)
        where = self.pieces[0][0] if len(self.pieces) == 1 else f"{len(self.pieces)} files ({self.pieces[0][0]}, ...)"
        return table_to_tensors(table, self.columns, self.label, where)

    def _wanted(self, names: Sequence[str], path: str) -> list[str] | None:
        """The columns to read from a file whose columns are `names` (None: all), checked to exist."""
        check_columns(names, self.columns, self.label, path)
        if self.columns is None:
            return None
        return [*self.columns, *([self.label] if self.label is not None and self.label not in self.columns else [])]

    def describe(self) -> dict[str, Any]:
        """The files (and shares), columns and label; a `to_tensors` is named but not restorable."""
        return {"kind": self.kind, "pieces": [list(p) for p in self.pieces], "columns": self.columns,
                "label": self.label, "to_tensors": _ref(self.to_tensors), "restorable": self.restorable}

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Source:
        """A source of the same pieces, columns and label."""
        return cls([tuple(p) for p in description["pieces"]], description.get("columns"), description.get("label"))

    def estimated_bytes(self) -> int:
        """The pieces' bytes on disk (`os.stat`; a share: its part of the file's)."""
        return _piece_bytes(self.pieces)


class ParquetSource(_TableSource):
    """Parquet files (or row shares of one), read with pyarrow on the worker, memory-mapped. A share's rows are
    found from the file's footer: only the row groups that hold them are read. Columns are checked against the
    footer's schema on the worker (the footer is part of the file, which the driver never opens): a missing one
    fails the load with a `ValueError` that names the column and the file."""

    kind = "parquet"
    suffixes = (".parquet", ".parq")

    def _read_piece(self, path: str, k: int, m: int) -> Any:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path, memory_map=True)
        self._keep_schema(path, pf.schema_arrow)
        cols = self._wanted(pf.schema_arrow.names, path)
        if m == 1:
            return pf.read(columns=cols)
        meta = pf.metadata
        a, b = _share(meta.num_rows, k, m)
        _check_share(path, k, m, a, b, meta.num_rows)
        groups, start, first = [], 0, None
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if start < b and start + rows > a:
                groups.append(g)
                first = start if first is None else first
            start += rows
        if not groups:
            return pf.schema_arrow.empty_table().select(cols) if cols is not None else pf.schema_arrow.empty_table()
        return pf.read_row_groups(groups, columns=cols).slice(a - first, b - a)


class ArrowSource(_TableSource):
    """Arrow IPC stream files, as a Hugging Face dataset saved with `save_to_disk` keeps them (or row shares of
    one), memory-mapped on the worker: only the pages of the rows used are read."""

    kind = "arrow"
    suffixes = (".arrow",)

    def _read_piece(self, path: str, k: int, m: int) -> Any:
        import pyarrow as pa

        source = pa.memory_map(path)  # the table's buffers point into the map, which they keep open
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(source).read_all()
        self._keep_schema(path, table.schema)
        cols = self._wanted(table.column_names, path)
        if cols is not None:
            table = table.select(cols)
        if m == 1:
            return table
        a, b = _share(table.num_rows, k, m)
        _check_share(path, k, m, a, b, table.num_rows)
        return table.slice(a, b - a)


def hf_arrow_files(param: str, dataset: Any) -> tuple[list[str], list[str]]:
    """The Arrow files of a Hugging Face dataset (a saved `Dataset`'s folder, or a `datasets.Dataset` backed by
    its cache files) and its column names, learnt from metadata only."""
    if isinstance(dataset, (str, os.PathLike)):
        path = os.fspath(dataset)
        state = os.path.join(path, "state.json")
        if not os.path.isfile(state):
            if os.path.isfile(os.path.join(path, "dataset_dict.json")):
                raise ValueError(f"`{param}` is {path!r}, a saved DatasetDict: name one of its splits' folders, "
                                 f"e.g. {os.path.join(path, 'train')!r}")
            raise FileNotFoundError(f"`{param}` is {path!r}, but it holds no state.json: it is not a folder that "
                                    "datasets.Dataset.save_to_disk wrote")
        try:
            with open(state) as f:  # metadata: the data files' names (not the data)
                names_in = [d["filename"] for d in json.load(f)["_data_files"]]
            if not all(isinstance(n, str) for n in names_in):
                raise TypeError("a filename that is not a string")
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"`{param}` is {path!r}, whose state.json cannot be read as the one "
                             f"Dataset.save_to_disk writes ({type(e).__name__}: {e})") from None
        inside = os.path.realpath(path)
        for name in names_in:
            if os.path.isabs(name) or os.path.commonpath([os.path.realpath(os.path.join(inside, name)), inside]) != inside:
                raise ValueError(f"`{param}` is {path!r}, whose state.json names {name!r}, outside the folder; only "
                                 "files inside it are read")
        files = [os.path.join(path, n) for n in names_in]
        names: list[str] = []
        info = os.path.join(path, "dataset_info.json")
        if os.path.isfile(info):
            with open(info) as f:
                names = list(json.load(f).get("features") or {})
        for file in files:
            if not os.path.lexists(file):
                raise FileNotFoundError(f"`{param}` is {path!r}, whose state.json names {file!r}, but there is no "
                                        "such file")
        return [regular_file(param, file, inside=inside) for file in files], names
    try:
        import datasets
    except ImportError as e:
        raise ImportError("a Hugging Face dataset needs the `datasets` package: pip install modelhopper[hf]") from e
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"`{param}` is a {type(dataset).__name__}, but must be a datasets.Dataset or the folder "
                        "Dataset.save_to_disk wrote (a DatasetDict: pass one split, e.g. dataset['train'])")
    if not dataset.cache_files:
        raise ValueError(f"`{param}` is a datasets.Dataset held in this process's memory (it has no cache files), "
                         "which would have to travel through the driver: save it with dataset.save_to_disk(path) "
                         "and pass the path")
    if dataset._indices is not None:  # a select/shuffle/filter view: the files hold other rows, in another order
        raise ValueError(f"`{param}` is a view of its Arrow files (select, shuffle, filter or a split made an "
                         "indices mapping): call dataset.flatten_indices() or save_to_disk(path) first")
    return [d["filename"] for d in dataset.cache_files], list(dataset.column_names)


# ---- torch ------------------------------------------------------------------------------------------------------
def torch_indices(n: int, n_valid: int, seed: int | None, split: str, j: int, p: int) -> np.ndarray:
    """The rows of partition `j` of `p` of `split` ("train" or "valid") of a dataset of `n` rows of which `n_valid`
    are the validation rows (0: the split is the whole dataset): shuffled once with `seed` (None: in the dataset's
    order, so each partition is a contiguous range) and cut as `from_arrays` cuts. The worker computes it; nothing
    travels but these numbers."""
    perm = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    rows = perm if n_valid == 0 else perm[:n_valid] if split == "valid" else perm[n_valid:]
    return np.array_split(rows, p)[j]


def collate(examples: list[Any]) -> Any:
    """Examples as a batch (torch's `default_collate`): `(x, y)` examples give a tuple of tensors, dicts a dict."""
    from torch.utils.data import default_collate

    batch = default_collate(examples)
    if isinstance(batch, list):
        batch = tuple(batch)
    if isinstance(batch, tuple):
        return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t for t in batch)
    return batch


class TorchSource(Source):
    """Rows of a map-style `torch.utils.data.Dataset`, indexed on the worker: the dataset object travels pickled,
    the worker computes its rows (`torch_indices`) and calls `dataset[i]` for each, then `collate` (or
    `to_tensors(examples)`). The driver never calls `__getitem__`. Not restorable: run.db records the dataset's type
    and length only."""

    kind = "torch"

    def __init__(self, dataset: Any, n: int, n_valid: int, seed: int | None, split: str, j: int, p: int,
                 to_tensors: Callable | None = None) -> None:
        self.dataset, self.n, self.n_valid, self.seed = dataset, n, n_valid, seed
        self.split, self.j, self.p, self.to_tensors = split, j, p, to_tensors

    @property
    def restorable(self) -> bool:
        """Never: the dataset object is not JSON."""
        return False

    def read(self) -> Any:
        """`collate([dataset[i] for i in rows])` (or `to_tensors` of the examples)."""
        examples = [self.dataset[int(i)] for i in torch_indices(self.n, self.n_valid, self.seed, self.split, self.j,
                                                                self.p)]
        return self.to_tensors(examples) if self.to_tensors is not None else collate(examples)

    def fingerprint(self) -> dict[str, Any]:
        """The dataset's type and length (a torch dataset has no cheaper identity; resume compares its description
        too)."""
        t = type(self.dataset)
        return {"type": f"{t.__module__}.{t.__qualname__}", "len": len(self.dataset)}

    def describe(self) -> dict[str, Any]:
        """The dataset's type and length, the split and the partition (not the data)."""
        t = type(self.dataset)
        return {"kind": self.kind, "type": f"{t.__module__}.{t.__qualname__}", "len": self.n,
                "n_valid": self.n_valid, "seed": self.seed, "split": self.split, "partition": self.j, "of": self.p,
                "to_tensors": _ref(self.to_tensors), "restorable": False}


class WebDatasetSource(Source):
    """WebDataset tar shards, read on the worker with `webdataset` (sequentially: tar has no index), decoded with
    `decode` (webdataset's handler names, e.g. "torch", "pil"; None: its defaults), each sample's `keys` taken as a
    tuple and collated (`collate`), or `to_tensors(samples)`."""

    kind = "webdataset"

    def __init__(self, shards: Sequence[str], keys: Sequence[str], decode: str | None = None,
                 to_tensors: Callable | None = None) -> None:
        self.shards, self.keys, self.decode, self.to_tensors = [str(s) for s in shards], list(keys), decode, to_tensors

    @property
    def restorable(self) -> bool:
        """JSON keeps shards and keys, not a `to_tensors` function."""
        return self.to_tensors is None

    def read(self) -> Any:
        """The shards' samples as a batch."""
        wds = import_webdataset()
        stream = wds.WebDataset(self.shards, shardshuffle=False, empty_check=False)
        stream = stream.decode(self.decode) if self.decode is not None else stream.decode()
        samples = list(stream)
        if self.to_tensors is not None:
            return self.to_tensors(samples)
        if not samples:
            raise ValueError(f"the shards {self.shards} hold no samples")
        missing = [k for k in self.keys if k not in samples[0]]
        if missing:
            raise ValueError(f"`keys` name {missing}, but the samples of {self.shards[0]} have the keys "
                             f"{sorted(k for k in samples[0] if not k.startswith('__'))}")
        return collate([tuple(s[k] for k in self.keys) for s in samples])

    def describe(self) -> dict[str, Any]:
        """The shards, keys and decoder."""
        return {"kind": self.kind, "shards": self.shards, "keys": self.keys, "decode": self.decode,
                "to_tensors": _ref(self.to_tensors), "restorable": self.restorable}

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Source:
        """A source of the same shards, keys and decoder."""
        return cls(description["shards"], description["keys"], description.get("decode"))

    def estimated_bytes(self) -> int:
        """The shards' bytes on disk."""
        return sum(os.stat(s).st_size for s in self.shards)

    def files(self) -> list[str]:
        """The shards."""
        return list(self.shards)


def import_webdataset() -> Any:
    """`webdataset`, or an ImportError that names the extra to install."""
    try:
        import webdataset
    except ImportError as e:
        raise ImportError("WebDataset shards need the `webdataset` package: pip install modelhopper[webdataset]") from e
    return webdataset


# ---- Ray Data ---------------------------------------------------------------------------------------------------
class RayDataSource(Source):
    """One split of a Ray Data dataset: the object refs of its Arrow blocks (in Ray's object store). The worker
    `ray.get`s them (from the nodes that hold them; never through the driver's process), concatenates them and
    converts the table like the Parquet source. Not restorable: the blocks live only as long as the Ray cluster."""

    kind = "ray"

    def __init__(self, blocks: Sequence[Any], rows: int, nbytes: int, split: str, j: int, p: int,
                 columns: Sequence[str] | None = None, label: str | None = "label",
                 to_tensors: Callable | None = None) -> None:
        self.blocks, self.rows, self.nbytes = list(blocks), int(rows), int(nbytes)
        self.split, self.j, self.p = split, j, p
        self.columns = list(columns) if columns is not None else None
        self.label, self.to_tensors = label, to_tensors

    @property
    def restorable(self) -> bool:
        """Never: object refs do not outlive the cluster."""
        return False

    def read(self) -> Any:
        """The split's blocks as `(x, y)` (or `to_tensors(table)`)."""
        import pyarrow as pa
        import ray

        tables = [t for t in ray.get(self.blocks) if t.num_rows]
        table = pa.concat_tables(tables) if tables else ray.get(self.blocks[0])
        if self.to_tensors is not None:
            return self.to_tensors(table)
        where = f"Ray dataset split {self.j} of {self.p} ({self.split})"
        check_columns(table.column_names, self.columns, self.label, where)
        return table_to_tensors(table, self.columns, self.label, where)

    def describe(self) -> dict[str, Any]:
        """The split's rows and bytes (not the data)."""
        return {"kind": self.kind, "rows": self.rows, "bytes": self.nbytes, "split": self.split, "partition": self.j,
                "of": self.p, "columns": self.columns, "label": self.label, "to_tensors": _ref(self.to_tensors),
                "restorable": False}

    def estimated_bytes(self) -> int:
        """Ray Data's size of the split's blocks (from their metadata)."""
        return self.nbytes
