"""Communication cost model of Cerebro (VLDB 2020) Table 2: bytes moved by one model-selection workload."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

KB, MB, GB, TB, PB = 1e3, 1e6, 1e9, 1e12, 1e15


@dataclass(frozen=True)
class CommCostParams:
    """k epochs, `|S|` configs, p workers, m model size (bytes), `<D>` dataset size (bytes), `|D|/b` mini-batches per epoch.

    Defaults are Table 2's example: k = 20, `|S|` = 20, p = 10, m = 1 GB, `<D>` = 1 TB, `|D|/b` = 100K.
    """

    k: int = 20
    n_configs: int = 20
    p: int = 10
    model_bytes: float = 1 * GB
    data_bytes: float = 1 * TB
    minibatches: int = 100_000

    def __post_init__(self) -> None:
        for name in ("k", "n_configs", "p", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` is {getattr(self, name)}, but must be >= 1")
        for name in ("model_bytes", "data_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` is {getattr(self, name)}, but must be > 0")


def format_bytes(n: float) -> str:
    """Decimal units rounded to an integer, as printed in Table 2 ("4 TB", "80 PB")."""
    for unit, size in (("PB", PB), ("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if n >= size:
            return f"{round(n / size):d} {unit}"
    return f"{round(n):d} B"


def comm_costs(params: CommCostParams | None = None) -> pd.DataFrame:
    """One row per approach: formula, bytes and the formatted example, in Table 2's order."""
    q = params or CommCostParams()
    k, s, p, m, d = q.k, q.n_configs, q.p, q.model_bytes, q.data_bytes
    steps = math.ceil(q.minibatches / p)  # ceil(|D| / (b p)): synchronisations per epoch
    rows = [
        ("Model Hopper Parallelism", "k m p |S| + m |S|", k * m * p * s + m * s),
        ("Task Parallelism (full replication)", "p <D> + m |S|", p * d + m * s),
        ("Task Parallelism (remote reads)", "k |S| <D> + m |S|", k * s * d + m * s),
        ("Bulk Synchronous Parallelism", "2 k m p |S|", 2 * k * m * p * s),
        ("Centralized Fine-grained (parameter server)", "2 k m p |S| ceil(|D| / (b p))", 2 * k * m * p * s * steps),
        ("Decentralized Fine-grained (all-reduce)", "k m p |S| ceil(|D| / (b p))", k * m * p * s * steps),
    ]
    return pd.DataFrame(
        [{"approach": a, "formula": f, "bytes": float(b), "example": format_bytes(b)} for a, f, b in rows]
    )
