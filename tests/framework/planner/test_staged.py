"""Vista's Staged extraction: the same features as Eager, with fewer bytes held at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from framework.planner import CostModel, FeatureStore, plan_transfer
from tests.framework.planner.conftest import Head, data, frozen_encoder


def _plan():
    enc = frozen_encoder()
    torch.manual_seed(0)
    models = [Head(enc, 8), Head(enc, 4)]
    x, _ = data(1, 0)
    return plan_transfer(models, x, method="mat_all", batch_sizes=[8, 8], epochs=[1, 1], records=100,
                         cost_model=CostModel(1e9, 1e9))


def test_staged_and_eager_store_identical_features_and_staged_holds_less(tmp_path) -> None:
    plan = _plan()
    assert len(plan.materialized) >= 3  # several stages
    x, _ = data(70, 1)
    ids = np.arange(100, 170)
    stats = {}
    for execution in ("eager", "staged"):
        store = FeatureStore(tmp_path / execution)
        assert plan.materialize(store, ids, x, batch_size=16, execution=execution) == 70
        stats[execution] = dict(plan.last_extraction)
    eager, staged = FeatureStore(tmp_path / "eager"), FeatureStore(tmp_path / "staged")
    for k in plan.materialized:
        np.testing.assert_array_equal(staged.read(k, ids), eager.read(k, ids))
    assert stats["staged"]["peak_bytes"] < stats["eager"]["peak_bytes"]
    assert stats["eager"]["read_bytes"] == 0 < stats["staged"]["read_bytes"]  # stages read earlier stages back


def test_staged_fills_only_missing_records(tmp_path) -> None:
    plan = _plan()
    x, _ = data(40, 2)
    ids = np.arange(40)
    store = FeatureStore(tmp_path / "s")
    assert plan.materialize(store, ids[:25], x[:25], execution="staged") == 25
    assert plan.materialize(store, ids, x, execution="staged") == 15
    ref = FeatureStore(tmp_path / "e")
    plan.materialize(ref, ids, x, execution="eager")
    for k in plan.materialized:
        np.testing.assert_array_equal(store.read(k, ids), ref.read(k, ids))


def test_materialize_rejects_an_unknown_execution(tmp_path) -> None:
    with pytest.raises(ValueError, match="`execution` is 'lazy', but must be one of"):
        _plan().materialize(FeatureStore(tmp_path), [0], data(1, 0)[0], execution="lazy")
