"""Near-data feature extraction (Vista, Nautilus): a worker runs the frozen prefix `extract` once over each partition
it loads, and every config's units on that worker train from the features."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from framework.data import tensor_bytes
from framework.engine.state import to_cpu

#: rows per batch when a worker runs `extract` over a partition
EXTRACT_BATCH = 1024


def extract_features(extract: Callable, data: Any, device: torch.device, stats: dict[str, Any],
                     batch_size: int = EXTRACT_BATCH) -> Any:
    """`(x, y, ...) -> (extract(x), y, ...)` under `torch.no_grad()`, in batches on `device`, the features back on
    the host; adds its seconds, bytes and records to `stats`."""
    if not (isinstance(data, (tuple, list)) and len(data) >= 2):
        raise TypeError(
            f"`extract` needs a partition's data to be a tuple (inputs, labels, ...), got {type(data).__name__}"
        )
    x = data[0] if isinstance(data[0], torch.Tensor) else torch.as_tensor(data[0])
    if isinstance(extract, torch.nn.Module):
        extract.to(device).eval()
    start = time.perf_counter()
    outs: list[Any] = []
    with torch.no_grad():
        for s in range(0, len(x), batch_size):
            outs.append(to_cpu(extract(x[s : s + batch_size].to(device))))
    feats = _concat_features(outs, len(x))
    stats["seconds"] += time.perf_counter() - start
    stats["bytes"] += tensor_bytes(feats)
    stats["records"] += len(x)
    return (feats, *data[1:])


def _concat_features(outs: list[Any], n: int) -> Any:
    """Concatenate per-batch outputs of `extract` (a tensor, or a dict of tensors, each batch-first)."""
    if not outs:
        raise ValueError("`extract` got a partition with no records")
    first = outs[0]
    if isinstance(first, torch.Tensor):
        feats: Any = torch.cat(outs)
    elif isinstance(first, dict) and all(isinstance(v, torch.Tensor) for v in first.values()):
        feats = {k: torch.cat([o[k] for o in outs]) for k in first}
    else:
        raise TypeError(f"`extract` must return a tensor or a dict of tensors, got {type(first).__name__}")
    lens = {len(v) for v in (feats.values() if isinstance(feats, dict) else [feats])}
    if lens != {n}:
        raise ValueError(f"`extract` must keep the batch as the first dimension: {n} records gave lengths {lens}")
    return feats
