"""Decision time of the online policies (pytest-benchmark): one full simulated round, no solver."""

from __future__ import annotations

import pytest

from simulators import heterogeneous, simulate


@pytest.mark.parametrize("name", ["randomized", "mwr", "lpt", "lookahead"])
def test_bench_round_256x16(benchmark, name):
    w = heterogeneous(256, 16, seed=0)
    r = benchmark.pedantic(lambda: simulate(w, name), rounds=2, iterations=1)
    benchmark.extra_info["decision_ms_per_unit"] = r.decision_ms_per_unit
    assert len(r.schedule) == 256 * 16


@pytest.mark.parametrize("p,configs", [(8, 4), (16, 8), (64, 16), (64, 48)])
def test_bench_parallelism_planner_epoch(benchmark, p, configs):
    """One simulated epoch under the joint hop/gang planner (`simulators crossover`'s heterogeneous workload): the
    wall time is nearly all CP-SAT's, under the live budget (2% of each plan's greedy makespan, 10 ms to 2 s)."""
    from framework.scheduling import ParallelismPlanner
    from simulators.backend import CostModel
    from simulators.crossover import workload

    w = workload("heterogeneous", configs, p, 0)
    comm = 0.05 * float(w.times.mean())

    def run():
        planner = ParallelismPlanner(comm_s=comm)
        return planner, simulate(w, planner, cost=CostModel(comm_s=comm))

    planner, r = benchmark.pedantic(run, rounds=2, iterations=1)
    benchmark.extra_info.update(plan_seconds=planner.plan_seconds, replans=planner.replans, makespan=r.makespan,
                                solver_status=planner.solver_status)
    assert r.makespan > 0
