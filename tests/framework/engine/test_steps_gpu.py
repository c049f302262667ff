"""The step-level contract on a GPU (skipped without CUDA; `../shared/GPU.md` says how to run it on a GPU machine):
partitions placed on the device by the memory rule, batches moved per step when they are kept on the host, the
same weights as the hand loop either way, and float16 autocast with a GradScaler."""

from __future__ import annotations

import pytest
import torch

from framework.data import PartitionedDataset
from framework.engine.state import unpack_state
from framework.engine.worker import Worker
from framework.examples import (
    classifier_eval_fn,
    classifier_step_fn,
    classifier_train_fn,
    mlp_model_fn,
    scheduled_model_fn,
)
from framework.functions import UserFunctions
from framework.scheduling import EVAL, TRAIN, Unit, UnitTask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CONFIG = {"in_features": 16, "hidden": 64, "classes": 3, "lr": 0.05, "batch_size": 32}


def _entries():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 16, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), num_partitions=2, seed=0)
    return {p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)}


def _trained(w: Worker, config=CONFIG):
    state = None
    for epoch, part in [(0, 0), (0, 1), (1, 1)]:
        state, report = w.run(UnitTask(Unit(0, epoch, part, TRAIN), config, seed=1), state)
        assert report.error is None, report.error
    _, ev = w.run(UnitTask(Unit(0, 1, 0, EVAL), config, seed=1), state)
    assert ev.error is None, ev.error
    return unpack_state(state)["model"], ev.metrics


@pytest.mark.parametrize("placement", [None, True, False])
def test_the_step_loop_on_a_gpu_matches_the_hand_loop_wherever_the_data_lives(placement):
    step = Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn), device="cuda", data_on_device=placement)
    hand = Worker(1, UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn), device="cuda",
                  data_on_device=placement)
    for w in (step, hand):
        w.load(_entries())
    where = {"cuda:0"} if placement in (None, True) else {"cpu"}  # None: 600 rows fit in a quarter of any GPU
    assert set(step.data_placed.values()) == where and step.data_info()["data_device"] == where.pop()
    (a, ma), (b, mb) = _trained(step), _trained(hand)
    for k, v in a.items():
        assert torch.allclose(v, b[k], atol=1e-5), k
    assert ma["loss"] == pytest.approx(mb["loss"], rel=1e-4)


def test_float16_autocast_with_a_grad_scaler_trains_through_the_step():
    w = Worker(0, UserFunctions(scheduled_model_fn, step_fn=classifier_step_fn), device="cuda")
    w.load(_entries())
    config = {**CONFIG, "amp": True, "epochs": 2}
    weights, metrics = _trained(w, config)
    assert all(torch.isfinite(v).all() for v in weights.values()) and metrics["loss"] < 1.2
