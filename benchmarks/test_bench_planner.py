"""Planner benchmarks (pytest-benchmark): MILP solve and fusion on a 24-model multi-model graph, extraction pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.planner import CostModel, build_multimodel, fuse_models, optimize_materialization, profile_model

pytest.importorskip("pytest_benchmark")

CM = CostModel(5e10, 2e9)


def _workload(n: int = 24) -> tuple:
    torch.manual_seed(0)
    enc = nn.Sequential(
        nn.Embedding(64, 32), *[nn.TransformerEncoderLayer(32, 2, 64, batch_first=True) for _ in range(3)]
    ).eval()
    for p in enc.parameters():
        p.requires_grad_(False)
    models = [nn.Sequential(enc, nn.Linear(32, 16 + (i % 4)), nn.ReLU(), nn.Linear(16 + (i % 4), 2)) for i in range(n)]
    mm = build_multimodel([profile_model(m, torch.randint(0, 64, (1, 16))) for m in models])
    return mm, [16 if i % 2 else 32 for i in range(n)]


@pytest.fixture(scope="module")
def workload() -> tuple:
    return _workload()


def test_bench_materialization_milp(benchmark, workload) -> None:
    mm, _ = workload
    plan = benchmark(lambda: optimize_materialization(mm, CM, records=1000, epochs=[5] * len(mm.models)))
    assert plan.materialized


def test_bench_fusion(benchmark, workload) -> None:
    mm, batch_sizes = workload
    v = optimize_materialization(mm, CM, records=1000, epochs=[5] * len(mm.models)).materialized
    groups = benchmark(
        lambda: fuse_models(mm, v, CM, batch_sizes=batch_sizes, epochs=[5] * len(mm.models), memory_budget=2**32)
    )
    assert sum(len(g.members) for g in groups) == len(mm.models)
