"""Cerebro's randomized scheduler (Algorithm 1, VLDB 2020 section 5.3), replica- and failure-aware (5.5-5.6)."""

from __future__ import annotations

import random

from framework.scheduling._base import Assignment, DispatchState, Scheduler, greedy_select


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
        workers = state.candidate_workers()
        if state.few_free_configs(workers):  # few configs, many idle workers: find the candidates from the configs
            return greedy_select(state, lambda _w, units: self._rng.choice(units), workers)
        out: list[Assignment] = []
        taken: set[int] = set()
        for w in workers:  # each draws uniformly among its eligible units (by rejection while most are eligible)
            unit = state.sample_eligible(w, self._rng, taken)
            if unit is not None:
                out.append(Assignment(unit, w))
                taken.add(unit.config_id)
        return out
