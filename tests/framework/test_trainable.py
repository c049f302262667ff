"""`Trainable`: an LR scheduler and a GradScaler hop with the config; train_fn and eval_fn are told the epoch."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from framework import Trainable
from framework.data import PartitionedDataset
from framework.engine.state import unpack_state
from framework.engine.worker import Worker
from framework.examples import classifier_eval_fn, mlp_model_fn, scheduled_model_fn, scheduled_train_fn
from framework.functions import UserFunctions
from framework.scheduling import EVAL, TRAIN, Unit
from framework.scheduling.units import UnitTask
from framework.trainable import accepted_kwargs

CONFIG = {"in_features": 4, "hidden": 8, "classes": 2, "lr": 0.1, "epochs": 4, "amp": True, "batch_size": 8}


def _workers(train_fn=scheduled_train_fn, eval_fn=classifier_eval_fn, n=2):
    """`n` in-process workers, worker w holding partition w (a config hops between them)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 4, generator=g)
    ds = PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=n)
    workers = []
    for p in range(n):
        w = Worker(p, UserFunctions(scheduled_model_fn, train_fn, eval_fn))
        w.load({p: ([ds.train[p]], [ds.valid[p]])})
        workers.append(w)
    return workers


def _hop(workers, epochs, config=CONFIG, seed=0):
    """Train one config for `epochs` epochs, hopping over the workers; returns the final state and the reports."""
    state, reports = None, []
    for e in range(epochs):
        for p, w in enumerate(workers):
            state, r = w.run(UnitTask(Unit(0, e, p, TRAIN), config, seed=seed), state)
            assert r.error is None, r.error
            reports.append(r)
    return unpack_state(state), reports


def test_trainable_epoch_schedule_steps_once_per_epoch_across_hops():
    state, reports = _hop(_workers(), epochs=4)
    cosine = [0.1 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)]  # CosineAnnealingLR, T_max=4
    lrs = [r.metrics["lr"] for r in reports]  # two units (one per partition) per epoch share the epoch's lr
    assert lrs == pytest.approx([lr for lr in cosine for _ in range(2)], rel=1e-6)
    assert state["lr_scheduler"]["last_epoch"] == 3


def test_trainable_grad_scaler_state_travels_with_the_config():
    state, reports = _hop(_workers(), epochs=3)
    steps = sum(math.ceil(r.num_examples / CONFIG["batch_size"]) for r in reports)
    assert steps >= 20  # the scale doubles every 20 steps without overflow, counted across hops
    assert state["grad_scaler"]["scale"] == 2.0 ** (16 + steps // 20)
    assert state["grad_scaler"]["_growth_tracker"] == steps % 20
    assert reports[-1].metrics["loss_scale"] == state["grad_scaler"]["scale"]


def test_trainable_hopping_equals_one_process_with_the_same_order():
    hopped, _ = _hop(_workers(), epochs=3)
    one = _workers(n=2)
    for w in one[1:]:
        one[0].data.update(w.data)  # one worker holding both partitions: no hop at all
    alone, _ = _hop([one[0], one[0]], epochs=3)
    for k in hopped["model"]:
        assert torch.equal(hopped["model"][k], alone["model"][k])
    assert hopped["lr_scheduler"] == alone["lr_scheduler"] and hopped["grad_scaler"] == alone["grad_scaler"]


def test_train_and_eval_fn_are_told_the_epoch():
    def train_fn(model, optimizer, data, config, epoch):
        return {"seen_epoch": epoch}

    def eval_fn(model, data, config, **extras):
        return {"seen_epoch": extras["epoch"], "has_scaler": "grad_scaler" in extras}

    w = _workers(train_fn=train_fn, eval_fn=eval_fn, n=1)[0]
    state, r = w.run(UnitTask(Unit(0, 2, 0, TRAIN), CONFIG, seed=0), None)
    assert r.metrics == {"seen_epoch": 2.0}
    _, r = w.run(UnitTask(Unit(0, 2, 0, EVAL), CONFIG, seed=0), state)
    assert r.metrics == {"seen_epoch": 2.0, "has_scaler": 0.0}  # eval_fn is offered the epoch only


def test_trainable_of_accepts_a_tuple_and_rejects_anything_else():
    model, opt = mlp_model_fn(CONFIG)
    assert Trainable.of((model, opt)).optimizer is opt
    t = Trainable(model, opt)
    assert Trainable.of(t) is t
    with pytest.raises(TypeError, match="model_fn must return .* or a framework.Trainable, got list"):
        Trainable.of([model, opt])


def test_trainable_rejects_a_model_that_is_not_a_module():
    with pytest.raises(TypeError, match="`model` is a str, but must be a torch.nn.Module"):
        Trainable("model")


def test_trainable_rejects_an_optimizer_that_is_not_one():
    with pytest.raises(TypeError, match="`optimizer` is a int, but must be a torch.optim.Optimizer"):
        Trainable(torch.nn.Linear(2, 2), 3)


def test_trainable_rejects_a_scheduler_without_an_optimizer():
    model, opt = mlp_model_fn(CONFIG)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(ValueError, match="`lr_scheduler` is set, but `optimizer` is None"):
        Trainable(model, None, lr_scheduler=sched)


def test_trainable_rejects_parts_without_state():
    model, opt = mlp_model_fn(CONFIG)
    with pytest.raises(TypeError, match="`grad_scaler` is a float, which has no state_dict/load_state_dict"):
        Trainable(model, opt, grad_scaler=1.0)


def test_trainable_rejects_an_unknown_interval():
    model, opt = mlp_model_fn(CONFIG)
    with pytest.raises(ValueError, match="`scheduler_interval` is 'batch', but must be one of"):
        Trainable(model, opt, scheduler_interval="batch")


def test_accepted_kwargs_offers_what_a_function_declares():
    offered = {"epoch": 1, "grad_scaler": None}
    assert accepted_kwargs(lambda m, o, d, c: None, offered) == {}
    assert accepted_kwargs(lambda m, o, d, c, epoch: None, offered) == {"epoch": 1}
    assert accepted_kwargs(lambda m, o, d, c, **kw: None, offered) == offered


def test_the_public_api_names_what_it_says_after_the_engine_is_imported():
    """`framework.replay` is the function even once the engine's modules are loaded (a module that imported
    `framework.replay` itself would shadow it with the submodule)."""
    code = ("import framework.selection, framework.result, framework.__main__, framework;"
            "assert callable(framework.replay) and callable(framework.ModelSelection), framework.replay")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
