"""Run an online policy on exact estimated durations (no noise, no failures) to obtain a `Schedule`.

This is the planning-time twin of the simulator's event loop, kept minimal so offline solvers (the dense-schedule
approximation, warm starts for CP-SAT and the MILP) can call it without importing `simulators`.
"""

from __future__ import annotations

import heapq
import time

from framework.scheduling._base import Scheduler
from framework.scheduling._plan import HEURISTIC, Schedule, ScheduledUnit, ShopProblem
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Unit


def state_from_problem(problem: ShopProblem) -> DispatchState:
    availability: dict[int, set[int]] = {}
    for u in problem.units:
        availability.setdefault(u.partition, set()).update(w for w, _ in problem.options(u))
    durations = problem.durations
    return DispatchState(problem.units, availability, lambda u, w: durations[(u, w)])


def replay(problem: ShopProblem, scheduler: Scheduler, name: str | None = None) -> Schedule:
    """Dispatch every unit with `scheduler` on a simulated clock where each unit takes exactly its duration.

    Completions at the same time are applied together before the policy is asked again, so policies see every
    worker that is idle at that instant.
    """
    t0 = time.perf_counter()
    state = state_from_problem(problem)
    scheduler.start_round(state)
    heap: list[tuple[float, int, Unit, int, float]] = []
    seq = 0
    now = 0.0
    entries: list[ScheduledUnit] = []
    while True:
        for a in scheduler.select(state):
            state.start(a)
            end = now + problem.durations[(a.unit, a.worker)]
            heapq.heappush(heap, (end, seq, a.unit, a.worker, now))
            seq += 1
        if not heap:
            break
        now = heap[0][0]
        while heap and heap[0][0] <= now:
            end, _, unit, worker, start = heapq.heappop(heap)
            state.complete(unit)
            entries.append(ScheduledUnit(unit, worker, start, end))
    if not state.finished:
        raise RuntimeError(f"policy {scheduler.name!r} stopped with {len(state.pending)} units pending")
    return Schedule(
        tuple(entries),
        status=HEURISTIC,
        bound=problem.lower_bound(),
        solver=name or scheduler.name,
        runtime_s=time.perf_counter() - t0,
    )
