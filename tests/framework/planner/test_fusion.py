from __future__ import annotations

import copy

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import MemoryProfileTimeline

from framework.planner import (
    CostModel,
    build_multimodel,
    estimate_peak_memory,
    fuse_models,
    plan_transfer,
    profile_model,
)
from tests.framework.planner.conftest import Head, data, frozen_encoder

CM = CostModel(1e9, 1e9)


def _heads(n: int) -> list[Head]:
    enc = frozen_encoder()
    out = []
    for i in range(n):
        torch.manual_seed(100 + i)
        out.append(Head(enc))
    return out


def _train(models: list[Head], groups_fused: bool, steps: int = 4) -> list[dict[str, torch.Tensor]]:
    x, y = data(32, seed=3)
    plan = plan_transfer(
        models, x[:1], batch_sizes=[8] * len(models), epochs=[1] * len(models), records=32, cost_model=CM
    )
    if not groups_fused:  # one group per model: the models trained alone
        plan = plan_transfer(
            models,
            x[:1],
            method="current_practice",
            batch_sizes=[8] * len(models),
            epochs=[1] * len(models),
            records=32,
            cost_model=CM,
        )
    import tempfile

    from framework.planner import FeatureStore

    store = FeatureStore(tempfile.mkdtemp())
    ids = list(range(32))
    plan.materialize(store, ids, x)
    for g in range(len(plan.groups)):
        members = plan.groups[g].members
        tr = plan.trainer(
            g, lambda ps, i: torch.optim.Adam(ps, lr=1e-2), nn.functional.cross_entropy, [7 + i for i in members]
        )
        for s in range(steps):
            b = ids[s * 8 : (s + 1) * 8]
            tr.step(plan.load(store, g, b, x[b]), y[b])
    return [{k: v.clone() for k, v in m.state_dict().items()} for m in models]


def test_fusion_groups_models_sharing_a_frozen_prefix() -> None:
    models = _heads(3)
    x, _ = data(2, seed=0)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    enc_out = next(k for k in mm.shared if mm.layers[k].name == "enc_l2")
    groups = fuse_models(mm, [enc_out], CM, batch_sizes=[8, 8, 16], epochs=[1, 1, 1], memory_budget=1e9)
    assert [g.members for g in groups] == [(0, 1), (2,)]  # batch sizes differ: never fused


def test_fusion_respects_memory_budget() -> None:
    models = _heads(2)
    x, _ = data(2, seed=0)
    mm = build_multimodel([profile_model(m, x[:1]) for m in models])
    enc_out = next(k for k in mm.shared if mm.layers[k].name == "enc_l2")
    together = fuse_models(mm, [enc_out], CM, batch_sizes=[8, 8], epochs=[1, 1], memory_budget=1e9)
    alone = fuse_models(mm, [enc_out], CM, batch_sizes=[8, 8], epochs=[1, 1], memory_budget=1.0 * 2**40)
    assert [g.members for g in together] == [(0, 1)]
    single = max(
        estimate_peak_memory(mm, g.plan, 8)
        for g in fuse_models(mm, [enc_out], CM, batch_sizes=[8, 16], epochs=[1, 1], memory_budget=1e9)
    )  # different batch: kept apart
    assert together[0].memory_bytes > single and alone
    budget = (single + together[0].memory_bytes) / 2  # fits one model, not two
    groups = fuse_models(mm, [enc_out], CM, batch_sizes=[8, 8], epochs=[1, 1], memory_budget=budget)
    assert [g.members for g in groups] == [(0,), (1,)]
    assert all(g.memory_bytes <= budget for g in groups)


def test_fused_training_matches_separate_training() -> None:
    base = _heads(3)
    fused = _train(copy.deepcopy(base), groups_fused=True)
    alone = _train(copy.deepcopy(base), groups_fused=False)
    for a, b in zip(fused, alone, strict=True):
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    assert not torch.equal(fused[0]["fc.weight"], base[0].state_dict()["fc.weight"])  # it did train


def _measured_peak(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Peak CPU bytes of one training step from torch.profiler's memory timeline (params, grads, optimizer state,
    activations and temporaries all included)."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


def test_memory_estimate_upper_bounds_measured_peak() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    for p in model[0].parameters():
        p.requires_grad_(False)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    mm = build_multimodel([profile_model(model, x[:1])])
    plan = plan_transfer(
        [model], x[:1], method="current_practice", batch_sizes=[64], epochs=[1], records=64, cost_model=CM, mm=mm
    )
    # Nautilus leaves the framework's workspace to the user; 64 KiB covers loss and allocator slack on CPU here
    estimate = estimate_peak_memory(mm, plan.groups[0].plan, 64, workspace_bytes=64 * 1024)
    measured = _measured_peak(model, x, y)
    assert measured <= estimate <= 3 * measured
