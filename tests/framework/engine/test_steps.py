"""The step-level contract on an in-process worker: the engine's loop around `step_fn` trains to the weights of the
equivalent hand-written `train_fn`, counts examples exactly, steps schedules per step, evaluates from the step, runs
a pack's members in turn as if alone, and turns every bad step function into one clear error for its config."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from framework.data import PartitionedDataset
from framework.engine.state import unpack_state
from framework.engine.steps import StepLoop, take
from framework.engine.worker import Worker
from framework.examples import classifier_eval_fn, classifier_step_fn, classifier_train_fn, mlp_model_fn
from framework.functions import UserFunctions
from framework.scheduling import EVAL, TRAIN, Unit, UnitTask
from framework.trainable import Trainable

CONFIG = {"in_features": 4, "hidden": 8, "classes": 2, "lr": 0.1, "batch_size": 8}


def _data(n: int = 90) -> PartitionedDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return PartitionedDataset.from_arrays(x, (x[:, 0] > 0).long(), num_partitions=2, valid_fraction=0.2, seed=0)


def _worker(**fns) -> Worker:
    ds = _data()
    w = Worker(0, UserFunctions(**{"model_fn": mlp_model_fn, **fns}))
    w.load({p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)})
    return w


def _train(w: Worker, units, config=CONFIG, seed: int = 3):
    """Train config 0 through `units` (epoch, partition) in order; the final state and the reports."""
    state, reports = None, []
    for epoch, part in units:
        state, report = w.run(UnitTask(Unit(0, epoch, part, TRAIN), config, seed=seed), state)
        assert report.error is None, report.error
        reports.append(report)
    return state, reports


UNITS = [(0, 0), (0, 1), (1, 1), (1, 0)]


def test_step_fn_trains_to_the_weights_of_the_equivalent_train_fn():
    by_step, step_reports = _train(_worker(step_fn=classifier_step_fn, eval_fn=classifier_eval_fn), UNITS)
    by_hand, hand_reports = _train(_worker(train_fn=classifier_train_fn, eval_fn=classifier_eval_fn), UNITS)
    a, b = unpack_state(by_step), unpack_state(by_hand)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k  # bit for bit: same batches, same order, same steps
    assert a["visited"] == b["visited"] == {0: [0, 1], 1: [1, 0]}
    for s, h in zip(step_reports, hand_reports, strict=True):
        assert s.num_examples == h.num_examples  # every row of the partition, counted by the engine
        assert s.metrics["loss"] == pytest.approx(h.metrics["loss"], rel=1e-5)
        assert s.metrics["accuracy"] == pytest.approx(h.metrics["accuracy"], rel=1e-6)


def test_evaluation_defaults_to_the_step_and_eval_step_replaces_it():
    state, _ = _train(_worker(step_fn=classifier_step_fn), UNITS[:2])
    w = _worker(step_fn=classifier_step_fn)
    _, by_step = w.run(UnitTask(Unit(0, 0, 1, EVAL), CONFIG, seed=3), state)
    _, by_hand = _worker(train_fn=classifier_train_fn, eval_fn=classifier_eval_fn).run(
        UnitTask(Unit(0, 0, 1, EVAL), CONFIG, seed=3), state)
    assert by_step.error is None and by_step.num_examples == by_hand.num_examples
    assert by_step.metrics["loss"] == pytest.approx(by_hand.metrics["loss"], rel=1e-5)
    assert by_step.metrics["accuracy"] == pytest.approx(by_hand.metrics["accuracy"])

    def eval_step(model, batch, config):
        return {"rows_seen": float(len(batch[0]))}  # a batch mean of its own: the batch's size

    _, custom = _worker(step_fn=classifier_step_fn, eval_step=eval_step).run(
        UnitTask(Unit(0, 0, 1, EVAL), {**CONFIG, "eval_batch_size": 4}, seed=3), state)
    n = custom.num_examples
    assert custom.error is None and set(custom.metrics) == {"rows_seen"}
    # example-weighted over batches of 4 and a last one of n % 4
    assert custom.metrics["rows_seen"] == pytest.approx((16 * (n // 4) + (n % 4) ** 2) / n)


def test_the_three_return_forms_train_alike():
    def as_dict(model, batch, config):
        loss, metrics = classifier_step_fn(model, batch, config)
        return {"loss": loss, **metrics}

    def bare(model, batch, config):
        return classifier_step_fn(model, batch, config)[0]

    states = [_train(_worker(step_fn=fn), UNITS[:2])[0] for fn in (classifier_step_fn, as_dict, bare)]
    for s in states[1:]:
        for k, v in unpack_state(s)["model"].items():
            assert torch.equal(v, unpack_state(states[0])["model"][k])


def _scheduled_model_fn(config):
    model, opt = mlp_model_fn(config)
    return Trainable(model, opt, lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
                     scheduler_interval="step")


def test_a_step_schedule_is_stepped_after_every_optimizer_step():
    def step_fn(model, batch, config, epoch):
        loss, metrics = classifier_step_fn(model, batch, config)
        return loss, {**metrics, "epoch": epoch}

    w = _worker(model_fn=_scheduled_model_fn, step_fn=step_fn, eval_fn=classifier_eval_fn)
    state, (report,) = _train(w, [(2, 0)])
    steps = math.ceil(report.num_examples / CONFIG["batch_size"])
    assert unpack_state(state)["lr_scheduler"]["last_epoch"] == steps
    assert report.metrics["epoch"] == 2  # `epoch` reaches a step that declares it


@pytest.mark.parametrize(("step_fn", "config", "error"), [
    (lambda m, b, c: "low", CONFIG, r"TypeError: step_fn must return a loss tensor, \(loss, metrics\) or a dict "
                                    r"holding 'loss', got str"),
    (lambda m, b, c: F.cross_entropy(m(b[0]), b[1], reduction="none"), CONFIG,
     r"whose loss is a one-element tensor \(the batch's mean\), got a tensor of shape \(8,\)"),
    (lambda m, b, c: F.cross_entropy(m(b[0]), b[1]).detach(), CONFIG, r"a loss that has no graph to train through"),
    (lambda m, b, c: F.cross_entropy(m(b[0]), b[1]) * float("nan"), CONFIG,
     r"FloatingPointError: step_fn returned a non-finite loss: loss = nan"),
    (lambda m, b, c: (F.cross_entropy(m(b[0]), b[1]), {"acc": "high"}), CONFIG,
     r"step_fn returned metric 'acc' = 'high', which is not a number"),
    (classifier_step_fn, {**CONFIG, "batch_size": 1000}, r"`config\['batch_size'\]` is 1000, but the partition this "
                                                         r"unit trains holds \d+ rows"),
    (classifier_step_fn, {k: v for k, v in CONFIG.items() if k != "batch_size"}, r"the config has no 'batch_size'"),
    (classifier_step_fn, {**CONFIG, "batch_size": 0.5}, r"`config\['batch_size'\]` is 0.5, but must be an int >= 1"),
])
def test_a_bad_step_function_is_one_clear_error_for_its_config(step_fn, config, error):
    w = _worker(step_fn=step_fn)
    state, report = w.run(UnitTask(Unit(0, 0, 0, TRAIN), config, seed=3), None)
    assert state is None and report.error is not None
    assert len([line for line in report.error.splitlines() if "Error:" in line]) == 1  # one error, not a cascade
    assert re.search(error, report.error), report.error


def test_a_pack_runs_its_members_in_turn_each_as_if_alone():
    w = _worker(step_fn=classifier_step_fn)
    configs = ({**CONFIG, "lr": 0.1}, {**CONFIG, "lr": 0.02, "batch_size": 16}, {**CONFIG, "batch_size": 10_000})
    task = UnitTask(Unit(4, 0, 1, TRAIN), configs[0], seed=3, members=(4, 7, 9), configs=configs)
    states, reports = w.run_members(task, (None, None, None))
    assert [r.unit for r in reports] == [Unit(c, 0, 1, TRAIN) for c in (4, 7, 9)]
    assert reports[2].error is not None and states[2] is None  # one member's error leaves the others alone
    for cid, config, state, report in zip((4, 7), configs, states, reports, strict=False):
        alone, alone_report = w.run(UnitTask(Unit(cid, 0, 1, TRAIN), config, seed=3), None)
        assert report.metrics == alone_report.metrics
        for k, v in unpack_state(alone)["model"].items():
            assert torch.equal(v, unpack_state(state)["model"][k])


def test_take_batches_every_partition_form():
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    idx = torch.tensor([4, 0])
    bx, by = take((x, y), idx)
    assert torch.equal(bx, x[[4, 0]]) and torch.equal(by, y[[4, 0]])
    feats = take(({"a": x, "b": np.arange(5)}, ["p", "q", "r", "s", "t"]), idx)
    assert torch.equal(feats[0]["b"], torch.tensor([4, 0])) and feats[1] == ["t", "p"]
    with pytest.raises(TypeError, match="cannot batch a partition of type set"):
        take({1, 2}, idx)


def test_step_loop_needs_an_optimizer():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(TypeError, match="model_fn returned no optimizer, but `step_fn` trains"):
        StepLoop(classifier_step_fn).train(model, None, (torch.randn(8, 4), torch.zeros(8, dtype=torch.long)),
                                           CONFIG)


def test_a_deterministic_run_trains_every_config_by_step_as_by_the_equivalent_train_fn():
    """Through the driver (`deterministic=True`, one seed, the in-process `LocalBackend`): each config's final state
    and metrics are the same whether it is trained by `classifier_step_fn` or by `classifier_train_fn`."""
    import automl
    from framework.driver import Driver, MemoryRunLog
    from framework.engine.local import LocalBackend
    from framework.options import RunOptions

    ds = _data(120)
    entries = {p: ([ds.train[p]], [ds.valid[p]]) for p in range(2)}
    space = {"in_features": [4], "hidden": [8], "classes": [2], "lr": [0.05, 0.2], "batch_size": [8, 16]}
    runs = []
    for functions in (UserFunctions(mlp_model_fn, step_fn=classifier_step_fn),
                      UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn)):
        log = MemoryRunLog()
        driver = Driver(LocalBackend(functions, entries, num_threads=1), automl.GridSearch(space, epochs=2), log,
                        {0: [0], 1: [1]}, [0, 1], RunOptions(seed=7, deterministic=True))
        driver.run()
        runs.append({c.id: (driver.run_state.backend.get(c.state), c.history) for c in driver.run_state.configs})
    (by_step, by_hand) = runs
    assert sorted(by_step) == sorted(by_hand) == [0, 1, 2, 3]
    for cid, (state, history) in by_step.items():
        hand_state, hand_history = by_hand[cid]
        for k, v in unpack_state(state)["model"].items():
            assert torch.equal(v, unpack_state(hand_state)["model"][k]), (cid, k)
        assert len(history) == len(hand_history) == 2
        for mine, theirs in zip(history, hand_history, strict=True):
            for key in ("train_loss", "train_accuracy", "valid_loss", "valid_accuracy"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (cid, key)
