"""Executing an offline plan online: each worker follows its planned order, whatever the real unit times are."""

from __future__ import annotations

import time

from framework.scheduling._base import Scheduler
from framework.scheduling._plan import OfflineSolver, Schedule, ShopProblem
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Assignment, Unit


class PlanScheduler(Scheduler):
    """Solve the round once in `start_round` (on `state.estimate`), then dispatch each worker's units in plan order.

    Only the *orders* of the plan are followed (each worker's and each config's), never its absolute times: a worker
    whose next planned unit is not the next of its config yet, or not eligible yet (its config still runs elsewhere,
    its training is not done), waits for it. Waiting cannot
    deadlock, because every wait points to a unit that starts earlier in the plan. Units the plan cannot place any
    more (their planned worker failed or left, or they were not in the plan) go to idle workers by most work
    remaining, as does everything if nothing is running and no planned unit can start. With exact times the
    executed schedule is the plan left-shifted, so its makespan is at most the plan's.

    Attributes:
        plan: the `Schedule` of the current round (None before `start_round`).
        solve_time_s: wall time of the last solve.
    """

    def __init__(self, solver: OfflineSolver, seed: int = 0, name: str | None = None) -> None:
        self.solver = solver
        self.seed = seed
        self.name = name or solver.name
        self.plan: Schedule | None = None
        self.solve_time_s = 0.0
        self._orders: dict[int, list[Unit]] = {}
        self._planned: dict[Unit, int] = {}
        self._ptr: dict[int, int] = {}
        self._corders: dict[int, list[Unit]] = {}
        self._cptr: dict[int, int] = {}

    def start_round(self, state: DispatchState) -> None:
        t0 = time.perf_counter()
        problem = ShopProblem.from_state(state)
        self.plan = self.solver.solve(problem) if problem.units else Schedule(())
        self.solve_time_s = time.perf_counter() - t0
        self._orders = self.plan.worker_orders()
        self._planned = {u: w for w, us in self._orders.items() for u in us}
        self._ptr = {w: 0 for w in self._orders}
        self._corders = {}
        for e in self.plan.entries:
            self._corders.setdefault(e.unit.config_id, []).append(e.unit)
        self._cptr = {c: 0 for c in self._corders}

    @staticmethod
    def _first_pending(state: DispatchState, order, ptr: dict, key: int) -> Unit | None:
        i = ptr.get(key, 0)
        while i < len(order) and order[i] not in state.pending and order[i] not in state.running:
            i += 1  # done or dropped: never comes back
        ptr[key] = i
        for u in order[i:]:
            if u in state.pending:
                return u
        return None

    def _head(self, state: DispatchState, worker: int) -> Unit | None:
        """The worker's next planned unit, if it is also its config's next planned unit among live-planned ones."""
        head = self._first_pending(state, self._orders.get(worker, ()), self._ptr, worker)
        if head is None:
            return None
        corder = self._corders.get(head.config_id, ())
        live = state.workers
        i = self._cptr.get(head.config_id, 0)
        while i < len(corder) and corder[i] not in state.pending and corder[i] not in state.running:
            i += 1
        self._cptr[head.config_id] = i
        for u in corder[i:]:
            if u == head:
                return head
            if u in state.pending and self._planned.get(u) in live:
                return _WAIT  # the config must first visit an earlier planned worker
        return head

    def _orphans(self, state: DispatchState, worker: int, taken: set[int]) -> list[Unit]:
        live = state.workers
        return [
            u
            for u in state.eligible_unsorted(worker)
            if u.config_id not in taken and self._planned.get(u, -1) not in live
        ]

    def select(self, state: DispatchState) -> list[Assignment]:
        out: list[Assignment] = []
        taken: set[int] = set()
        any_orphans = bool(set(self._orders) - state.workers) or len(self._planned) < len(state.units)
        for w in state.idle_workers():
            head = self._head(state, w)
            if head is not None and head is not _WAIT and head.config_id not in taken and state.is_eligible(head, w):
                out.append(Assignment(head, (w,)))
                taken.add(head.config_id)
                continue
            if any_orphans or head is None:
                cands = self._orphans(state, w, taken)
                if cands:
                    u = max(cands, key=lambda u: (state.work_left(u.config_id), -u.config_id, -u.partition))
                    out.append(Assignment(u, (w,)))
                    taken.add(u.config_id)
        if not out and not state.running and state.pending:
            out = _mwr_fallback(state)
        return out


_WAIT = Unit(-1, -1, -1)  # sentinel: the worker has a planned unit but must wait for it


def _mwr_fallback(state: DispatchState) -> list[Assignment]:
    out: list[Assignment] = []
    taken: set[int] = set()
    for w in state.idle_workers():
        cands = [u for u in state.eligible_unsorted(w) if u.config_id not in taken]
        if cands:
            u = max(cands, key=lambda u: (state.work_left(u.config_id), -u.config_id, -u.partition))
            out.append(Assignment(u, (w,)))
            taken.add(u.config_id)
    return out
