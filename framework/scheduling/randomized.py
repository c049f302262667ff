"""Cerebro's randomized scheduler (Algorithm 1, VLDB 2020 section 5.3), replica- and failure-aware (5.5-5.6)."""

from __future__ import annotations

import heapq
import random

from framework.scheduling._base import Scheduler
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Assignment


class RandomizedScheduler(Scheduler):
    """Each idle worker, in id order, takes a uniformly random eligible unit.

    Algorithm 1 shuffles Q and takes the first unit whose model is idle and whose partition is on the worker; that is
    a uniform draw among the eligible units, which is what this does. Eligibility consults the availability map, so the
    same code is the replica-aware variant (section 5.5); requeued units of failed workers are eligible again
    (section 5.6, queues Q and Q' live in `DispatchState`). Dense: it never leaves a worker idle while one of its units
    is eligible, so the makespan is within (min(|S|, p) - 1) * T_max of the lower bound.
    """

    name = "randomized"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def select(self, state: DispatchState) -> list[Assignment]:
        """Idle workers in id order, each drawing uniformly among its eligible units (configs taken earlier in this
        call excluded). Only what changed since the last call is looked at (`DispatchState.changes`): the policy
        is dense, so every other idle worker has nothing eligible. The workers to ask are the changed ones and,
        for each changed config, its smallest idle holder, then its next one each time that one took another
        config: a heap of heads, so a completion costs a few draws whatever the numbers of workers and configs."""
        workers, configs = state.changes()
        heads = [(w, -1, 0) for w in workers]  # (worker, changed config it heads for or -1, its index in holders)
        holders: dict[int, list[int]] = {}  # a changed config's idle holders, once its first one was not enough
        for c in configs:
            h = state.first_idle_holder(c)
            if h is not None:
                heads.append((h, c, 0))
        heapq.heapify(heads)
        out: list[Assignment] = []
        taken: set[int] = set()
        asked: set[int] = set()
        while heads:
            w, c, i = heapq.heappop(heads)
            if c >= 0 and c in taken:
                continue
            if w not in asked:
                asked.add(w)
                unit = state.sample_eligible(w, self._rng, taken)
                if unit is not None:
                    out.append(Assignment(unit, (w,)))
                    taken.add(unit.config_id)
            if c >= 0 and c not in taken:  # its head took another config (or nothing of its): ask its next holder
                hs = holders.get(c)
                if hs is None:
                    hs = holders[c] = state.idle_holders_of(c)
                i += 1
                while i < len(hs) and hs[i] in asked:
                    i += 1
                if i < len(hs):
                    heapq.heappush(heads, (hs[i], c, i))
        return out
