"""Lookahead MWR: an online policy that plans each round by simulating perturbed MWR dispatches (no solver)."""

from __future__ import annotations

import random
import time

from framework.scheduling._plan import HEURISTIC, OPTIMAL, OfflineSolver, Schedule, ShopProblem
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.mwr import MWRScheduler
from framework.scheduling.plan import PlanScheduler
from framework.scheduling.units import Unit


class _PerturbedMWR(MWRScheduler):
    """MWR whose priority of (config, worker) is multiplied by a fixed random factor in [1, 1 + eps]."""

    def __init__(self, seed: int, eps: float) -> None:
        super().__init__(seed)
        self._rng = random.Random(seed)
        self._eps = eps
        self._noise: dict[tuple[int, int], float] = {}

    def _key(self, state: DispatchState, worker: int, u: Unit) -> tuple:
        k = (u.config_id, worker)
        f = self._noise.get(k)
        if f is None:
            f = self._noise[k] = 1.0 + self._eps * self._rng.random()
        return (-state.work_left(u.config_id) * f, u.config_id, u.partition)


class LookaheadSolver(OfflineSolver):
    """Best of up to `tries` dense dispatches on estimated times: plain MWR and LPT, then perturbed MWR priorities.

    Stops as soon as a dispatch reaches the lower bound (then it is optimal, status "optimal"), or after `tries`
    dispatches or `budget_s` seconds (None: no time limit, which keeps it deterministic). A randomized local search, not an exact method: no proof when it stops above the
    bound. Each dispatch costs about as much as one simulated round of MWR.
    """

    name = "lookahead"

    def __init__(
        self, seed: int = 0, tries: int = 200, budget_s: float | None = None, eps: tuple[float, ...] = (0.3, 1.0)
    ):
        if tries < 1:
            raise ValueError(f"`tries` is {tries}, but must be >= 1")
        self.seed, self.tries, self.budget_s, self.eps = seed, tries, budget_s, eps

    def solve(self, problem: ShopProblem) -> Schedule:
        from framework.scheduling._replay import replay
        from framework.scheduling.approx import DenseApproxSolver

        t0 = time.perf_counter()
        lb = problem.lower_bound()
        best = DenseApproxSolver().solve(problem)  # best of plain MWR and LPT
        i = 0
        for i in range(1, self.tries):
            if best.makespan <= lb * (1 + 1e-9) or (
                self.budget_s is not None and time.perf_counter() - t0 > self.budget_s
            ):
                break
            cand = replay(problem, _PerturbedMWR(self.seed * 100_003 + i, self.eps[i % len(self.eps)]))
            if cand.makespan < best.makespan:
                best = cand
        status = OPTIMAL if best.makespan <= lb * (1 + 1e-9) else HEURISTIC
        return Schedule(
            best.entries,
            status=status,
            bound=lb,
            solver=self.name,
            runtime_s=time.perf_counter() - t0,
            info={"dispatches": i + 1},
        )


class LookaheadScheduler(PlanScheduler):
    """Online MWR with lookahead (our "beyond Cerebro" policy): plan by `LookaheadSolver`, follow worker orders.

    Usable live: only `state.estimate` and cheap simulations, no solver. On the Figure 6 grid it reaches the lower
    bound (see experiments/scheduler_comparison.py).
    """

    def __init__(self, seed: int = 0, tries: int = 200, budget_s: float | None = None) -> None:
        super().__init__(LookaheadSolver(seed=seed, tries=tries, budget_s=budget_s), seed=seed, name="lookahead")
