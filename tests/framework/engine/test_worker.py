"""The worker in-process (no Ray): units, seeding, the visit record, errors in user code."""

from __future__ import annotations

import gc
import math
import os
import tempfile

import numpy as np
import pytest
import torch

from framework.data import PartitionedDataset
from framework.engine.state import PackedState, pack_state, unpack_state
from framework.engine.worker import CACHE_PREFIX, Worker
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.scheduling import EVAL, TRAIN, Unit, UnitTask, epoch_metrics

CONFIG = {"in_features": 4, "hidden": 8, "classes": 2, "lr": 0.1}


def _worker(train_fn=classifier_train_fn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=2)
    w = Worker(0, UserFunctions(mlp_model_fn, train_fn, classifier_eval_fn))
    w.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)})
    return w


def test_worker_unit_is_deterministic_and_records_visits():
    w = _worker()
    p1, r1 = w.run(UnitTask(Unit(0, 0, 1, TRAIN), CONFIG, seed=5), None)
    p2, _ = w.run(UnitTask(Unit(0, 0, 1, TRAIN), CONFIG, seed=5), None)
    assert isinstance(p1, PackedState) and r1.state_bytes == p1.nbytes > 0  # a hop moves one buffer
    s1, s2 = unpack_state(p1), unpack_state(p2)
    assert r1.error is None and s1["visited"] == {0: [1]}
    assert all(torch.equal(s1["model"][k], s2["model"][k]) for k in s1["model"])
    s3, _ = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=5), p1)
    s3 = unpack_state(s3)
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


def test_packed_state_round_trips_every_tensor_and_the_rest():
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "visited": {0: [2, 1]},
             "extra": [torch.arange(3, dtype=torch.int64), (torch.ones(2, 2, dtype=torch.bool), "tag")],
             "empty": torch.zeros(0, 4), "scalar": torch.tensor(7.5, dtype=torch.float64)}
    packed = pack_state(state)
    assert packed.buffer.dtype.name == "uint8" and packed.buffer.nbytes >= sum(
        t.numel() * t.element_size() for t in model.state_dict().values())
    garbage = np.full(1 << 20, 0xAB, dtype=np.uint8)  # freed memory that the next buffer may reuse
    del garbage
    assert pack_state(state).buffer.tobytes() == packed.buffer.tobytes()  # equal states pack to equal bytes
    packed.buffer.setflags(write=False)  # as Ray's object store hands it back
    back = unpack_state(packed)
    assert back["visited"] == {0: [2, 1]} and back["extra"][1][1] == "tag"
    for k, v in model.state_dict().items():
        assert back["model"][k].dtype == v.dtype and torch.equal(back["model"][k], v)
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert back["scalar"].shape == () and back["scalar"].item() == 7.5 and back["empty"].shape == (0, 4)
    assert back["extra"][0].tolist() == [0, 1, 2] and back["extra"][1][0].dtype == torch.bool
    back["model"]["0.weight"].add_(1.0)  # writable, and a copy: the packed buffer is untouched
    assert torch.equal(unpack_state(packed)["model"]["0.weight"], model.state_dict()["0.weight"])
    opt2 = torch.optim.Adam(model.parameters())
    opt2.load_state_dict(back["optimizer"])
    opt2.step()  # the optimizer's moments are writable views
    assert unpack_state(None) is None and unpack_state({"a": 1}) == {"a": 1}


def test_data_on_device_moves_every_partition_tensor_once_at_load():
    # the "meta" device stands in for a GPU on a CPU-only machine: the move is real, the data has no storage
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=2)
    entries = {p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)}
    functions = UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn)
    moved = Worker(0, functions, device="meta", data_on_device=True)
    kept = Worker(1, functions, device="meta", data_on_device=False)
    auto = Worker(2, functions, device="meta")  # the rule is a GPU's
    assert moved.load(entries) == kept.load(entries) == auto.load(entries)
    assert len(moved.data) == 4
    for key, data in moved.data.items():
        assert all(t.device.type == "meta" for t in data), key
        assert all(t.device.type == "cpu" for t in kept.data[key]), key
        assert all(t.device.type == "cpu" for t in auto.data[key]), key
    # a worker that joins says where its data lives
    assert moved.data_info() == {"data_bytes": kept.data_nbytes(), "data_device": "meta"}
    assert kept.data_info()["data_device"] == auto.data_info()["data_device"] == "cpu"


@pytest.mark.parametrize("kind, value", [(EVAL, math.nan), (EVAL, math.inf), (TRAIN, -math.inf)])
def test_worker_fails_a_unit_whose_metric_is_not_finite(kind, value):
    def train_fn(model, optimizer, data, config):
        return {"loss": 0.5, "accuracy": value}

    def eval_fn(model, data, config):
        return {"loss": 0.5, "accuracy": value}

    w = Worker(0, UserFunctions(mlp_model_fn, train_fn, eval_fn))
    w.data = _worker().data
    state, report = w.run(UnitTask(Unit(0, 0, 0, kind), CONFIG, seed=0), None)
    fn_name = "train_fn" if kind == TRAIN else "eval_fn"
    assert state is None and f"{fn_name} returned a non-finite metric: accuracy = {value}" in report.error


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, math.nan, "7", 10**30])
def test_worker_fails_a_unit_whose_num_examples_is_not_a_positive_int(bad):
    def train_fn(model, optimizer, data, config):
        return {"loss": 0.5, "num_examples": bad}

    w = _worker(train_fn)
    state, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0), None)
    assert state is None
    assert f"train_fn returned `num_examples` = {bad!r}, but it must be a positive int" in report.error


@pytest.mark.parametrize("count", [7, 7.0, torch.tensor(7), np.int64(7)])
def test_worker_takes_num_examples_as_an_int(count):
    w = _worker(lambda model, optimizer, data, config: {"loss": 0.5, "num_examples": count})
    _, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0), None)
    assert report.error is None and report.num_examples == 7 and type(report.num_examples) is int
    assert report.metrics == {"loss": 0.5}


def _cached_worker(tmp_path):
    x = torch.randn(60, 4, generator=torch.Generator().manual_seed(0))
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=2)
    w = Worker(0, UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn), freezing={"cache": True},
               cache_dir=str(tmp_path / "run-caches"))
    w.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)})
    _, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0), None)
    assert report.error is None
    return w


def test_worker_close_removes_its_activation_cache_and_the_empty_run_folder(tmp_path):
    w = _cached_worker(tmp_path)
    [folder] = os.listdir(tmp_path / "run-caches")
    assert folder.startswith(f"{CACHE_PREFIX}0-")
    w.close()
    assert not (tmp_path / "run-caches").exists()
    w.close()  # again: nothing left to do


def test_worker_activation_cache_goes_with_the_worker(tmp_path):
    w = _cached_worker(tmp_path)
    [folder] = os.listdir(tmp_path / "run-caches")
    del w
    gc.collect()
    assert not (tmp_path / "run-caches" / folder).exists()


def test_worker_without_an_activation_cache_makes_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    w = Worker(0, UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn), freezing={"eval_interval": 4})
    w.data = _worker().data
    _, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0), None)
    assert report.error is None and os.listdir(tmp_path) == []


def test_worker_acts_out_a_slow_fault_by_sleeping_then_running_the_unit():
    from framework.engine.faults import Fault

    w = _worker()
    state, slow = w.run(UnitTask(Unit(0, 0, 0, TRAIN), CONFIG, seed=0, fault=Fault("slow", seconds=0.3)), None)
    assert slow.error is None and unpack_state(state)["visited"] == {0: [0]}  # it ran, to its end
    assert slow.end - slow.start >= 0.3
