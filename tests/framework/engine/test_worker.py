"""The worker in-process (no Ray): units, seeding, the visit record, errors in user code."""

from __future__ import annotations

import math

import torch

from framework.data import PartitionedDataset
from framework.engine.worker import UnitTask, Worker, epoch_metrics
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.scheduling import EVAL, TRAIN, Unit

CONFIG = {"in_features": 4, "hidden": 8, "classes": 2, "lr": 0.1}


def _worker(train_fn=classifier_train_fn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=2)
    w = Worker(0, mlp_model_fn, train_fn, classifier_eval_fn)
    w.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)})
    return w


def test_worker_unit_is_deterministic_and_records_visits():
    w = _worker()
    s1, r1 = w.run(UnitTask(Unit(0, 0, 1, TRAIN), CONFIG, seed=5), None)
    s2, _ = w.run(UnitTask(Unit(0, 0, 1, TRAIN), CONFIG, seed=5), None)
    assert r1.error is None and s1["visited"] == {0: [1]}
    assert all(torch.equal(s1["model"][k], s2["model"][k]) for k in s1["model"])
    s3, _ = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=5), s1)
    assert s3["visited"] == {0: [1, 0]}
    _, ev = w.run(UnitTask(Unit(0, 0, 0, EVAL), CONFIG, seed=5), s3)
    assert ev.error is None and 0 <= ev.metrics["accuracy"] <= 1 and ev.num_examples == 6


def test_worker_reports_user_errors_and_nan_losses_without_dying():
    def bad(model, optimizer, data, config):
        return {"loss": math.nan}

    w = _worker(bad)
    state, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0), None)
    assert state is None and "non-finite loss" in report.error
    _, report = w.run(UnitTask(Unit(1, 0, 0, EVAL), CONFIG, seed=0), None)
    assert report.error is None  # the worker is still usable


def test_epoch_metrics_are_example_weighted():
    w = _worker()
    _, a = w.run(UnitTask(Unit(0, 0, 0, EVAL), CONFIG, seed=0), None)
    _, b = w.run(UnitTask(Unit(0, 0, 1, EVAL), CONFIG, seed=0), None)
    a.num_examples, b.num_examples = 1, 3
    a.metrics, b.metrics = {"loss": 1.0}, {"loss": 3.0}
    assert epoch_metrics([a, b]) == {"valid_loss": 2.5}
