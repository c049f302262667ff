from __future__ import annotations

import pytest
import torch

from framework.freezing import ActivationPrefetcher, MemmapActivationStore


def test_memmap_store_returns_exact_rows_and_uses_shards_not_files_per_sample(tmp_path):
    store = MemmapActivationStore(tmp_path / "c", shard_rows=4)
    rows = torch.randn(10, 2, 3)
    store.put(torch.arange(100, 110), rows)
    assert torch.equal(store.get([107, 100, 103]), rows[[7, 0, 3]])
    assert sorted(p.name for p in (tmp_path / "c").glob("shard_*.npy")) == [
        "shard_00000.npy",
        "shard_00001.npy",
        "shard_00002.npy",
    ]
    assert len(store) == 10 and store.contains([100, 109]) and not store.contains([100, 5])


def test_memmap_store_overwrites_existing_ids(tmp_path):
    store = MemmapActivationStore(tmp_path)
    store.put([1, 2], torch.zeros(2, 3))
    store.put([2], torch.ones(1, 3))
    assert len(store) == 2 and torch.equal(store.get([2]), torch.ones(1, 3))


def test_memmap_store_reopens_flushed_rows(tmp_path):
    store = MemmapActivationStore(tmp_path, shard_rows=3)
    rows = torch.randn(5, 4)
    store.put([9, 8, 7, 6, 5], rows)
    store.flush()
    reopened = MemmapActivationStore(tmp_path, shard_rows=3)
    assert torch.equal(reopened.get([5, 9]), rows[[4, 0]])


def test_memmap_store_missing_id_raises_key_error(tmp_path):
    store = MemmapActivationStore(tmp_path)
    store.put([1], torch.zeros(1, 2))
    with pytest.raises(KeyError, match="sample id 3 is not cached"):
        store.get([1, 3])


def test_memmap_store_rejects_a_different_row_shape(tmp_path):
    store = MemmapActivationStore(tmp_path)
    store.put([1], torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"`rows` has row shape \(3,\) and dtype float32, but must match"):
        store.put([2], torch.zeros(1, 3))


def test_memmap_store_clear_removes_files(tmp_path):
    store = MemmapActivationStore(tmp_path / "c")
    store.put([1], torch.zeros(1, 2))
    store.clear()
    assert len(store) == 0 and not (tmp_path / "c").exists()


def test_prefetcher_serves_the_scheduled_order_from_read_ahead(tmp_path):
    store = MemmapActivationStore(tmp_path)
    rows = torch.randn(12, 5)
    store.put(torch.arange(12), rows)
    order = [torch.tensor([3, 1, 2]), torch.tensor([0, 11, 4]), torch.tensor([7, 6, 5])]
    prefetcher = ActivationPrefetcher(store, depth=2)
    prefetcher.schedule(order)
    for ids in order:
        assert torch.equal(prefetcher.take(ids), rows[ids])
    prefetcher.stop()
    assert (prefetcher.hits, prefetcher.misses) == (3, 0)


def test_prefetcher_falls_back_to_synchronous_reads_off_plan(tmp_path):
    store = MemmapActivationStore(tmp_path)
    store.put([0, 1, 2], torch.randn(3, 2))
    prefetcher = ActivationPrefetcher(store)
    prefetcher.schedule([[0, 1]])
    assert torch.equal(prefetcher.take([2]), store.get([2]))  # not the planned batch: a miss, read synchronously
    assert prefetcher.take([5]) is None  # not cached at all
    prefetcher.stop()
    assert prefetcher.hits == 0 and prefetcher.misses == 2


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda p: MemmapActivationStore(p, shard_rows=0), "`shard_rows` is 0, but must be an int >= 1"),
        (lambda p: ActivationPrefetcher(MemmapActivationStore(p), depth=0), "`depth` is 0, but must be an int >= 1"),
    ],
)
def test_cache_validation_names_parameter_value_and_rule(tmp_path, factory, message):
    with pytest.raises(ValueError, match=message):
        factory(tmp_path)
