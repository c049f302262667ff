"""Most-work-remaining (MWR) dispatching: the classic open-shop priority rule, dense, replica-aware."""

from __future__ import annotations

from framework.scheduling._base import Scheduler
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Assignment, Unit


class MWRScheduler(Scheduler):
    """Each idle worker takes the eligible unit whose config has the most estimated work left in the round.

    Work left is `state.work_left(config)` (pending units at their fastest holder's estimate), so with
    heterogeneous configs the long configs, which bound the makespan from below, are never starved. Ties (common when
    times are equal) go to the unit that is longest on this worker, then the lowest config id and partition, which
    makes identical-time rounds run as a cyclic Latin square. Idle workers are served in ascending id order; which
    holder of a replicated partition is faster is not considered. Dense, hence within (min(|S|, p) - 1) * T_max of the
    lower bound like every non-idling dispatcher. The `seed` is accepted for the registry and unused (deterministic).
    """

    name = "mwr"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def _key(self, state: DispatchState, worker: int, u: Unit) -> tuple:
        return (-state.work_left(u.config_id), -float(state.estimate(u, worker)), u.config_id, u.partition)

    def select(self, state: DispatchState) -> list[Assignment]:
        out: list[Assignment] = []
        taken: set[int] = set()
        for w in self._worker_order(state):
            best = None
            best_key = None
            for u in state.eligible_unsorted(w):
                if u.config_id in taken:
                    continue
                k = self._key(state, w, u)
                if best_key is None or k < best_key:
                    best, best_key = u, k
            if best is not None:
                out.append(Assignment(best, (w,)))
                taken.add(best.config_id)
        return out

    def _worker_order(self, state: DispatchState) -> list[int]:
        return state.idle_workers()
