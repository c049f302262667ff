"""A plan-following scheduler runs each worker's and each config's units in the plan's order, whatever the real unit
times are."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from framework.scheduling import CPSATSolver, OfflineSolver, PlanScheduler, Schedule, ScheduledUnit, ShopProblem, Unit
from simulators import Noise, Workload, heterogeneous, replicate, simulate, validate_schedule

# 3 equal configs (1 s per unit), partition q on worker q; rows are (config, partition, worker, start, end).
# Not what a greedy rule would do: worker 0 runs config 2 first, and worker 1 idles during [0, 2) although config 1
# could run there, because its first planned unit is config 0's, which must visit worker 0 first.
_PLAN = [
    (2, 0, 0, 0.0, 1.0), (0, 0, 0, 1.0, 2.0), (1, 0, 0, 2.0, 3.0),  # worker 0
    (0, 1, 1, 2.0, 3.0), (2, 1, 1, 3.0, 4.0), (1, 1, 1, 4.0, 5.0),  # worker 1
]  # fmt: skip


class _FixedPlan(OfflineSolver):
    """Returns a hand-made plan of epoch-0 training units, whatever the problem."""

    name = "fixed"

    def __init__(self, rows: list[tuple[int, int, int, float, float]]) -> None:
        self.plan = Schedule(tuple(ScheduledUnit(Unit(c, 0, q), w, s, e) for c, q, w, s, e in rows))

    def solve(self, problem: ShopProblem) -> Schedule:
        assert set(problem.units) == {e.unit for e in self.plan.entries}
        return self.plan


def _orders(rows, key: str) -> dict[int, list[tuple[int, int]]]:
    """worker (or config) -> its (config, partition) visits in start order; rows: (config, partition, worker, start)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for c, q, w, _start in sorted(rows, key=lambda r: r[3]):
        out.setdefault(w if key == "worker" else c, []).append((c, q))
    return out


def _executed(schedule: pd.DataFrame) -> list[tuple]:
    return list(schedule[["config_id", "partition", "worker", "start"]].itertuples(index=False, name=None))


def _planned(plan: Schedule) -> list[tuple]:
    return [(e.unit.config_id, e.unit.partition, e.worker, e.start) for e in plan.entries]


def _three_configs() -> Workload:
    return Workload(np.ones((3, 2)), {0: (0,), 1: (1,)})


def test_plan_scheduler_with_exact_times_runs_the_plan_itself():
    w = _three_configs()
    r = simulate(w, PlanScheduler(_FixedPlan(_PLAN)))
    assert validate_schedule(r.schedule, w.availability).ok
    ran = sorted(r.schedule[["config_id", "partition", "worker", "start", "end"]].itertuples(index=False, name=None))
    assert ran == sorted(_PLAN)  # worker 1 waited for config 0 instead of starting config 1 at t = 0
    assert r.makespan == 5.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_scheduler_keeps_worker_and_config_orders_when_real_times_drift(seed):
    w = _three_configs()
    r = simulate(w, PlanScheduler(_FixedPlan(_PLAN)), noise=Noise(sigma=0.5, straggler_prob=0.3), seed=seed)
    assert validate_schedule(r.schedule, w.availability).ok
    planned = [row[:4] for row in _PLAN]
    for key in ("worker", "config"):
        assert _orders(_executed(r.schedule), key) == _orders(planned, key)


@pytest.mark.parametrize("workload", [heterogeneous(5, 3, seed=4), replicate(heterogeneous(4, 3, seed=5), 2, seed=0)])
def test_plan_scheduler_follows_solved_plan_under_noise(workload):
    scheduler = PlanScheduler(CPSATSolver(time_limit_s=2.0))
    r = simulate(workload, scheduler, noise=Noise(sigma=0.4), seed=3)
    assert validate_schedule(r.schedule, workload.availability).ok
    for key in ("worker", "config"):
        assert _orders(_executed(r.schedule), key) == _orders(_planned(scheduler.plan), key)


def test_plan_scheduler_with_exact_times_is_no_slower_than_its_plan():
    w = heterogeneous(6, 3, seed=7)
    scheduler = PlanScheduler(CPSATSolver(time_limit_s=2.0))
    r = simulate(w, scheduler)
    assert r.makespan <= scheduler.plan.makespan + 1e-9
