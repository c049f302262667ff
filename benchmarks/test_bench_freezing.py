"""Step time of a small ResNet with nothing frozen, with a frozen prefix, and with a frozen prefix read from the cache.

    .venv/bin/pytest benchmarks/test_bench_freezing.py --benchmark-only

Compare the three `test_bench_step_*` means: freezing saves the prefix's backward pass, caching also its forward.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from framework.freezing import FreezingController, split_by_size

_spec = importlib.util.spec_from_file_location(
    "layer_freezing", Path(__file__).resolve().parents[1] / "experiments" / "layer_freezing.py"
)
layer_freezing = importlib.util.module_from_spec(_spec)
sys.modules["layer_freezing"] = layer_freezing
_spec.loader.exec_module(layer_freezing)

BATCH = 64


@pytest.fixture
def setup(tmp_path):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = layer_freezing.resnet(16)
    x = torch.randn(4 * BATCH, 1, 16, 16)
    y = torch.randint(0, 10, (4 * BATCH,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    controller = FreezingController(model, split_by_size(model, 5), eval_interval=10**9, cache_dir=tmp_path)
    yield model, controller, optimizer, x, y
    controller.close()
    torch.set_num_threads(previous)


def _run(benchmark, model, controller, optimizer, x, y, use_ids: bool) -> None:
    batches = list(torch.arange(len(y)).split(BATCH))
    state = {"i": 0}

    def step() -> None:
        ids = batches[state["i"] % len(batches)]
        state["i"] += 1
        loss = F.cross_entropy(controller.forward(x[ids], ids if use_ids else None), y[ids])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(len(batches)):  # warm-up pass; with a frozen prefix and ids it fills the cache
        step()
    benchmark.pedantic(step, rounds=40, iterations=1)


def test_bench_step_no_freezing(benchmark, setup):
    model, controller, optimizer, x, y = setup
    _run(benchmark, model, controller, optimizer, x, y, use_ids=False)


def test_bench_step_frozen_prefix(benchmark, setup):
    model, controller, optimizer, x, y = setup
    controller.freeze(3)  # stem+stage1, stage2, first block of stage3; backward skipped, forward still runs
    _run(benchmark, model, controller, optimizer, x, y, use_ids=False)


def test_bench_step_frozen_prefix_cached(benchmark, setup):
    model, controller, optimizer, x, y = setup
    controller.freeze(3)
    _run(benchmark, model, controller, optimizer, x, y, use_ids=True)  # prefix forward read from the cache
