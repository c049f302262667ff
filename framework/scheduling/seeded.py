"""`SeededOrderScheduler`: every config visits its epoch's partitions in an order fixed by the run seed.

This is what `ModelSelection(deterministic=True)` dispatches with. A config's weights depend only on the order in
which it absorbs partitions (every unit is seeded from (seed, config, epoch, partition)), so with this order fixed,
two runs with one seed train the same weights and report the same metrics, whatever the timing. The price: a
config waits for the holder of its next partition instead of taking whichever worker is free. Among the units
that are next for their config, an idle worker takes the one of the config with the most work left (MWR).
Evaluation units follow the same order (which does not change a metric, but keeps a pack's members together).

The orders form a Latin square: each epoch draws one permutation of the p partitions, and config c starts it at
position (c + shift) mod p, the shift drawn per epoch too. So the configs' next partitions are spread evenly over
the workers (with a multiple of p configs and even unit times nobody waits), and configs c and c + p share their
whole order: they can train as one pack (`pack=`) without leaving it, which is how packing keeps to what a config
learns at pack=1.
"""

from __future__ import annotations

import random

from framework.scheduling._base import Scheduler
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import Assignment, Unit


class SeededOrderScheduler(Scheduler):
    name = "seeded"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._orders: dict[tuple[int, int], dict[int, int]] = {}  # (config, epoch) -> partition -> rank

    def order(self, config_id: int, epoch: int, partitions: list[int]) -> list[int]:
        """The seeded visit order of `partitions` for `config_id` in `epoch`: the epoch's permutation, started at
        position (config_id + the epoch's shift) mod len(partitions) (module docstring)."""
        parts = sorted(partitions)
        if not parts:
            return []
        rng = random.Random(f"{self.seed}/{epoch}")
        base = rng.sample(parts, len(parts))
        start = (config_id + rng.randrange(len(parts))) % len(parts)
        return base[start:] + base[:start]

    def _rank(self, state: DispatchState, config_id: int, epoch: int) -> dict[int, int]:
        key = (config_id, epoch)
        if key not in self._orders:
            parts = sorted({p for p in state.availability})
            self._orders[key] = {p: i for i, p in enumerate(self.order(config_id, epoch, parts))}
        return self._orders[key]

    def select(self, state: DispatchState) -> list[Assignment]:
        nxt: dict[tuple[int, str], Unit] = {}  # (config, kind) -> its next unit (the first of its order pending)
        for u in state.pending:
            rank = self._rank(state, u.config_id, u.epoch)
            best = nxt.get((u.config_id, u.kind))
            if best is None or rank[u.partition] < rank[best.partition]:
                nxt[(u.config_id, u.kind)] = u
        out: list[Assignment] = []
        taken: set[int] = set()
        for w in state.idle_workers():
            cands = [u for u in state.eligible_unsorted(w) if u.config_id not in taken
                     and nxt.get((u.config_id, u.kind)) == u]
            if cands:
                u = max(cands, key=lambda u: (state.work_left(u.config_id), -u.config_id, -u.partition, u.kind))
                out.append(Assignment(u, (w,)))
                taken.add(u.config_id)
        return out
