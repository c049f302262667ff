from __future__ import annotations

import torch
from torch import nn


class TinyEncoder(nn.Module):
    """Embedding + 2 transformer layers (frozen) -> features; shared by several heads."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.l1 = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.l2 = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.l1(self.emb(x)))


class Head(nn.Module):
    def __init__(self, enc: TinyEncoder, hidden: int = 8) -> None:
        super().__init__()
        self.enc = enc
        self.fc = nn.Linear(16, hidden)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.fc(self.enc(x)))).mean(1))


def frozen_encoder(seed: int = 0) -> TinyEncoder:
    torch.manual_seed(seed)
    enc = TinyEncoder()
    for p in enc.parameters():
        p.requires_grad_(False)
    return enc.eval()


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 20, (n, 6), generator=g)
    return x, (x[:, 0] % 3)
