"""Near-data split point and feature-extraction batch sizes (HAPI sections 4.4-4.5).

``choose_split_index``: HAPI Algorithm 1. Candidates are layers at or before the freeze index whose per-record output
is smaller than the per-record input; the winner is the earliest candidate whose output for one training batch
transfers within ``budget_s`` seconds at ``bandwidth_bytes_per_s`` (HAPI uses 1 s); else the freeze index.

``choose_extraction_batch_sizes``: HAPI equation 1. Maximise the memory used, sum_r b_r * M_r(data) + M_r(model),
subject to b_min <= b_r <= b_max and the total fitting ``memory_total - memory_occupied``; solved exactly with CP-SAT
within ``SOLVE_BUDGET_S`` reference seconds of deterministic work (one worker, seed 0: the same requests give the same
sizes on any machine under any load). Feature-extraction batch sizes never change training (the frozen prefix is
deterministic).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from framework.scheduling.cpsat import WORK_PER_S, bound_by_work, wall_stopped

#: the batch-size solve's budget in reference seconds (`framework.scheduling.cpsat`): a knapsack of one variable per
#: request, proven optimal in milliseconds (the tests' instances: under 10 ms of CPU, under 0.0001 deterministic time)
SOLVE_BUDGET_S = 10.0


def choose_split_index(
    output_bytes: Sequence[float],
    input_bytes: float,
    freeze_index: int,
    *,
    batch_size: int,
    bandwidth_bytes_per_s: float,
    budget_s: float = 1.0,
) -> int:
    """Index (into ``output_bytes``, per record, in layer order) of the layer to split after."""
    if not output_bytes:
        raise ValueError("`output_bytes` is empty, but must hold one per-record size per layer")
    if not 0 <= freeze_index < len(output_bytes):
        raise ValueError(f"`freeze_index` is {freeze_index}, but must be in [0, {len(output_bytes) - 1}]")
    if input_bytes <= 0:
        raise ValueError(f"`input_bytes` is {input_bytes}, but must be > 0")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` is {batch_size!r}, but must be an int >= 1")
    if bandwidth_bytes_per_s <= 0 or budget_s <= 0:
        raise ValueError(
            f"`bandwidth_bytes_per_s` is {bandwidth_bytes_per_s} and `budget_s` is {budget_s}, but both must be > 0"
        )
    capacity = bandwidth_bytes_per_s * budget_s
    for idx in range(freeze_index + 1):
        if output_bytes[idx] < input_bytes and output_bytes[idx] * batch_size < capacity:
            return idx
    return freeze_index


@dataclass(frozen=True)
class ExtractionRequest:
    """One feature-extraction request: memory per record (input + intermediates), model memory, batch bounds."""

    data_bytes_per_record: float
    model_bytes: float
    min_batch: int
    max_batch: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.max_batch:
            raise ValueError(
                f"`min_batch` is {self.min_batch} and `max_batch` {self.max_batch}, but need 1 <= min_batch <= max_batch"
            )
        if self.data_bytes_per_record <= 0 or self.model_bytes < 0:
            raise ValueError(
                f"`data_bytes_per_record` is {self.data_bytes_per_record} and `model_bytes` {self.model_bytes}, "
                "but need data_bytes_per_record > 0 and model_bytes >= 0"
            )


def choose_extraction_batch_sizes(
    requests: Sequence[ExtractionRequest], memory_total: float, memory_occupied: float = 0.0
) -> list[int]:
    """HAPI equation 1; raises ValueError when even the minimum batch sizes do not fit. Warns (RuntimeWarning) where the
    solve's wall-clock safety stop, not its deterministic budget, ended it."""
    free = memory_total - memory_occupied
    if memory_total <= 0 or memory_occupied < 0 or free <= 0:
        raise ValueError(
            f"`memory_total` is {memory_total} and `memory_occupied` {memory_occupied}, but need total > occupied >= 0"
        )
    if not requests:
        return []
    unit = max(1.0, min(r.data_bytes_per_record for r in requests) / 1000)  # keep CP-SAT coefficients integral
    model = cp_model.CpModel()
    bs = [model.NewIntVar(r.min_batch, r.max_batch, f"b{i}") for i, r in enumerate(requests)]
    used = sum(
        b * math.ceil(r.data_bytes_per_record / unit) + math.ceil(r.model_bytes / unit)
        for b, r in zip(bs, requests, strict=False)
    )
    model.Add(used <= int(free // unit))
    model.Maximize(used)
    solver = cp_model.CpSolver()
    bound_by_work(solver.parameters, SOLVE_BUDGET_S * WORK_PER_S, SOLVE_BUDGET_S)
    status = solver.Solve(model)
    if wall_stopped(solver, status):
        warnings.warn(
            f"the extraction batch-size solve hit its wall-clock safety stop ({solver.StatusName(status)}): these "
            "batch sizes depend on this machine's speed",
            RuntimeWarning,
            stacklevel=2,
        )
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise ValueError(
            f"`memory_total` {memory_total} minus occupied {memory_occupied} cannot fit the minimum batches"
        )
    return [int(solver.Value(b)) for b in bs]


def extraction_batch_size(
    data_bytes_per_record: float, model_bytes: float, memory_budget: float, max_batch: int
) -> int:
    """The single-request case: the largest batch in [1, max_batch] that fits ``memory_budget``."""
    req = ExtractionRequest(data_bytes_per_record, model_bytes, 1, max_batch)
    return choose_extraction_batch_sizes([req], memory_budget)[0]
