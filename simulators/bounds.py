"""Lower bound on the makespan of one epoch of a workload (with replicas, the bound that still holds)."""

from __future__ import annotations

from framework.scheduling import ShopProblem
from simulators.workload import Workload


def shop_problem(workload: Workload, epoch: int = 0) -> ShopProblem:
    """One epoch of `workload` as an open shop: its units, each with its duration on every worker that holds the unit's
    partition (seconds, from `Workload.duration`)."""
    durations = {
        (u, w): workload.duration(u, w) for u in workload.units(epoch) for w in workload.availability[u.partition]
    }
    return ShopProblem(tuple(workload.units(epoch)), durations)


def lower_bound(workload: Workload, epochs: int = 1) -> float:
    """max(max over configs of their cheapest total work, max over workers of forced load, total cheapest work / p),
    times `epochs` (epochs are separated by barriers). Without replicas: max(max row sum, max column sum) of T."""
    return epochs * shop_problem(workload).lower_bound()
