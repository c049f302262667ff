"""Data sources (`framework.sources`) and the `PartitionedDataset` constructors that make them: partitions from files
balanced by size or cut into row shares, each source read as a worker reads it (in-process here; on Ray in
tests/integration/test_sources_on_engine.py), run.db's JSON round trip, and every bad input as one clear error."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from framework.data import PartitionedDataset, concat_data, encode_entry
from framework.engine.worker import Worker
from framework.examples import classifier_step_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.sources import (
    ParquetSource,
    Source,
    TorchSource,
    UnavailableSource,
    apportion,
    balance,
    table_to_tensors,
)


def _table(rows: int, start: int = 0) -> pa.Table:
    """`rows` rows: features a (float64), b (int32) and emb (4 floats per row), label = row number % 3; a's value is
    the row's number from `start`, so tests can tell which rows a partition got."""
    ids = np.arange(start, start + rows)
    emb = np.stack([ids, ids + 0.5, ids + 0.25, ids + 0.125], axis=1).astype(np.float32)
    return pa.table({"a": ids.astype(np.float64), "b": (ids % 7).astype(np.int32),
                     "emb": pa.array(list(emb), type=pa.list_(pa.float32())), "label": ids % 3})


@pytest.fixture
def parquet(tmp_path):
    """train/: 3 files of 60, 120 and 180 rows (row groups of 25); valid/: 1 file of 90 rows."""
    (tmp_path / "train").mkdir()
    (tmp_path / "valid").mkdir()
    start = 0
    for i, rows in enumerate((60, 120, 180)):
        pq.write_table(_table(rows, start), tmp_path / "train" / f"part-{i}.parquet", row_group_size=25)
        start += rows
    pq.write_table(_table(90, 1000), tmp_path / "valid" / "v.parquet", row_group_size=25)
    return tmp_path


def _rows(data) -> list[int]:
    return [int(v) for v in data[0][:, 0]]


def test_balance_puts_the_largest_first_into_the_lightest_group():
    # 5 -> g0; 4 -> g1; 3 -> g1 (4 < 5); 2 -> g0 (5 < 7); 1 -> g0 (7 = 7, the lower group)
    assert balance([5, 1, 4, 2, 3], 2) == [[0, 1, 3], [2, 4]]
    assert balance([1, 1, 1], 3) == [[0], [1], [2]]


def test_apportion_gives_each_file_a_share_and_the_rest_by_size():
    assert apportion([100, 300], 5) == [1, 4]
    assert apportion([1, 1, 1], 3) == [1, 1, 1]
    assert apportion([1, 1000], 3) == [1, 2]  # the small file still gets its share
    assert apportion([7, 3, 9], 11) == [4, 2, 5]


def test_parquet_partitions_are_whole_files_balanced_by_size(parquet):
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid" / "v.parquet", num_partitions=2,
                                         columns=["a", "b"])
    assert [len(e.pieces) for e in ds.train] == [2, 1]  # 60 + 120 rows together; 180 alone
    worker = Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn))
    counts = worker.load(dict(ds.worker_entries()))
    assert counts == {0: 180, 1: 180}
    x, y = worker.data[("train", 0)]
    assert x.shape == (180, 2) and x.dtype == torch.float32 and y.dtype == torch.int64
    seen = sorted(_rows(worker.data[("train", 0)]) + _rows(worker.data[("train", 1)]))
    assert seen == list(range(360))
    assert sorted(_rows(worker.data[("valid", 0)]) + _rows(worker.data[("valid", 1)])) == list(range(1000, 1090))


def test_parquet_with_fewer_files_than_partitions_cuts_row_shares_from_the_footer(parquet):
    ds = PartitionedDataset.from_parquet(parquet / "train" / "part-0.parquet", parquet / "valid", num_partitions=3,
                                         columns=["emb"])
    assert [e.pieces[0][1:] for e in ds.train] == [(0, 3), (1, 3), (2, 3)]
    parts = [e.read() for e in ds.train]
    assert [len(p[0]) for p in parts] == [20, 20, 20] and parts[0][0].shape == (20, 4)
    assert [int(v) for p in parts for v in p[0][:, 0]] == list(range(60))  # in order, each row once
    assert parts[1][1].tolist() == [i % 3 for i in range(20, 40)]


def test_default_columns_are_all_but_the_label_and_lists_need_a_column_of_their_own(parquet):
    source = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", num_partitions=1).train[0]
    with pytest.raises(ValueError, match=r"columns \['emb'\] of .* hold lists"):
        source.read()


def test_table_to_tensors_refuses_a_string_column_naming_it():
    table = pa.table({"text": ["a", "b"], "label": [0, 1]})
    with pytest.raises(TypeError, match="column 'text' of here is of type string.*to_tensors"):
        table_to_tensors(table, None, "label", "here")


def test_label_none_gives_a_one_field_tuple_and_to_tensors_replaces_the_conversion(parquet):
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", columns=["a"], label=None)
    (x,) = ds.train[0].read()
    assert x.shape[1:] == ()
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid",
                                         to_tensors=_as_dict, num_partitions=3)
    data = ds.train[0].read()
    assert set(data) == {"a", "label"} and not ds.train[0].restorable
    assert concat_data([ds.train[0].read(), ds.train[1].read()])["a"].shape == (180,)  # files 0 and 1


def _as_dict(table: pa.Table) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(table.column(name).to_numpy()) for name in ("a", "label")}


def test_a_missing_parquet_file_is_an_error_naming_it_before_anything_is_read(parquet):
    with pytest.raises(FileNotFoundError, match="`valid` names '.*nope.parquet', but there is no such file"):
        PartitionedDataset.from_parquet(parquet / "train", [parquet / "nope.parquet"])
    (parquet / "empty").mkdir()
    with pytest.raises(ValueError, match="`train` is .*empty', a directory that holds no file ending with"):
        PartitionedDataset.from_parquet(parquet / "empty", parquet / "valid")


def test_a_missing_column_fails_the_read_naming_the_column_and_the_file(parquet):
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", columns=["a", "nope"])
    with pytest.raises(ValueError, match=r"name column\(s\) \['nope'\], but .*part-\d.parquet has no such column"):
        ds.train[0].read()
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", label="target")
    with pytest.raises(ValueError, match=r"`label` name column\(s\) \['target'\]"):
        ds.train[0].read()


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"num_partitions": 0}, ValueError, "`num_partitions` is 0, but must be an int >= 1"),
    ({"columns": "a"}, TypeError, "`columns` is 'a', but must be a non-empty list"),
    ({"label": 3}, TypeError, "`label` is 3, but must be a column name"),
    ({"to_tensors": "f"}, TypeError, "`to_tensors` is 'f', but must be callable"),
    ({"memory_limit": 0}, ValueError, "`memory_limit` is 0, but must be an int >= 1"),
])
def test_bad_arguments_are_one_clear_error(parquet, kwargs, error, message):
    with pytest.raises(error, match=message):
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", **kwargs)


def test_memory_limit_refuses_a_partition_and_a_worker_that_would_not_fit(parquet):
    sizes = [os.stat(parquet / "train" / f"part-{i}.parquet").st_size for i in range(3)]
    valid = os.stat(parquet / "valid" / "v.parquet").st_size
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", memory_limit=10**9)
    per_partition = ds.partition_bytes()
    assert per_partition == [s + valid // 3 for s in sizes]  # statted, never read
    with pytest.raises(ValueError, match=f"partition 2 is estimated at {per_partition[2]:,} bytes.*`memory_limit` is"):
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", memory_limit=per_partition[2] - 1)
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", memory_limit=max(per_partition),
                                         replicas=2)
    with pytest.raises(ValueError, match=r"worker 0 would hold partitions \[0, 2\], estimated at"):
        ds.placement(3)
    with pytest.raises(ValueError, match="partition 0 .* has no size known without reading it"):
        PartitionedDataset.from_files(["a"], ["b"]).__class__(["a"], ["b"], memory_limit=5)


def test_sources_round_trip_through_run_db_json_and_pickle(parquet):
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", num_partitions=4, columns=["a"])
    desc = json.loads(json.dumps(ds.save(str(parquet / "data"))))
    back = PartitionedDataset.load(str(parquet / "data"), desc)
    assert [encode_entry(e) for e in back.train] == desc["train"]
    assert all(torch.equal(a[0], b[0]) for a, b in zip((e.read() for e in ds.valid), (e.read() for e in back.valid)))
    again = pickle.loads(pickle.dumps(ds.train[1]))
    assert isinstance(again, ParquetSource) and torch.equal(again.read()[0], ds.train[1].read()[0])
    with pytest.raises(ValueError, match="names the source kind 'nope', but the known kinds are"):
        Source.restore({"kind": "nope"})


class Numbers(torch.utils.data.Dataset):
    """Row i is ([i, i/2], i % 2); indexing it in the process that made it is an error (the driver never reads)."""

    def __init__(self, n: int) -> None:
        self.n, self.maker = n, os.getpid()
        self.strict = False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.strict and os.getpid() == self.maker:
            raise AssertionError("the driver indexed the dataset")
        return torch.tensor([float(i), i / 2], dtype=torch.float64), i % 2


def test_torch_dataset_partitions_are_indexed_by_the_reader_and_cover_every_row_once():
    data = Numbers(50)
    data.strict = True
    ds = PartitionedDataset.from_torch_dataset(data, 3, valid_fraction=0.2, seed=4)  # no __getitem__ on this side
    data.strict = False
    parts = [e.read() for e in (*ds.train, *ds.valid)]
    assert parts[0][0].dtype == torch.float32 and parts[0][1].dtype == torch.int64
    assert sorted(int(v) for p in parts for v in p[0][:, 0]) == list(range(50))
    assert sum(len(p[0]) for p in parts[3:]) == 10
    with_valid = PartitionedDataset.from_torch_dataset(Numbers(30), 2, valid=Numbers(8))
    assert [len(e.read()[0]) for e in with_valid.valid] == [4, 4]
    in_order = PartitionedDataset.from_torch_dataset(Numbers(30), 3, valid_fraction=0.2, seed=None)
    assert [[int(v) for v in e.read()[0][:, 0]] for e in in_order.train] == [list(range(6 + 8 * j, 14 + 8 * j))
                                                                             for j in range(3)]


def test_torch_dataset_is_not_in_run_db_and_resume_asks_for_it_again(tmp_path):
    ds = PartitionedDataset.from_torch_dataset(Numbers(20), 2)
    desc = json.loads(json.dumps(ds.save(str(tmp_path))))
    assert desc["train"][0]["value"]["type"].endswith("Numbers") and desc["train"][0]["value"]["len"] == 20
    with pytest.raises(ValueError, match="pass the same dataset again, as dataset=... to ModelSelection.resume"):
        PartitionedDataset.load(str(tmp_path), desc)
    back = PartitionedDataset.load(str(tmp_path), desc, PartitionedDataset.from_torch_dataset(Numbers(20), 2))
    assert isinstance(back.train[0], TorchSource) and len(back.train[0].read()[0]) == 8
    with pytest.raises(ValueError, match="`dataset` is not the run's: its train partition 0"):
        PartitionedDataset.load(str(tmp_path), desc, PartitionedDataset.from_torch_dataset(Numbers(21), 2))
    assert isinstance(Source.restore(desc["train"][0]["value"]), UnavailableSource)


def test_torch_dataset_refuses_an_iterable_one():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="`dataset` is a Stream, but must be a map-style torch Dataset"):
        PartitionedDataset.from_torch_dataset(Stream(), 2)
    with pytest.raises(ValueError, match="`num_partitions` is 30, but the train split has 16 rows"):
        PartitionedDataset.from_torch_dataset(Numbers(20), 30)


def test_saved_hf_dataset_is_memory_mapped_by_the_reader_and_its_columns_checked_on_the_driver(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = np.arange(40, dtype=np.float32)
    d = datasets.Dataset.from_dict({"x": np.stack([rows, -rows], 1).tolist(), "label": (np.arange(40) % 3).tolist()})
    d.save_to_disk(str(tmp_path / "train"), num_shards=2)
    d.select(range(12)).save_to_disk(str(tmp_path / "valid"))
    ds = PartitionedDataset.from_hf_dataset(str(tmp_path / "train"), str(tmp_path / "valid"), num_partitions=3)
    parts = [e.read() for e in ds.train]
    assert [p[0].shape for p in parts] == [(10, 2), (10, 2), (20, 2)]
    assert sorted(int(v) for p in parts for v in p[0][:, 0]) == list(range(40))
    assert json.loads(json.dumps(encode_entry(ds.valid[0])))["value"]["kind"] == "arrow"
    with pytest.raises(ValueError, match=r"name column\(s\) \['nope'\], but `train` has no such column"):
        PartitionedDataset.from_hf_dataset(str(tmp_path / "train"), str(tmp_path / "valid"), columns=["nope"])
    with pytest.raises(ValueError, match="held in this process's memory.*save_to_disk"):
        PartitionedDataset.from_hf_dataset(d, str(tmp_path / "valid"))
    loaded = datasets.load_from_disk(str(tmp_path / "train"))
    assert PartitionedDataset.from_hf_dataset(loaded, str(tmp_path / "valid"), num_partitions=2).num_partitions == 2
    with pytest.raises(ValueError, match="is a view of its Arrow files"):
        PartitionedDataset.from_hf_dataset(loaded.select([3, 1]), str(tmp_path / "valid"))
    with pytest.raises(FileNotFoundError, match="holds no state.json"):
        PartitionedDataset.from_hf_dataset(str(tmp_path), str(tmp_path / "valid"))


def _shards(folder, count: int, per: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for s in range(count):
        path = os.path.join(folder, f"shard-{s}.tar")
        with tarfile.open(path, "w") as tf:
            for i in range(per):
                buf = io.BytesIO()
                np.save(buf, np.full(3, s * per + i, dtype=np.float32))
                for name, data in ((f"{s:02d}{i:04d}.npy", buf.getvalue()), (f"{s:02d}{i:04d}.cls", b"%d" % (i % 2))):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def test_webdataset_shards_are_whole_partitions(tmp_path):
    pytest.importorskip("webdataset")
    shards = _shards(tmp_path / "train", 3, 5)
    valid = _shards(tmp_path / "valid", 2, 2)
    ds = PartitionedDataset.from_webdataset(tmp_path / "train", valid, keys=("npy", "cls"), num_partitions=2)
    parts = [e.read() for e in ds.train]
    assert sorted(len(p[0]) for p in parts) == [5, 10] and parts[0][0].shape[1:] == (3,)
    assert sorted(int(v) for p in parts for v in p[0][:, 0]) == list(range(15))
    with pytest.raises(ValueError, match="`num_partitions` is 4, but `train` has only 3 file"):
        PartitionedDataset.from_webdataset(shards, valid, keys=("npy", "cls"), num_partitions=4)
    with pytest.raises(ValueError, match=r"`keys` name \['png'\], but the samples of .* have the keys \['cls', 'npy'\]"):
        PartitionedDataset.from_webdataset(shards, valid, keys=("png", "cls"), num_partitions=2).train[0].read()


def test_a_run_whose_workers_would_hold_more_than_memory_limit_is_refused_before_any_work(parquet, tmp_path):
    import automl
    import framework

    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", memory_limit=max(
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid").partition_bytes()) + 1, replicas=2)
    with pytest.raises(ValueError, match=r"worker \d would hold partitions .* but `memory_limit` is"):
        framework.ModelSelection(mlp_model_fn, step_fn=classifier_step_fn, dataset=ds, num_workers=3,
                                 procedure=automl.GridSearch({"lr": [0.1]}, epochs=1),
                                 storage_path=str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


# ---- what a source may read, and what it recorded (issue 47) --------------------------------------------------
def test_only_regular_files_inside_a_named_folder_are_listed_as_resolved_paths(parquet, tmp_path):
    from framework.sources import list_files  # (resolved by framework.fingerprints.regular_file)

    found = list_files("train", os.path.relpath(parquet / "train"), (".parquet",))
    assert found and all(os.path.isabs(f) and f == os.path.realpath(f) for f in found)
    os.mkfifo(parquet / "train" / "x.parquet")  # a FIFO would block the worker's read for ever
    with pytest.raises(ValueError, match=r"x\.parquet', which is a FIFO; only regular files are read"):
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid")
    with pytest.raises(ValueError, match="which is a FIFO"):
        PartitionedDataset.from_parquet([parquet / "train" / "x.parquet"], parquet / "valid")
    os.remove(parquet / "train" / "x.parquet")
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(_table(10), outside)
    os.symlink(outside, parquet / "train" / "link.parquet")
    with pytest.raises(ValueError, match=r"link\.parquet' links to .*elsewhere\.parquet', outside it"):
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid")


def test_more_partitions_than_the_files_could_hold_is_refused_at_once(parquet):
    with pytest.raises(ValueError, match=r"`num_partitions` is 1000000, but `train`'s 3 file\(s\) hold \d+ bytes"):
        PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", num_partitions=10**6)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b""), "cannot be read as Parquet"),
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "cannot be read as Parquet"),
    (lambda p: p.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1"), "cannot be read as Parquet"),
], ids=["empty", "truncated", "corrupt"])
def test_a_damaged_file_fails_the_read_naming_it(parquet, damage, message):
    ds = PartitionedDataset.from_parquet(parquet / "train", parquet / "valid", num_partitions=3)
    target = parquet / "train" / "part-2.parquet"
    damage(target)
    source = next(s for s in ds.train if str(target) in s.files())
    with pytest.raises(ValueError, match=rf"{target}.*{message}"):
        source.read()


def test_files_of_one_source_with_other_columns_or_types_fail_naming_the_file_and_column(parquet):
    t = _table(30)
    pq.write_table(t.set_column(3, "label", pa.array(np.arange(30) % 3, type=pa.float32())),
                   parquet / "train" / "part-1.parquet")
    source = ParquetSource([(str(parquet / "train" / f"part-{i}.parquet"), 0, 1) for i in range(3)])
    with pytest.raises(ValueError, match=r"part-1\.parquet: column 'label' is of type float, not int64 against "
                                         r".*part-0\.parquet"):
        source.read()
    pq.write_table(t.rename_columns(["a", "g", "emb", "label"]), parquet / "train" / "part-1.parquet")
    with pytest.raises(ValueError, match=r"part-1\.parquet: column\(s\) \['b'\] are gone and \['g'\] are new"):
        source.read()


def test_an_empty_share_of_a_file_is_an_error_naming_it(parquet):
    source = ParquetSource([(str(parquet / "valid" / "v.parquet"), 0, 200)])
    with pytest.raises(ValueError, match=r"v\.parquet: share 1 of 200 holds no rows \(the file has 90 rows"):
        source.read()


def test_a_fingerprint_tells_content_size_and_columns_apart_but_not_a_touch(parquet):
    from framework.fingerprints import fingerprint_change

    path = parquet / "train" / "part-0.parquet"
    source = ParquetSource([(str(path), 0, 1)], columns=["a", "b"])
    source.read()
    before = source.fingerprint()
    assert [f["path"] for f in before["files"]] == [str(path)] and before["files"][0]["schema"][0] == ["a", "double"]
    os.utime(path, ns=(1, 1))  # a touch (or a copy) keeps the data
    source.read()
    assert fingerprint_change("p", before, source.fingerprint()) is None
    # other labels, the same size and modification time: the bytes tell
    opts = {"compression": "none", "use_dictionary": False, "write_statistics": False}
    pq.write_table(_table(60), path, **opts)
    source.read()
    plain = source.fingerprint()
    st = path.stat()
    pq.write_table(_table(60).set_column(3, "label", pa.array((np.arange(60) + 1) % 3)), path, **opts)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    source.read()
    assert "has other content than when the run read it" in fingerprint_change("p", plain, source.fingerprint())
    pq.write_table(_table(61), path)
    source.read()
    assert "bytes when the run read it" in fingerprint_change("p", plain, source.fingerprint())


def test_a_saved_hf_dataset_whose_state_json_escapes_or_is_malformed_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    d = datasets.Dataset.from_dict({"x": [[1.0, 2.0]] * 8, "label": [0, 1] * 4})
    d.save_to_disk(str(tmp_path / "train"))
    d.save_to_disk(str(tmp_path / "valid"))
    state = tmp_path / "train" / "state.json"
    good = json.loads(state.read_text())
    for name in ("../../etc/passwd", "/etc/passwd"):
        state.write_text(json.dumps({**good, "_data_files": [{"filename": name}]}))
        with pytest.raises(ValueError, match="outside the folder; only files inside it are read"):
            PartitionedDataset.from_hf_dataset(str(tmp_path / "train"), str(tmp_path / "valid"))
    for text in ("{not json", json.dumps({"_data_files": [{"file": "x"}]}), json.dumps({"_data_files": [3]})):
        state.write_text(text)
        with pytest.raises(ValueError, match="state.json cannot be read as the one Dataset.save_to_disk writes"):
            PartitionedDataset.from_hf_dataset(str(tmp_path / "train"), str(tmp_path / "valid"))
