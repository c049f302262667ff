from __future__ import annotations

import pytest
import torch
from torch import nn


def tiny_cnn() -> nn.Sequential:
    """stem | stage1 (conv+bn) | stage2 (Sequential of two blocks) | head: a sequential chain with batch norm."""
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, stride=2), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
        ),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)),
    )


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # the machine is shared: one intra-op thread avoids OpenMP spin-waiting against other processes
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return tiny_cnn()


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (32,), generator=g)
    return x, y
