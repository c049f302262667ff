"""PartitionedDataset: shuffling, splitting, placement with replicas, persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from framework.data import PartitionedDataset, concat_data


def test_from_arrays_splits_everything_once():
    x = np.arange(100, dtype=np.float64).reshape(50, 2)
    ds = PartitionedDataset.from_arrays(x, np.arange(50), num_partitions=3, valid_fraction=0.2, seed=1)
    rows = torch.cat([p[0] for p in ds.train + ds.valid])[:, 0]
    assert sorted(rows.tolist()) == list(range(0, 100, 2))
    assert sum(len(p[0]) for p in ds.valid) == 10 and ds.train[0][0].dtype == torch.float32
    assert ds.train[0][1].dtype == torch.int64


def test_placement_with_replicas_and_explicit_map():
    ds = PartitionedDataset.from_files(["a", "b", "c", "d"], ["va", "vb", "vc", "vd"], replicas=2)
    assert ds.placement(4) == {0: [0, 1], 1: [1, 2], 2: [2, 3], 3: [0, 3]}
    ds.availability = {0: [0], 1: [0, 1], 2: [1], 3: [1]}
    assert ds.placement(2)[1] == [0, 1]
    with pytest.raises(ValueError, match="names workers"):
        ds.placement(1)


def test_replicas_must_not_exceed_workers():
    ds = PartitionedDataset.from_files(["a", "b"], ["c", "d"], replicas=3)
    with pytest.raises(ValueError, match="`replicas` is 3"):
        ds.placement(2)


def test_save_and_load_round_trip(tmp_path):
    ds = PartitionedDataset.from_arrays(np.random.rand(40, 3), np.arange(40) % 2, num_partitions=2)
    back = PartitionedDataset.load(str(tmp_path), ds.save(str(tmp_path)))
    assert all(torch.equal(a, b) for pa, pb in zip(ds.train, back.train) for a, b in zip(pa, pb))


def test_concat_data_rejects_unknown_types():
    assert concat_data([[1], [2, 3]]) == [1, 2, 3]
    with pytest.raises(TypeError, match="cannot concatenate"):
        concat_data([{"a": 1}, {"a": 2}])


def test_file_entries_round_trip_with_their_types(tmp_path):
    from pathlib import Path

    train = [Path("/data/a.npz"), {"uri": "s3://b/1", "rows": (0, 100)}, ("shard", 3), "plain.csv"]
    ds = PartitionedDataset.from_files(train, [Path("/data/v.npz")] * 4)
    desc = json.loads(json.dumps(ds.save(str(tmp_path))))  # what run.db stores
    again = PartitionedDataset.load(str(tmp_path), desc)
    assert again.train == train and again.valid == ds.valid
    assert isinstance(again.train[0], Path) and isinstance(again.train[1]["rows"], tuple)
    with pytest.raises(TypeError, match="entries must be paths, strings, numbers"):
        PartitionedDataset.from_files([object()], [object()]).save(str(tmp_path))


def test_data_len_counts_rows_of_tuples_and_feature_dicts():
    from framework.data import data_len

    x = torch.zeros(7, 3)
    assert data_len((x, x[:, 0])) == data_len(x) == 7
    assert data_len(({"a": x, "b": x}, x[:, 0])) == 7  # the features `extract` makes: rows, not keys
    assert data_len([1, 2, 3]) == 3
