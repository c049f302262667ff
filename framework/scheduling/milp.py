"""Cerebro's MILP (VLDB 2020, section 5.1, equation 2) with OR-Tools' MIP interface (SCIP by default).

Also `bound_mip_by_work`, the deterministic budget of a pywraplp solve (here and in the materialization MILP).
"""

from __future__ import annotations

import math
import time
from typing import Any

from framework.scheduling._plan import (
    FEASIBLE,
    HEURISTIC,
    OPTIMAL,
    OfflineSolver,
    Schedule,
    ScheduledUnit,
    ShopProblem,
    left_shift,
    native_seed,
)
from framework.scheduling.approx import warm_start
from framework.scheduling.cpsat import WORK_PER_S, wall_stop_s
from framework.scheduling.units import TRAIN

#: SCIP's budget: branch-and-bound nodes x model variables per reference second. SCIP has no deterministic time
#: limit, and a node of a bigger model costs more (its LPs are bigger), so the node limit is budget x this / variables.
#: Measured on the open-shop MILP (quiet 2-core x86, CPU seconds to a node count): 35-40k at 65 variables (Taillard
#: 4x4, 141 nodes in 0.23 s), 13-14k at 1,000-1,500 (ta10x10, het(16, 8); root node included).
SCIP_NODE_VARS_PER_S = 20_000
BACKENDS = ("SCIP", "CP-SAT")


def bound_mip_by_work(solver: Any, backend: str, budget_s: float, seed: int = 0) -> str:
    """Bound a pywraplp `solver` of `backend` ("SCIP" or "CP-SAT", as created; its model built) by deterministic work
    worth `budget_s` reference seconds, with `wall_stop_s(budget_s)` of wall time as the safety stop; returns the limit set, as the backend
    reads it. SCIP: a node limit (`limits/totalnodes`, restarts included, from `SCIP_NODE_VARS_PER_S`); its root node
    is always processed to its end, whose work the node limit does not bound (a big model's root can take longer than
    the budget). CP-SAT: `max_deterministic_time` (`WORK_PER_S` a second), one worker, seed `seed`. SCIP's own seed
    stays its default (fixed)."""
    if backend == "SCIP":
        nodes = max(1, math.ceil(budget_s * SCIP_NODE_VARS_PER_S / max(solver.NumVariables(), 1)))
        limit = f"limits/totalnodes = {nodes}"
    elif backend == "CP-SAT":
        limit = (
            f"max_deterministic_time: {budget_s * WORK_PER_S!r} num_workers: 1 "
            f"random_seed: {native_seed(seed, bits=31)}"
        )
    else:
        raise ValueError(
            f"`backend` is {backend!r}, but must be one of {BACKENDS} (solvers with a deterministic work limit)"
        )
    if not solver.SetSolverSpecificParametersAsString(limit):
        raise RuntimeError(f"{solver.SolverVersion()} refused {limit!r}")
    solver.SetTimeLimit(math.ceil(wall_stop_s(budget_s) * 1000))
    return limit


def mip_wall_stopped(status: int, elapsed_s: float, budget_s: float) -> bool:
    """Whether a solve bounded by `bound_mip_by_work` ended at its wall-clock safety stop: not proven, after
    `wall_stop_s(budget_s)` (`elapsed_s`: the wall seconds its `Solve` took)."""
    from ortools.linear_solver import pywraplp

    done = status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.INFEASIBLE)
    return not done and elapsed_s >= 0.99 * wall_stop_s(budget_s)


class MILPSolver(OfflineSolver):
    """The paper's big-M formulation: start times X, isolation order Y (per config), exclusivity order Z (per worker).

    Constraints (2a-f) as published, with two strengthenings that keep the formulation: V (big M) is the warm start's
    makespan instead of the sum of all unit times, and C >= LB (without it the LP bound is only T_max). Eval units
    start after their config's training. With replicas (which the paper's MILP does not model) every unit is pinned
    to the worker the warm start gave it. Instances with more than `max_pairs` ordering variables are not built (the
    model alone would not fit the budget); the warm start is then returned with status "heuristic" and
    `info["skipped"]`. Solved with `backend` ("SCIP" or "CP-SAT"; CBC is not offered: OR-Tools gives it no
    deterministic limit) within `time_limit_s` reference seconds of deterministic work (`bound_mip_by_work`: SCIP's
    node limit, CP-SAT's deterministic time), so the same problem gives the same schedule on any machine under any
    load; `info["wall_stop"]` is True where the wall-clock safety stop cut the solve short instead, and
    `info["limit"]` holds the limit set. The warm start is passed as a hint. `Schedule.bound` is the solver's
    proven bound (at least LB; just LB with replicas, where the pinned model's bound does not hold for the problem
    itself).
    """

    name = "milp"

    def __init__(
        self,
        time_limit_s: float = 10.0,
        backend: str = "SCIP",
        max_pairs: int = 60_000,
        warm_start: bool = True,
        seed: int = 0,
    ) -> None:
        if time_limit_s <= 0:
            raise ValueError(f"`time_limit_s` is {time_limit_s}, but must be > 0")
        if backend not in BACKENDS:
            raise ValueError(
                f"`backend` is {backend!r}, but must be one of {BACKENDS} (solvers with a deterministic work limit)"
            )
        self.time_limit_s, self.backend, self.max_pairs = time_limit_s, backend, max_pairs
        self.warm_start, self.seed = warm_start, seed

    def solve(self, problem: ShopProblem) -> Schedule:
        from ortools.linear_solver import pywraplp

        t0 = time.perf_counter()
        warm, lb, done = warm_start(self.name, problem, t0)
        if done is not None:
            return done
        worker_of = {e.unit: e.worker for e in warm.entries}
        by_config: dict[int, list] = {}
        by_worker: dict[int, list] = {}
        for u in problem.units:
            by_config.setdefault(u.config_id, []).append(u)
            by_worker.setdefault(worker_of[u], []).append(u)
        n_pairs = sum(len(v) * (len(v) - 1) // 2 for v in (*by_config.values(), *by_worker.values()))
        if n_pairs > self.max_pairs:
            return Schedule(
                warm.entries,
                HEURISTIC,
                lb,
                self.name,
                time.perf_counter() - t0,
                {"skipped": f"{n_pairs} ordering variables > max_pairs={self.max_pairs}"},
            )
        solver = pywraplp.Solver.CreateSolver(self.backend)
        if solver is None:
            raise RuntimeError(f"OR-Tools has no {self.backend} backend here")
        d = {u: problem.durations[(u, worker_of[u])] for u in problem.units}
        big_m = warm.makespan  # V
        x = {u: solver.NumVar(0.0, big_m - d[u], f"X{u}") for u in problem.units}  # (2e)
        c = solver.NumVar(lb, big_m, "C")
        hint_vars, hint_vals = [], []
        start_of = {e.unit: e.start for e in warm.entries}

        def disjunction(a, b, name: str) -> None:
            y = solver.BoolVar(name)  # y = 1 <=> a starts before b
            solver.Add(x[a] >= x[b] + d[b] - big_m * y)  # (2a)/(2c)
            solver.Add(x[b] >= x[a] + d[a] - big_m * (1 - y))  # (2b)/(2d)
            hint_vars.append(y)
            hint_vals.append(1.0 if start_of[a] < start_of[b] else 0.0)

        for us in by_config.values():  # Y: model isolation
            trains = [u for u in us if u.kind == TRAIN]
            for i, a in enumerate(us):
                for b in us[i + 1 :]:
                    if a.kind == TRAIN and b.kind == TRAIN:
                        disjunction(a, b, f"Y{a}{b}")
                    elif a.kind != TRAIN and b.kind != TRAIN:
                        disjunction(a, b, f"Y{a}{b}")
            for ev in us:
                if ev.kind != TRAIN:
                    for t in trains:
                        solver.Add(x[ev] >= x[t] + d[t])
        for w, us in by_worker.items():  # Z: worker exclusivity
            for i, a in enumerate(us):
                for b in us[i + 1 :]:
                    if a.config_id != b.config_id:
                        disjunction(a, b, f"Z{a}{b}w{w}")
        for u in problem.units:
            solver.Add(c >= x[u] + d[u])  # (2f)
        solver.Minimize(c)
        if self.warm_start:
            hint_vars += [x[u] for u in problem.units] + [c]
            hint_vals += [start_of[u] for u in problem.units] + [warm.makespan]
            solver.SetHint(hint_vars, hint_vals)
        limit = bound_mip_by_work(solver, self.backend, self.time_limit_s, self.seed)
        t_solve = time.perf_counter()
        status = solver.Solve()
        limits = {
            "limit": limit,
            "wall_stop": mip_wall_stopped(status, time.perf_counter() - t_solve, self.time_limit_s),
        }
        if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            return Schedule(
                warm.entries, HEURISTIC, lb, self.name, time.perf_counter() - t0, {"mip_status": status, **limits}
            )
        planned = [
            ScheduledUnit(u, worker_of[u], x[u].solution_value(), x[u].solution_value() + d[u]) for u in problem.units
        ]
        entries = left_shift(planned, lambda u, w: problem.durations[(u, w)])
        makespan = max(e.end for e in entries)
        if makespan > warm.makespan:
            entries, makespan = list(warm.entries), warm.makespan
        replicated = any(len(problem.options(u)) > 1 for u in problem.units)
        # with replicas the model pins every unit to its warm-start worker: its bound holds for that restriction only
        bound = lb if replicated else max(lb, solver.Objective().BestBound())
        proven = status == pywraplp.Solver.OPTIMAL and not replicated and makespan <= bound * (1 + 1e-6) + 1e-9
        return Schedule(
            tuple(entries),
            OPTIMAL if proven else FEASIBLE,
            min(bound, makespan),
            self.name,
            time.perf_counter() - t0,
            {"mip_status": status, "pairs": n_pairs, **limits},
        )
