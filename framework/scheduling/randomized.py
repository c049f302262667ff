"""Cerebro's randomized scheduler (Algorithm 1, VLDB 2020 section 5.3), replica- and failure-aware (5.5-5.6)."""

from __future__ import annotations

import bisect
import random

from framework.scheduling._base import Assignment, DispatchState, Scheduler


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
        if state.few_free_configs():
            return self._from_configs(state)
        out: list[Assignment] = []
        taken: set[int] = set()
        for w in state.candidate_workers():  # each draws uniformly among its eligible units (by rejection)
            unit = state.sample_eligible(w, self._rng, taken)
            if unit is not None:
                out.append(Assignment(unit, (w,)))
                taken.add(unit.config_id)
        return out

    def _from_configs(self, state: DispatchState) -> list[Assignment]:
        """Few free configs, many idle workers (the last rounds of HyperBand on hundreds of workers): the same
        draws as letting every idle worker in id order take a random unit among its candidates, but found from
        the configs: the next worker to draw is the smallest idle holder of a config not taken yet."""
        units = state.free_config_units()
        holders = {c: state.idle_holders(us) for c, us in units.items()}
        out: list[Assignment] = []
        taken: set[int] = set()
        last = -1
        while len(taken) < len(units):
            heads = [hs[i] for c, hs in holders.items() if c not in taken
                     for i in (bisect.bisect_right(hs, last),) if i < len(hs)]
            if not heads:
                break
            w = last = min(heads)
            held = state.partitions_of(w)
            cands = sorted((u for c, us in units.items() if c not in taken for u in us if u.partition in held),
                           key=lambda u: (u.config_id, u.epoch, u.partition, u.kind))
            unit = self._rng.choice(cands)
            out.append(Assignment(unit, (w,)))
            taken.add(unit.config_id)
        return out
