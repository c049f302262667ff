"""Egeria layer freezing on the MOP engine: the controller's state travels with the config, frozen layers stay put,
and hops stop carrying the frozen weights."""

from __future__ import annotations

import json

import pytest
import torch

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from simulators import validate_schedule

pytestmark = pytest.mark.ray


def _freeze_early_train_fn(model, optimizer, data, config, freezing=None):
    """Freeze the first layer module once the config has trained 2 units (forced, to make the test exact)."""
    if freezing is not None and freezing.step >= 2 * 8 and freezing.frozen == 0:
        freezing.freeze(1)
    return classifier_train_fn(model, optimizer, data, config, freezing=freezing)


def test_freezing_state_travels_and_hops_shrink(ray_cluster, digits, tmp_path, assert_complete):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:1000], y[:1000], num_partitions=2, seed=0)
    space = {"hidden": [256], "layers": [2], "lr": [0.05], "batch_size": [50]}  # 8 steps per unit
    result = framework.ModelSelection(
        mlp_model_fn, _freeze_early_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=3),
        storage_path=str(tmp_path / "freeze"), progress=False, seed=0,
        freezing={"modules": "children", "eval_interval": 4, "cache": True},
    ).run()
    assert validate_schedule(result.schedule, partitions=[0, 1]).ok
    state = result.load_state(0)
    fstate = state["freezing"]
    assert fstate["policy"]["frozen"] == 1 and fstate["step"] == 6 * 8  # the controller kept counting across hops
    assert json.loads(json.dumps(fstate)) == fstate
    assert "frozen" not in state and "0.weight" in state["model"]  # checkpoints hold the full weights
    train = result.schedule[result.schedule.kind == "train"].sort_values("start")
    full, after = train.state_bytes.iloc[0], train.state_bytes.iloc[-1]
    frozen_bytes = sum(v.numel() * v.element_size() for k, v in state["model"].items() if k.startswith("0."))
    assert after == full - frozen_bytes  # the hop payload left the frozen layer behind
    model = result.load_model(0)
    assert isinstance(model, torch.nn.Module)
    assert_complete(result)  # frozen layers and their cache change what a unit computes, not which units run


class _Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))  # a residual block: not an nn.Sequential chain


class _ResidualMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = torch.nn.Linear(64, 64), _Block(64), torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.relu(self.stem(x))))


def _residual_model_fn(config):
    model = _ResidualMLP()
    return model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)


def _freeze_two_train_fn(model, optimizer, data, config, freezing=None):
    if freezing is not None and freezing.step >= 2 * 8 and freezing.frozen == 0:
        freezing.freeze(2)  # stem and block: the head trains on their cached output
    return classifier_train_fn(model, optimizer, data, config, freezing=freezing)


def test_freezing_caches_a_model_that_is_not_sequential(ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:1000], y[:1000], num_partitions=2, seed=0)
    space = {"lr": [0.05], "batch_size": [50]}  # 8 steps per unit
    result = framework.ModelSelection(
        _residual_model_fn, _freeze_two_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=3),
        storage_path=str(tmp_path / "freeze"), progress=False, seed=0,
        freezing={"modules": "children", "eval_interval": 4, "cache": True},
    ).run()
    assert validate_schedule(result.schedule, partitions=[0, 1]).ok
    fstate = result.load_state(0)["freezing"]
    assert fstate["policy"]["frozen"] == 2 and fstate["module_names"] == ["stem", "block", "head"]
    metrics = result.metrics.sort_values("epoch")
    assert metrics.valid_accuracy.iloc[-1] > 0.5  # the head kept learning on the cached activations
