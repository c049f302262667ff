"""Exact open-shop scheduling with OR-Tools CP-SAT: interval variables and no-overlap per worker and per config.

Also the rule every solve whose result feeds a schedule or a plan follows (`bound_by_work`, `wall_stopped`; the
MILPs, the joint planner and the batch-size solve use it): a budget is deterministic work, never seconds, so the same
inputs and seed give the same result on any machine under any load. Budgets are given in *reference seconds*: a
solver's deterministic work that takes about that long on a quiet machine (measured per model, e.g.
`WORK_PER_S`); a wall-clock limit of `wall_stop_s(budget)` remains only as a safety stop, and a result it cut short
says so (`Schedule.info["wall_stop"]`, a plan's status).
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
from framework.scheduling.units import TRAIN

#: CP-SAT's deterministic time per reference second on the open-shop models (this file's and the MILP's CP-SAT
#: backend). CP-SAT's unit is "about a second" on its authors' reference machine; on these interval models a quiet
#: 2-core x86 machine runs it ~20x slower: a solve stopped at a wall limit of 0.5-2 s had done 0.015-0.21 units per
#: second of CPU time, median 0.05 (0.026 with replicas, whose optional intervals cost more per unit).
WORK_PER_S = 0.05
#: the wall-clock safety stop of a solve with a budget of b reference seconds: 10 b + 10 s. A machine ten times slower
#: than the reference (or that loaded) still ends by its deterministic limit; only a stuck or far slower one stops here
WALL_STOP_FACTOR, WALL_STOP_MARGIN_S = 10.0, 10.0


def wall_stop_s(budget_s: float) -> float:
    """The wall-clock safety stop, in seconds, of a solve whose budget is `budget_s` reference seconds."""
    return WALL_STOP_FACTOR * budget_s + WALL_STOP_MARGIN_S


def bound_by_work(parameters: Any, work: float, budget_s: float, workers: int = 1, seed: int = 0) -> None:
    """Bound a CP-SAT solve by `work` units of deterministic time (`parameters`: a `CpSolver`'s), with `workers`
    search workers interleaved deterministically where there are several (`interleave_search`: without it parallel
    workers race) and a fixed seed; `wall_stop_s(budget_s)` seconds of wall time as the safety stop."""
    parameters.max_deterministic_time = work
    parameters.max_time_in_seconds = wall_stop_s(budget_s)
    parameters.num_workers = workers
    parameters.interleave_search = workers > 1
    parameters.random_seed = native_seed(seed, bits=31)  # CP-SAT's seed is an int32


def wall_stopped(solver: Any, status: int) -> bool:
    """Whether a solve bounded by `bound_by_work` ended at its wall-clock safety stop (its result then depends on the
    machine): not proven, and short of its deterministic limit (CP-SAT stops at or just past that limit)."""
    from ortools.sat.python import cp_model

    done = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID)
    return not done and solver.ResponseProto().deterministic_time < solver.parameters.max_deterministic_time


def integer_durations(problem: ShopProblem, resolution: int = 1000) -> tuple[dict, float, float]:
    """Durations scaled and rounded up to integers: (scaled, scale, alpha).

    Integral inputs are kept as they are (scale 1). Otherwise the shortest positive duration maps to about
    `resolution` ticks. Rounding up keeps every solution feasible for the true times; `alpha` = max(rounded / true)
    turns a bound on the rounded optimum into one on the true optimum (OPT_true >= OPT_rounded / alpha).
    """
    vals = [d for d in problem.durations.values() if d > 0]
    if all(float(d).is_integer() for d in problem.durations.values()):
        return {k: int(d) for k, d in problem.durations.items()}, 1.0, 1.0
    scale = resolution / min(vals)
    scaled = {k: math.ceil(d * scale - 1e-9) for k, d in problem.durations.items()}
    alpha = max((scaled[k] / (d * scale) for k, d in problem.durations.items() if d > 0), default=1.0)
    return scaled, scale, max(alpha, 1.0)


class CPSATSolver(OfflineSolver):
    """Minimise the makespan exactly with CP-SAT (warm-started, bounded by deterministic work).

    One interval per (unit, allowed worker), optional with a presence literal when the partition has replicas and
    exactly one present per unit; `AddNoOverlap` per worker and per config; eval units start after their config's
    training; C >= every end. The horizon is the warm start's makespan (a dense MWR/LPT schedule, also given as a
    complete hint); if that already equals the lower bound the solver is skipped. `Schedule.status` is "optimal" only
    when optimality is proven for the true (unrounded) times, and `Schedule.bound` is a valid lower bound on them.

    `time_limit_s`: the budget in reference seconds, `WORK_PER_S` of CP-SAT's deterministic time each (see the module
    docstring): the same problem and seed give the same schedule on any machine, under any load. `workers` > 1 search
    in parallel, interleaved deterministically. `Schedule.info["wall_stop"]` is True where the safety stop
    (`wall_stop_s`) cut the solve short instead, and `info["work"]` holds the deterministic time it used.
    """

    name = "cpsat"

    def __init__(self, time_limit_s: float = 10.0, workers: int = 1, warm_start: bool = True, seed: int = 0) -> None:
        if time_limit_s <= 0:
            raise ValueError(f"`time_limit_s` is {time_limit_s}, but must be > 0")
        if workers < 1:
            raise ValueError(f"`workers` is {workers}, but must be >= 1")
        self.time_limit_s, self.workers, self.warm_start, self.seed = time_limit_s, workers, warm_start, seed

    def solve(self, problem: ShopProblem) -> Schedule:
        from ortools.sat.python import cp_model

        t0 = time.perf_counter()
        warm, lb, done = warm_start(self.name, problem, t0)
        if done is not None:
            return done
        dur, scale, alpha = integer_durations(problem)
        hint = left_shift(warm.entries, lambda u, w: dur[(u, w)])
        horizon = int(math.ceil(max(e.end for e in hint)))

        m = cp_model.CpModel()
        by_worker: dict[int, list] = {}
        by_config: dict[int, list] = {}
        start, end, pres = {}, {}, {}
        for u in problem.units:
            opts = problem.options(u)
            s = m.NewIntVar(0, horizon, f"s{u}")
            e = m.NewIntVar(0, horizon, f"e{u}")
            start[u], end[u] = s, e
            if len(opts) == 1:
                w = opts[0][0]
                iv = m.NewIntervalVar(s, dur[(u, w)], e, f"i{u}")
                by_worker.setdefault(w, []).append(iv)
                by_config.setdefault(u.config_id, []).append(iv)
                pres[(u, w)] = None
                continue
            lits = []
            for w, _ in opts:
                lit = m.NewBoolVar(f"x{u}{w}")
                iv = m.NewOptionalIntervalVar(s, dur[(u, w)], e, lit, f"i{u}{w}")
                by_worker.setdefault(w, []).append(iv)
                pres[(u, w)] = lit
                lits.append(lit)
            m.AddExactlyOne(lits)
            ds = [dur[(u, w)] for w, _ in opts]
            size = m.NewIntVar(min(ds), max(ds), f"d{u}")
            m.Add(e == s + size)
            by_config.setdefault(u.config_id, []).append(m.NewIntervalVar(s, size, e, f"c{u}"))
        for ivs in (*by_worker.values(), *by_config.values()):
            m.AddNoOverlap(ivs)
        trains: dict[int, list] = {}
        for u in problem.units:
            if u.kind == TRAIN:
                trains.setdefault(u.config_id, []).append(u)
        for u in problem.units:
            if u.kind != TRAIN:
                for t in trains.get(u.config_id, ()):
                    m.Add(start[u] >= end[t])
        cmax = m.NewIntVar(math.floor(lb * scale / alpha), horizon, "C")
        m.AddMaxEquality(cmax, [end[u] for u in problem.units])
        m.Minimize(cmax)
        if self.warm_start:
            for e in hint:
                m.AddHint(start[e.unit], int(e.start))
                for w, _ in problem.options(e.unit):
                    if pres[(e.unit, w)] is not None:
                        m.AddHint(pres[(e.unit, w)], w == e.worker)
            m.AddHint(cmax, int(horizon))

        solver = cp_model.CpSolver()
        bound_by_work(solver.parameters, self.time_limit_s * WORK_PER_S, self.time_limit_s, self.workers, self.seed)
        status = solver.Solve(m)
        limits = {"work": solver.ResponseProto().deterministic_time, "wall_stop": wall_stopped(solver, status)}
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Schedule(
                warm.entries, HEURISTIC, lb, self.name, time.perf_counter() - t0, {"cp_status": "none", **limits}
            )
        planned = []
        for u in problem.units:
            w = next(w for w, _ in problem.options(u) if pres[(u, w)] is None or solver.Value(pres[(u, w)]))
            s = solver.Value(start[u]) / scale
            planned.append(ScheduledUnit(u, w, s, s + problem.durations[(u, w)]))
        entries = left_shift(planned, lambda u, w: problem.durations[(u, w)])
        bound = max(lb, solver.BestObjectiveBound() / scale / alpha)
        makespan = max(e.end for e in entries)
        proven = status == cp_model.OPTIMAL and (alpha == 1.0 or makespan <= bound * (1 + 1e-9))
        if makespan > warm.makespan:  # cannot happen with the hint, but never return worse than the warm start
            entries = list(warm.entries)
        return Schedule(
            tuple(entries),
            OPTIMAL if proven else FEASIBLE,
            bound,
            self.name,
            time.perf_counter() - t0,
            {"cp_status": solver.StatusName(status), "scale": scale, "alpha": alpha, **limits},
        )
