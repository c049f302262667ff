from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from framework.planner import (
    CostModel,
    build_multimodel,
    flops_optimal_speedup,
    optimize_materialization,
    profile_model,
)


def _chain(widths: list[int], n_frozen: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Linear(a, b, bias=False) for a, b in zip(widths, widths[1:], strict=False)]
    for layer in layers[:n_frozen]:
        layer.weight.requires_grad_(False)
    return nn.Sequential(*layers)


def _plan(model: nn.Module, width: int, cm: CostModel, records: int = 10, budget: float = math.inf):
    mm = build_multimodel([profile_model(model, torch.randn(1, width))])
    return mm, optimize_materialization(mm, cm, records=records, epochs=[3], disk_budget=budget)


def test_milp_recomputes_when_loading_is_dearer() -> None:
    # frozen 4 -> 64 expansion: loading 256 B costs 256e3 FLOPs, reading the 16 B input and computing costs 16e3+512
    mm, plan = _plan(_chain([4, 64, 2], 1), 4, CostModel(1e9, 1e6))
    assert plan.materialized == ()
    acts = {mm.layers[k].name: a for k, a in plan.reuse[0].actions.items()}
    assert acts == {"input_1": "load", "_0": "compute", "_1": "compute"}


def test_milp_loads_when_compute_is_dearer() -> None:
    # frozen 64 -> 4 compression: loading 16 B beats reading 256 B of input and 512 FLOPs
    mm, plan = _plan(_chain([64, 4, 2], 1), 64, CostModel(1e9, 1e6))
    assert [mm.layers[k].name for k in plan.materialized] == ["_0"]
    acts = {mm.layers[k].name: a for k, a in plan.reuse[0].actions.items()}
    assert acts == {"input_1": "prune", "_0": "load", "_1": "compute"}
    assert plan.objective == pytest.approx((16e3 + 3 * 2 * 4 * 2) * 10 * 3)


def test_milp_respects_tight_storage_budget() -> None:
    model = _chain([64, 64, 4, 2], 2)  # best: store layer "1" (16 B per record)
    mm, plan = _plan(model, 64, CostModel(1e9, 1e9), records=10, budget=16 * 10)
    assert [mm.layers[k].name for k in plan.materialized] == ["_1"] and plan.storage_bytes == 160
    mm, plan = _plan(model, 64, CostModel(1e9, 1e9), records=10, budget=16 * 10 - 1)
    assert plan.materialized == () and plan.storage_bytes <= 159


def test_milp_plan_says_it_is_proven_optimal_within_its_budget() -> None:
    _, plan = _plan(_chain([64, 64, 4, 2], 2), 64, CostModel(1e9, 1e9), records=10, budget=16 * 10)
    assert plan.status == "optimal"


def test_milp_flops_optimal_bound_matches_equation_11() -> None:
    mm = build_multimodel([profile_model(_chain([8, 8, 2], 1), torch.randn(1, 8))])
    frozen, trainable = 2 * 8 * 8, 3 * 2 * 8 * 2
    assert flops_optimal_speedup(mm, [2]) == pytest.approx((frozen + trainable) / trainable)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"records": 0}, "records"),
        ({"disk_budget": -1.0}, "disk_budget"),
        ({"epochs": [0]}, "epochs"),
        ({"time_limit_s": 0.0}, "time_limit_s"),
    ],
)
def test_milp_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    mm = build_multimodel([profile_model(_chain([4, 2], 0), torch.randn(1, 4))])
    args = {"records": 10, "epochs": [1], **kwargs}
    with pytest.raises(ValueError, match=f"`{name}`"):
        optimize_materialization(mm, CostModel(1e9, 1e9), **args)


@pytest.mark.parametrize(("flops", "disk"), [(0.0, 1.0), (1.0, -1.0)])
def test_cost_model_rejects_non_positive_throughput(flops: float, disk: float) -> None:
    with pytest.raises(ValueError, match="must be a positive"):
        CostModel(flops, disk)


@pytest.mark.parametrize(
    ("budget", "stored", "per_record"),
    [
        (math.inf, ["_1"], 64 + 192),  # load 64 B of "_1", train "_2" (3 x 64 FLOPs)
        (64 * 10, ["_1"], 64 + 192),
        (64 * 10 - 1, ["_0"], 16 + 128 + 192),  # "_1" no longer fits: load 16 B of "_0", recompute "_1" (128 FLOPs)
        (16 * 10, ["_0"], 16 + 128 + 192),
        (16 * 10 - 1, [], 256 + 512 + 128 + 192),  # nothing fits: read the 256 B input, recompute both frozen layers
    ],
)
def test_milp_tight_budget_trades_the_best_layer_for_one_that_fits(budget, stored, per_record) -> None:
    # frozen 64 -> 4 -> 16 then trainable 16 -> 2: storing the 16-wide "_1" saves most, the 4-wide "_0" takes less room
    mm, plan = _plan(_chain([64, 4, 16, 2], 2), 64, CostModel(1e9, 1e9), records=10, budget=budget)
    assert [mm.layers[k].name for k in plan.materialized] == stored
    assert plan.storage_bytes <= budget
    assert plan.storage_bytes == sum(mm.layers[k].out_bytes for k in plan.materialized) * 10
    assert plan.objective == pytest.approx(per_record * 10 * 3)
