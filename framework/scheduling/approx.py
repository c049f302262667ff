"""Dense-schedule approximation for the MOP open shop (an alternative to Cerebro's vector rearrangement, 5.2)."""

from __future__ import annotations

import time

from framework.scheduling._plan import HEURISTIC, OPTIMAL, OfflineSolver, Schedule, ShopProblem
from framework.scheduling._replay import replay


class DenseApproxSolver(OfflineSolver):
    """The better of two dense (non-idling) list schedules, most-work-remaining and longest-unit-first.

    Guarantee (classic open shop, one holder per partition): a dense schedule never leaves a worker idle while it has
    an eligible unit. Take the unit (c, w) that finishes last: before it starts, at every moment w is busy or c is
    busy elsewhere, so C <= load(w) + work(c) <= 2 * LB <= 2 * C*; counting only c's other units (at most p - 1) or
    w's other configs (at most |S| - 1) gives C <= LB + (min(|S|, p) - 1) * T_max as well. No polynomial algorithm
    beats 5/4 unless P = NP (Williamson et al. 1997).
    With replicas the schedule is still feasible and dense but the factor-2 proof does not carry over, so no
    guarantee is claimed there. This is not Sevastyanov's vector rearrangement, whose optimality threshold
    (L_max >= (p^2 + p - 1) T_max as quoted by Cerebro) we did not implement; `Schedule.info["guarantee"]` holds the
    bound this instance satisfies, and the simulator reports how close the result gets to the lower bound.
    """

    name = "approx"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def solve(self, problem: ShopProblem) -> Schedule:
        from framework.scheduling.lpt import LPTScheduler
        from framework.scheduling.mwr import MWRScheduler

        t0 = time.perf_counter()
        best = min((replay(problem, MWRScheduler()), replay(problem, LPTScheduler())), key=lambda s: s.makespan)
        lb = problem.lower_bound()
        t_max = max(problem.durations.values(), default=0.0)
        k = min(len(problem.configs), len(problem.workers))
        replicated = any(len(problem.options(u)) > 1 for u in problem.units)
        info = {"rule": best.solver} if replicated else {"guarantee": lb + (k - 1) * t_max, "rule": best.solver}
        return Schedule(
            best.entries,
            status=HEURISTIC,
            bound=lb,
            solver=self.name,
            runtime_s=time.perf_counter() - t0,
            info=info,
        )


def warm_start(name: str, problem: ShopProblem, t0: float) -> tuple[Schedule, float, Schedule | None]:
    """The exact solvers' shared first step: the dense heuristic's schedule (upper bound and hint), the lower bound,
    and that schedule marked optimal when it already meets the bound (then the solver `name` is skipped)."""
    lb = problem.lower_bound()
    warm = DenseApproxSolver().solve(problem)
    done = None
    if warm.makespan <= lb * (1 + 1e-9):
        done = Schedule(warm.entries, OPTIMAL, lb, name, time.perf_counter() - t0, {"skipped": "UB == LB"})
    return warm, lb, done
