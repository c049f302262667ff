"""Longest processing time first (LPT) dispatching, a dense reference heuristic."""

from __future__ import annotations

from framework.scheduling._base import Scheduler
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Assignment


class LPTScheduler(Scheduler):
    """Each idle worker (ascending id) takes its eligible unit with the longest estimated time on that worker.

    Ties go to the lowest config id. Dense, so within (min(|S|, p) - 1) * T_max of the lower bound; it ignores how
    much work a config has left, which is why MWR beats it when there are few configs per worker.
    """

    name = "lpt"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def select(self, state: DispatchState) -> list[Assignment]:
        out: list[Assignment] = []
        taken: set[int] = set()
        est = state.estimate
        for w in state.idle_workers():
            cands = [u for u in state.eligible_unsorted(w) if u.config_id not in taken]
            if cands:
                u = min(cands, key=lambda u: (-float(est(u, w)), u))
                out.append(Assignment(u, (w,)))
                taken.add(u.config_id)
        return out
