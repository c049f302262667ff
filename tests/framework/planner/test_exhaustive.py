"""The materialization MILP against exhaustive enumeration on small random multi-model graphs."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from framework.planner import CostModel, build_multimodel, optimize_materialization, profile_model
from framework.planner.milp import exhaustive_materialization


def _frozen(layer: nn.Linear) -> nn.Linear:
    layer.weight.requires_grad_(False)
    layer.bias.requires_grad_(False)
    return layer


def _instance(seed: int):
    """2-3 models over one shared frozen trunk (cut at different depths), each with its own frozen, trainable tail."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    widths = [rng.choice([4, 8, 16, 32, 64]) for _ in range(4)]
    trunk = [_frozen(nn.Linear(a, b)) for a, b in zip(widths, widths[1:], strict=False)]
    models = []
    for _ in range(rng.randint(2, 3)):
        depth = rng.randint(1, len(trunk))
        w = widths[depth]
        tail = [_frozen(nn.Linear(w, v := rng.choice([4, 16, 48])))] if rng.random() < 0.6 else []
        w = v if tail else w
        models.append(nn.Sequential(*trunk[:depth], *tail, nn.Linear(w, 3)))
    mm = build_multimodel([profile_model(m, torch.randn(1, widths[0])) for m in models])
    epochs = [rng.randint(1, 4) for _ in models]
    return mm, epochs, rng


@pytest.mark.parametrize("seed", range(8))
def test_exhaustive_equals_milp_objective_on_random_instances(seed: int) -> None:
    mm, epochs, rng = _instance(seed)
    records = rng.choice([10, 100])
    for disk in (1e6, 1e8, 1e10):
        cm = CostModel(1e9, disk)
        free = optimize_materialization(mm, cm, records=records, epochs=epochs)
        budgets = [math.inf, free.storage_bytes, free.storage_bytes / 2, free.storage_bytes / 4, 0.0]
        for budget in budgets:
            milp = optimize_materialization(mm, cm, records=records, epochs=epochs, disk_budget=budget)
            best = exhaustive_materialization(mm, cm, records=records, epochs=epochs, disk_budget=budget)
            assert milp.objective == pytest.approx(best.objective, rel=1e-6), (disk, budget)
            assert milp.storage_bytes <= budget and best.storage_bytes <= budget


def test_exhaustive_picks_the_layer_that_fits_a_tight_budget() -> None:
    # frozen 64 -> 4 -> 16, trainable 16 -> 2 (as in test_milp): "_1" saves most, "_0" takes less room
    torch.manual_seed(0)
    layers = [nn.Linear(a, b, bias=False) for a, b in ((64, 4), (4, 16), (16, 2))]
    for layer in layers[:2]:
        layer.weight.requires_grad_(False)
    mm = build_multimodel([profile_model(nn.Sequential(*layers), torch.randn(1, 64))])
    cm = CostModel(1e9, 1e9)
    for budget, stored, per_record in ((math.inf, ["_1"], 64 + 192), (639, ["_0"], 16 + 128 + 192), (159, [], 1088)):
        plan = exhaustive_materialization(mm, cm, records=10, epochs=[3], disk_budget=budget)
        assert [mm.layers[k].name for k in plan.materialized] == stored
        assert plan.objective == pytest.approx(per_record * 10 * 3)


def test_exhaustive_refuses_large_graphs() -> None:
    layers = [nn.Linear(4, 4) for _ in range(5)]
    for layer in layers:
        _frozen(layer)
    mm = build_multimodel([profile_model(nn.Sequential(*layers, nn.Linear(4, 2)), torch.randn(1, 4))])
    with pytest.raises(ValueError, match="`max_storable` is 3"):
        exhaustive_materialization(mm, CostModel(1e9, 1e9), records=1, epochs=[1], max_storable=3)
