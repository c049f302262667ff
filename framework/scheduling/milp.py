"""Cerebro's MILP (VLDB 2020, section 5.1, equation 2) with OR-Tools' MIP interface (SCIP by default)."""

from __future__ import annotations

import time

from framework.scheduling._plan import (
    FEASIBLE,
    HEURISTIC,
    OPTIMAL,
    OfflineSolver,
    Schedule,
    ScheduledUnit,
    ShopProblem,
    left_shift,
)
from framework.scheduling.approx import warm_start
from framework.scheduling.units import TRAIN


class MILPSolver(OfflineSolver):
    """The paper's big-M formulation: start times X, isolation order Y (per config), exclusivity order Z (per worker).

    Constraints (2a-f) as published, with two strengthenings that keep the formulation: V (big M) is the warm start's
    makespan instead of the sum of all unit times, and C >= LB (without it the LP bound is only T_max). Eval units
    start after their config's training. With replicas (which the paper's MILP does not model) every unit is pinned
    to the worker the warm start gave it. Instances with more than `max_pairs` ordering variables are not built (the
    model alone would not fit the time limit); the warm start is then returned with status "heuristic" and
    `info["skipped"]`. Solved with `backend` ("SCIP" or "CP-SAT") under `time_limit_s`; the warm start is passed
    as a hint. `Schedule.bound` is the solver's proven bound (at least LB; just LB with replicas, where the
    pinned model's bound does not hold for the problem itself).
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
        if backend not in ("SCIP", "CP-SAT", "CBC"):
            raise ValueError(f"`backend` is {backend!r}, but must be one of ('SCIP', 'CP-SAT', 'CBC')")
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
        solver.SetTimeLimit(int(self.time_limit_s * 1000))
        status = solver.Solve()
        if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            return Schedule(warm.entries, HEURISTIC, lb, self.name, time.perf_counter() - t0, {"mip_status": status})
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
            {"mip_status": status, "pairs": n_pairs},
        )
