from __future__ import annotations

import numpy as np
import pytest

from framework.planner import FeatureStore


def test_feature_store_appends_shards_and_reads_by_ids(tmp_path) -> None:
    store = FeatureStore(tmp_path)
    store.append("layer/a", [0, 1, 2], np.arange(6, dtype=np.float32).reshape(3, 2))
    store.append("layer/a", [7, 5], np.array([[10, 11], [12, 13]], dtype=np.float32))
    assert store.read("layer/a", [5, 0, 7]).tolist() == [[12, 13], [0, 1], [10, 11]]
    assert store.missing("layer/a", [0, 5, 9]).tolist() == [9]
    assert len(list((tmp_path / "layer_a").glob("shard_*.npy"))) == 2  # one file per append, not per record
    again = FeatureStore(tmp_path)  # index rebuilt from disk
    assert again.read("layer/a", [2]).tolist() == [[4, 5]] and sorted(again.ids("layer/a")) == [0, 1, 2, 5, 7]


def test_feature_store_rejects_duplicate_ids(tmp_path) -> None:
    store = FeatureStore(tmp_path)
    store.append("k", [0], np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="already stored"):
        store.append("k", [0], np.zeros((1, 2), np.float32))


def test_feature_store_rejects_shape_change(tmp_path) -> None:
    store = FeatureStore(tmp_path)
    store.append("k", [0], np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="`values`"):
        store.append("k", [1], np.zeros((1, 3), np.float32))


def test_feature_store_rejects_unknown_ids(tmp_path) -> None:
    store = FeatureStore(tmp_path)
    store.append("k", [0], np.zeros((1, 2), np.float32))
    with pytest.raises(KeyError, match="sample id 3"):
        store.read("k", [3])
