"""The dispatch state shared by the live engine and the simulators (the policies' contract is `_base.Scheduler`).

One *round* (an epoch barrier of the engine) is an open shop: every active config must visit every partition once
(a training *unit*), then, once all its training units are done, evaluate on every validation partition (eval units).
`DispatchState` keeps the bookkeeping of a round (Cerebro's queues Q and Q', idle workers, busy configs, the
availability map) and enforces the MOP invariants; a `Scheduler` only *chooses* which eligible unit goes to which idle
worker. The engine (real clock, Ray) and the simulator (simulated clock) drive the very same objects through the same
calls, so a policy is written once.

Nothing here imports Ray.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from framework.scheduling.units import TRAIN, Assignment, Unit, UnitTimeEstimate


def _uniform_estimate(unit: Unit, worker: int) -> float:
    return 1.0


class _IdleView:
    """The workers with a free slot at one capacity (`idle`: load < `capacity`; `order`: the same, ascending), the
    same by partition (`by_part`: partition -> its idle holders, ascending), and what changed since the policy last
    looked at this capacity (`workers`, `configs`). `DispatchState` keeps one per capacity it was asked at and
    updates each on every change of a worker's load, so switching capacities (twice per dispatch at queue depth > 1)
    costs nothing."""

    __slots__ = ("by_part", "capacity", "configs", "idle", "order", "workers")

    def __init__(self, capacity: int, idle: set[int], by_part: dict[int, list[int]], configs: set[int]) -> None:
        self.capacity, self.idle, self.by_part = capacity, idle, by_part
        self.order = sorted(idle)
        self.workers: set[int] = set(idle)  # changed: every idle worker is new to a policy that never looked
        self.configs: set[int] = configs

    def add(self, w: int, parts: Iterable[int]) -> None:
        if w not in self.idle:
            self.idle.add(w)
            bisect.insort(self.order, w)
            by_part = self.by_part
            for p in parts:
                bisect.insort(by_part.setdefault(p, []), w)

    def discard(self, w: int, parts: Iterable[int]) -> None:
        if w in self.idle:
            self.idle.discard(w)
            order = self.order
            del order[bisect.bisect_left(order, w)]
            by_part = self.by_part
            for p in parts:
                hs = by_part[p]
                del hs[bisect.bisect_left(hs, w)]


@dataclass
class DispatchState:
    """Bookkeeping of one round: Cerebro's Q (pending), Q' (running), idle flags and availability.

    Args:
        units: every unit of the round (train and eval).
        availability: partition -> workers that hold it (replicas: several workers).
        estimate: expected duration of a unit on a worker (measured by the engine; used by informed policies).

    Invariants kept here, so no policy can break them: a config is in one place at a time, running or reserved in
    one worker's queue (model isolation), a worker holds at most `capacity` units, one running and the rest queued
    behind it (worker exclusivity; `capacity` 1 is Cerebro's model), a unit runs only on a worker that holds its
    partition, a config's eval units wait until its training units of the round are done, and a unit leaves the
    round only when it completes (completeness) or its config is dropped.

    Policies see a worker with a free slot as *idle*: `idle_workers`, `candidate_workers` and `eligible` count slots,
    not running units. The engine asks the policy twice per dispatch (`framework.driver.dispatch`): first with
    `capacity` 1, so workers with nothing to run are served first, then with its queue depth.

    An assignment may be plural (`framework.scheduling.units`): a gang takes a slot on each of its workers, each of
    which must hold the partition it trains, and keeps its config busy until its last unit leaves; a pack starts every member's unit at once and keeps its worker until its
    last member leaves. Every transition keeps an eligibility index up to date, so no query scans what cannot run,
    and records what changed since the policy last looked (`changes`), which a dense policy may look at alone.
    """

    units: Iterable[Unit]
    availability: Mapping[int, Iterable[int]]
    estimate: UnitTimeEstimate = _uniform_estimate
    pending: set[Unit] = field(init=False)
    running: dict[Unit, Assignment] = field(init=False, default_factory=dict)  # member unit -> its assignment
    done: list[Unit] = field(init=False, default_factory=list)
    dropped: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.units = sorted(set(self.units))
        self.pending = set(self.units)
        # measured all-reduce seconds of a unit's pass on a ring (a gang of k pays `comm_s * 2 (k - 1) / k` per unit;
        # set by the engine from its gangs' steps; None: no gang has run)
        self.comm_s: float | None = None
        # (config, k) -> seconds per training unit of the config's latest step on k workers (1: a hop), as measured
        # (set by the engine; what a gang of k costs where the all-reduce model above is off, e.g. on shared cores)
        self.unit_s: dict[tuple[int, int], float] = {}
        # partition -> its pending units that may run once their config is free (the eligibility index below),
        # sorted: what a worker's draws pick from
        self._by_partition: dict[int, list[Unit]] = {}
        self._by_config: dict[int, set[Unit]] = {}
        for u in self.units:
            self._by_config.setdefault(u.config_id, set()).add(u)
        # config -> estimated pending work, built lazily on the first `work_left` call, then kept up to date
        self._cost: dict[Unit, float] | None = None
        self._work: dict[int, float] = {}
        self.capacity = 1  # units a worker may hold (running + queued); see `set_capacity`
        self._load: dict[int, int] = {}  # worker -> units it holds
        self._busy_configs: set[int] = set()
        self.availability = {p: set(ws) for p, ws in self.availability.items()}
        self.workers: set[int] = set().union(*self.availability.values()) if self.availability else set()
        # the idle workers at each capacity the policy was asked at (`set_capacity`), each kept up to date by every
        # change of a worker's load; `_idle` (live workers with a free slot, load < capacity) is the current one's
        view = _IdleView(1, set(self.workers), {}, set())
        self._views: dict[int, _IdleView] = {1: view}
        self._all_views: tuple[_IdleView, ...] = (view,)
        self._view = view
        self._idle = view.idle
        missing = {u.partition for u in self.units} - set(self.availability)
        if missing:
            raise ValueError(f"partitions {sorted(missing)} have no entry in `availability`")
        self._train_left: dict[int, int] = {}
        for u in self.units:
            if u.kind == TRAIN:
                self._train_left[u.config_id] = self._train_left.get(u.config_id, 0) + 1
        self._parts_of: dict[int, set[int]] = {}  # worker -> partitions it holds (the reverse of `availability`)
        self._sorted_parts: dict[int, tuple[int, ...]] = {}  # the same, sorted (a cache)
        for p, ws in self.availability.items():
            for w in ws:
                self._parts_of.setdefault(w, set()).add(p)
        # The eligibility index, kept up to date by every transition so no query scans what cannot run:
        # config -> partition -> its pending unit there that may run once the config is free (a training unit, or
        # an eval unit once its training units are done; at most one per partition), partition -> how many of
        # those belong to free configs, and the free configs that have one.
        self._cpart: dict[int, dict[int, Unit]] = {}
        self._shadowed: dict[tuple[int, int], list[Unit]] = {}  # (config, partition) -> later units waiting behind
        self._nfree: dict[int, int] = {}
        self._free: set[int] = set()
        for u in self.units:
            if self._kind_ok(u):
                self._enter(u)
        view.by_part = self._index_idle(view.idle)

    # ---- idle workers ----------------------------------------------------------------------------------------------
    def _index_idle(self, idle: set[int]) -> dict[int, list[int]]:
        """partition -> its holders among `idle`, ascending."""
        return {p: sorted(ws & idle) for p, ws in self.availability.items()}

    def _set_load(self, w: int, n: int, freed: bool) -> None:
        """Worker `w` holds `n` units now (one fewer than before when `freed`, else one more): it is idle in every
        view whose capacity is above `n`. A freed slot is news to every view; a taken one to the views where the
        worker may still take more."""
        if n:
            self._load[w] = n
        else:
            del self._load[w]
        parts = self._parts_of.get(w, ())
        live = w in self.workers
        for view in self._all_views:
            if n < view.capacity and live:
                view.add(w, parts)
                view.workers.add(w)  # a slot freed up, or one is left after the unit it took
            else:
                view.discard(w, parts)
                if freed:
                    view.workers.add(w)

    def _not_idle(self, w: int) -> None:
        parts = self._parts_of.get(w, ())
        for view in self._all_views:
            view.discard(w, parts)

    def _mark_config(self, c: int) -> None:
        """Config `c` turned free or gained an eligible unit: news to the policy at every capacity."""
        for view in self._all_views:
            view.configs.add(c)

    def _holds_any(self, w: int, mine: dict[int, Unit]) -> bool:
        return not mine.keys().isdisjoint(self._parts_of.get(w, _NONE))

    def idle_holders_of(self, config_id: int) -> list[int]:
        """The idle workers that hold a partition of one of the config's eligible units, ascending (from whichever
        side is cheaper: the idle workers, or the config's partitions)."""
        mine = self._cpart.get(config_id)
        if not mine:
            return []
        idle = self._idle
        if len(idle) < 4 * len(mine):  # a set test per idle worker, in C
            keys, held = mine.keys(), self._parts_of
            return sorted(w for w in idle if not keys.isdisjoint(held.get(w, _NONE)))
        by_part = self._view.by_part
        return sorted(set().union(*[by_part[p] for p in mine if by_part.get(p)]))

    def first_idle_holder(self, config_id: int) -> int | None:
        """The smallest idle worker that holds a partition of one of the config's eligible units (None: there is
        none); cheaper than `idle_holders_of(config_id)[0]`, and most often all a policy needs."""
        mine = self._cpart.get(config_id)
        if not mine:
            return None
        # the idle workers from the smallest up, as many as the config has partitions to go to (most often the
        # first holds one), then from the partitions' side
        keys, held, view = mine.keys(), self._parts_of, self._view
        for w in itertools.islice(view.order, len(mine)):
            if not keys.isdisjoint(held.get(w, _NONE)):
                return w
        if len(view.order) <= len(mine):
            return None
        by_part = view.by_part
        return min((hs[0] for p in mine if (hs := by_part.get(p))), default=None)

    def changes(self) -> tuple[list[int], list[int]]:
        """What changed since the policy last looked at the current capacity (`Dispatcher` clears it after each
        `select`): the idle workers that turned idle, joined, or took a unit and have a slot left, and the free
        configs that turned free or gained an eligible unit, ascending. A dense policy (one that never leaves an
        eligible unit waiting next to an idle holder) has assigned every other pair already, so it may look at
        these alone."""
        view = self._view
        return sorted(view.workers & view.idle), sorted(view.configs & self._free)

    def clear_changes(self) -> None:
        self._view.workers.clear()
        self._view.configs.clear()

    # ---- the eligibility index ------------------------------------------------------------------------------------
    def _kind_ok(self, u: Unit) -> bool:
        return u.kind == TRAIN or self._train_left.get(u.config_id, 0) == 0

    def _enter(self, u: Unit) -> None:
        """Pending `u` may run once its config is free."""
        c = u.config_id
        mine = self._cpart.get(c)
        if mine is None:
            mine = self._cpart[c] = {}
        if u.partition in mine:  # a second one on the partition (a config's next epoch opened early): it waits
            if mine[u.partition] != u:
                waiting = self._shadowed.setdefault((c, u.partition), [])
                if u not in waiting:
                    waiting.append(u)
            return
        mine[u.partition] = u
        self._list(u)
        n = self._nfree.get(u.partition, 0)
        if c in self._busy_configs:
            self._nfree[u.partition] = n
        else:
            self._nfree[u.partition] = n + 1
            self._free.add(c)
            self._mark_config(c)

    def _leave(self, u: Unit) -> None:
        """`u` no longer waits to run (started, dropped, or its eval waits again for training)."""
        c = u.config_id
        mine = self._cpart.get(c)
        if mine is None or mine.get(u.partition) != u:
            shadowed = self._shadowed.get((c, u.partition))
            if shadowed and u in shadowed:
                shadowed.remove(u)
            return
        del mine[u.partition]
        self._unlist(u)
        if c not in self._busy_configs:
            self._nfree[u.partition] -= 1
        if not mine:
            del self._cpart[c]
            self._free.discard(c)
        if self._shadowed:  # a unit it hid on the partition takes its place
            waiting = self._shadowed.pop((c, u.partition), [])
            for v in sorted(waiting):
                if v in self.pending and self._kind_ok(v):
                    waiting.remove(v)
                    if waiting:
                        self._shadowed[(c, u.partition)] = waiting
                    self._enter(v)
                    break
            else:
                if waiting:
                    self._shadowed[(c, u.partition)] = waiting

    def _set_busy(self, c: int) -> None:
        self._busy_configs.add(c)
        self._free.discard(c)
        nfree = self._nfree
        for p in self._cpart.get(c, ()):
            nfree[p] -= 1

    def _set_free(self, c: int) -> None:
        self._busy_configs.discard(c)
        mine = self._cpart.get(c)
        if mine:
            self._free.add(c)
            self._mark_config(c)
            nfree = self._nfree
            for p in mine:
                nfree[p] += 1  # every partition with an eligible unit has a count (`_enter`)

    def _train_changed(self, c: int, before: int) -> None:
        """Config `c`'s count of pending training units went from `before` to its current value: its pending eval
        units become eligible (the count reached 0) or wait again (it left 0)."""
        after = self._train_left.get(c, 0)
        if (before == 0) == (after == 0):
            return
        evals = sorted(u for u in self._by_config.get(c, ()) if u.kind != TRAIN)  # a fixed order, whatever the hash
        for u in evals:
            if after == 0:
                self._enter(u)
            else:
                self._leave(u)

    def _add_pending(self, u: Unit) -> None:
        self.pending.add(u)
        self._by_config.setdefault(u.config_id, set()).add(u)
        if self._kind_ok(u):
            self._enter(u)
        if self._cost is not None and u in self._cost:
            self._work[u.config_id] = self._work.get(u.config_id, 0.0) + self._cost[u]

    # ---- queries used by policies -------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """True when nothing is pending or running (Q and Q' are empty)."""
        return not self.pending and not self.running

    @property
    def busy_workers(self) -> set[int]:
        return {w for w, n in self._load.items() if n >= self.capacity}

    @property
    def busy_configs(self) -> set[int]:
        return set(self._busy_configs)

    def set_capacity(self, capacity: int) -> None:
        """Let a worker hold up to `capacity` units (1: only workers with nothing to run are idle)."""
        if capacity < 1:
            raise ValueError(f"`capacity` is {capacity!r}, but must be >= 1")
        if capacity != self.capacity:
            self.capacity = capacity
            view = self._views.get(capacity)
            if view is None:  # once per capacity; from then on every change of a load keeps it up to date
                idle = {w for w in self.workers if self._load.get(w, 0) < capacity}
                view = self._views[capacity] = _IdleView(capacity, idle, self._index_idle(idle), set(self._free))
                self._all_views = tuple(self._views.values())
            self._view, self._idle = view, view.idle

    def load(self, worker: int) -> int:
        """Units `worker` holds now (running and queued)."""
        return self._load.get(worker, 0)

    def idle_workers(self) -> list[int]:
        """Live workers with a free slot (see `capacity`), in ascending id order."""
        return list(self._view.order)

    def partitions_of(self, worker: int) -> set[int]:
        return set(self._parts_of.get(worker, ()))

    def is_eligible(self, unit: Unit, worker: int) -> bool:
        return (
            unit in self.pending
            and worker in self._idle
            and unit.config_id not in self._busy_configs
            and worker in self.availability.get(unit.partition, ())
            and self._kind_ok(unit)
        )

    def can_start(self, assignment: Assignment) -> bool:
        """Whether every member's unit is eligible on every worker of `assignment` now (a gang's workers all hold
        the partition and have a free slot; a pack's configs are all free)."""
        if len(assignment.workers) == 1 and len(assignment.members) == 1:
            return self.is_eligible(assignment.unit, assignment.workers[0])
        return all(self.is_eligible(u, w) for u in assignment.units for w in assignment.workers
                   if u.partition == assignment.partition_of(w))

    def eligible(self, worker: int) -> list[Unit]:
        """Pending units that `worker` may start now, in a deterministic (sorted) order."""
        units = self.eligible_unsorted(worker)
        return sorted(units) if len(units) > 1 else units

    def _free_count(self, parts: Iterable[int]) -> int:
        nfree, n = self._nfree, 0
        for p in parts:  # (a worker holds a few: a loop beats a generator)
            n += nfree.get(p, 0)
        return n

    def eligible_unsorted(self, worker: int) -> list[Unit]:
        """Same units as `eligible`, in no particular order (cheaper; for policies that rank candidates anyway)."""
        if worker not in self._idle:
            return []
        parts = self._parts_of.get(worker, ())
        n = self._free_count(parts)
        if n == 0:
            return []
        return self._collect(parts)

    def _collect(self, parts: Iterable[int], lists: list | None = None, total: int = 0) -> list[Unit]:
        """The eligible units of `parts`: from the free configs' side or the partitions' side, whichever is
        shorter to walk (`lists`, `total`: the partitions' pending units and their count, when known)."""
        busy = self._busy_configs
        if lists is None:
            lists = [self._by_partition.get(p, ()) for p in parts]
            total = sum(map(len, lists))
        if len(self._free) * len(lists) < total:
            cpart = self._cpart
            return [mine[p] for c in self._free for mine in (cpart[c],) for p in parts if p in mine]
        return [u for units in lists for u in units if u.config_id not in busy]

    def _unindex_config(self, unit: Unit) -> None:
        units = self._by_config.get(unit.config_id)
        if units is not None:
            units.discard(unit)
            if not units:  # only configs with pending units stay: their count tells how many could run
                del self._by_config[unit.config_id]

    def _list(self, unit: Unit) -> None:
        bisect.insort(self._by_partition.setdefault(unit.partition, []), unit)

    def _unlist(self, unit: Unit) -> None:
        units = self._by_partition[unit.partition]
        i = bisect.bisect_left(units, unit)
        if i < len(units) and units[i] == unit:
            del units[i]

    def candidate_workers(self) -> list[int]:
        """Idle live workers with an eligible unit, in ascending id order (a subset of `idle_workers`)."""
        nfree = self._nfree
        return [w for w in self._view.order if any(nfree.get(p, 0) for p in self._parts_of.get(w, ()))]

    def sample_eligible(self, worker: int, rng, exclude: set[int], tries: int = 8) -> Unit | None:
        """A uniformly random unit among `eligible(worker)` whose config is not in `exclude` (None: there is none).

        Knows from the index how many units are eligible; draws pending units of the worker's partitions at random
        and keeps the first eligible one (rejection sampling: uniform, and cheap when most are eligible), else
        (or after `tries` misses) draws from the eligible units themselves. `rng` is a `random.Random`.
        """
        if worker not in self._idle:
            return None
        parts = self._sorted_parts.get(worker)
        if parts is None:
            parts = self._sorted_parts[worker] = tuple(sorted(self._parts_of.get(worker, ())))
        n = self._free_count(parts)
        if n == 0:
            return None
        if exclude:  # the configs taken earlier in this select are still free: count theirs out
            cpart = self._cpart
            n -= sum(1 for c in exclude if c in self._free for p in parts if p in cpart[c])
            if n == 0:
                return None
        by_partition, lists, total = self._by_partition, [], 0
        for p in parts:
            units = by_partition.get(p, ())
            lists.append(units)
            total += len(units)
        busy = self._busy_configs
        if total <= tries * n:  # at least one draw in `tries` hits, on average
            for _ in range(2 * tries):
                i = rng.randrange(total)
                for units in lists:
                    if i < len(units):
                        u = units[i]
                        break
                    i -= len(units)
                if u.config_id not in busy and u.config_id not in exclude:
                    return u
        units = self._collect(parts, lists, total)  # a fixed order to draw from (sets of ints and sorted lists)
        units = [u for u in units if u.config_id not in exclude] if exclude else units
        return rng.choice(units) if units else None

    def remaining(self, config_id: int) -> list[Unit]:
        """Units of a config still pending (not running, not done)."""
        return sorted(self._by_config.get(config_id, ()))

    def unit_cost(self, unit: Unit) -> float:
        """Estimated time of `unit` on its fastest holder (cached at first use; used as a policy-neutral weight)."""
        if self._cost is None:
            self._build_work()
        assert self._cost is not None
        return self._cost[unit]

    def work_left(self, config_id: int) -> float:
        """Estimated pending (not started) work of a config: sum of `unit_cost` over its pending units."""
        if self._cost is None:
            self._build_work()
        return self._work.get(config_id, 0.0)

    def _build_work(self) -> None:
        cost: dict[Unit, float] = {}
        for u in self.units:
            holders = self.availability.get(u.partition) or ()
            cost[u] = min((float(self.estimate(u, w)) for w in holders), default=0.0)
        self._cost = cost
        self._work = {}
        for c, us in self._by_config.items():
            self._work[c] = math.fsum(cost[u] for u in us)  # exact: the same whatever the set order

    def stalled_partitions(self) -> set[int]:
        """Partitions with pending units that no live worker holds (the run must wait for one)."""
        return {u.partition for u in self.pending if not self.availability.get(u.partition)}

    # ---- transitions driven by the engine or the simulator ------------------------------------------------------
    def start(self, assignment: Assignment) -> None:
        """Start `assignment`: its member units leave Q for Q', its workers each take one slot."""
        if not self.can_start(assignment):
            raise ValueError(f"{assignment.unit} (members {assignment.members}) is not eligible on workers "
                             f"{assignment.workers}")
        single = len(assignment.workers) == 1 and len(assignment.members) == 1
        for unit in (assignment.unit,) if single else assignment.units:
            self.pending.remove(unit)
            self._unindex_config(unit)
            self._leave(unit)
            if self._cost is not None:
                self._work[unit.config_id] -= self._cost[unit]
            self.running[unit] = assignment
            if unit.config_id not in self._busy_configs:  # (a gang's units share their config)
                self._set_busy(unit.config_id)
        for worker in assignment.workers:
            self._set_load(worker, self._load.get(worker, 0) + 1, freed=False)

    def _release(self, unit: Unit) -> None:
        a = self.running.pop(unit)
        if len(a.members) == 1 and len(a.workers) == 1:
            self._set_free(unit.config_id)
        else:  # a pack or a gang: its config is free once its last unit leaves, its workers once the last of all
            others = [u for u in a.units if self.running.get(u) is a]
            if not any(u.config_id == unit.config_id for u in others):
                self._set_free(unit.config_id)
            if others:
                return
        for worker in a.workers:
            self._set_load(worker, self._load[worker] - 1, freed=True)

    def complete(self, unit: Unit) -> None:
        self._release(unit)
        self.done.append(unit)
        if unit.kind == TRAIN:
            c = unit.config_id
            left = self._train_left[c] = self._train_left[c] - 1
            if left == 0:  # its eval units may run now (`_train_changed`, whose only case this is)
                self._train_changed(c, 1)

    def requeue(self, unit: Unit) -> None:
        """The unit's worker failed (or the unit must be re-run whole): back from Q' to Q (Cerebro 5.6)."""
        self._release(unit)
        if unit.config_id not in self.dropped:
            self._add_pending(unit)
        elif unit.kind == TRAIN:  # it leaves with its config: no eval of a later wave waits for it
            self._train_left[unit.config_id] -= 1

    def drop_config(self, config_id: int) -> None:
        """Remove a config (failed or stopped) from the round: its pending units are discarded."""
        self.dropped.add(config_id)
        gone = sorted(self._by_config.get(config_id, ()))
        self.pending -= set(gone)
        for u in gone:
            self._unindex_config(u)
            self._leave(u)
        trains = sum(u.kind == TRAIN for u in gone)
        if trains:  # a config that comes back (`add_units`) counts its training units afresh
            self._train_left[config_id] -= trains
        if self._cost is not None:
            self._work[config_id] = 0.0

    def remove_worker(self, worker: int) -> list[Unit]:
        """A worker died or was drained: requeue what it ran and forget its partitions. Returns requeued units."""
        lost = [u for u, a in self.running.items() if worker in a.workers]  # a gang loses all its workers' pass
        for u in lost:
            self.requeue(u)
        self.drain_worker(worker)
        return lost

    def add_worker(self, worker: int, partitions: Iterable[int]) -> None:
        """A worker joined (elasticity) or came back, holding `partitions`."""
        self._not_idle(worker)  # (re-indexed below with its partitions)
        self.workers.add(worker)
        self._sorted_parts.pop(worker, None)
        for p in partitions:
            self.availability.setdefault(p, set()).add(worker)
            self._parts_of.setdefault(worker, set()).add(p)
        n = self._load.get(worker, 0)
        parts = self._parts_of.get(worker, ())
        for view in self._all_views:
            if n < view.capacity:
                view.add(worker, parts)
            view.workers.add(worker)

    def drain_worker(self, worker: int) -> None:
        """Give `worker` no new units (elastic scale-in); a unit it is running finishes and completes normally."""
        self._not_idle(worker)
        self.workers.discard(worker)
        self._sorted_parts.pop(worker, None)
        for p in self._parts_of.pop(worker, ()):
            self.availability[p].discard(worker)

    def add_units(self, units: Iterable[Unit]) -> None:
        """More units join the state while it runs (a config's next epoch, without a barrier). `units` becomes
        every unit pending or running, the new ones included, so a policy's `start_round` sees what is left."""
        new = sorted(set(units) - self.pending - set(self.running))
        for u in new:
            if u.partition not in self.availability:
                raise ValueError(f"partition {u.partition} of {u} has no entry in `availability`")
        for u in new:  # training first: an eval unit added with its epoch waits for it
            if u.kind == TRAIN:
                before = self._train_left.get(u.config_id, 0)
                self._train_left[u.config_id] = before + 1
                self._train_changed(u.config_id, before)
            self.dropped.discard(u.config_id)
        self._cost = None  # rebuilt on the next `work_left`
        for u in new:
            self._add_pending(u)
        self.units = sorted(self.pending | set(self.running))

    def reopen(self, unit: Unit) -> None:
        """A completed training unit's effect was lost (state object and checkpoint gone): it must run again."""
        self.done.remove(unit)
        if unit.kind == TRAIN:
            before = self._train_left.get(unit.config_id, 0)
            self._train_left[unit.config_id] = before + 1
            self._train_changed(unit.config_id, before)
        if unit not in self.units:  # it left `units` when more were added (`add_units`)
            bisect.insort(self.units, unit)
            self._cost = None
        self._add_pending(unit)


_NONE: frozenset[int] = frozenset()


def greedy_select(
    state: DispatchState, pick: Callable[[int, list[Unit]], Unit | None], workers: list[int]
) -> list[Assignment]:
    """Assign idle `workers` in the given order; `pick(worker, candidates)` chooses among still-eligible units."""
    out: list[Assignment] = []
    taken_configs: set[int] = set()
    for w in workers:
        candidates = [u for u in state.eligible(w) if u.config_id not in taken_configs]
        if not candidates:
            continue
        unit = pick(w, candidates)
        if unit is None:
            continue
        out.append(Assignment(unit, (w,)))
        taken_configs.add(unit.config_id)
    return out
