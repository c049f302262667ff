"""Dispatch: the units that may run, the policy that picks them, and the units in flight.

Units arrive in *waves* (`open`): with a barrier, a wave is a round (every active config's next epoch); without
one, a wave is one config's next epoch, opened as soon as the procedure has decided about it. A wave joins the
`DispatchState` that is running, or starts a fresh one when everything before it has finished. A scheduler given
by name is rebuilt for every wave from (seed, wave), so a resumed run dispatches as the original would; a
`Scheduler` instance is kept for the whole run. Every wave calls the policy's `start_round`, so a plan-based
policy plans what is left.

A worker holds up to `depth` units: the one it runs and the next ones, queued on the backend, so it starts its next
unit without waiting for the driver (and the backend may fetch the next state while the current unit runs). Each
dispatch asks the policy twice: first for workers with nothing to run, then for queue slots.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from framework.options import RunOptions
from framework.scheduling import Assignment, DispatchState, Scheduler, Unit, UnitTimeEstimate, make_scheduler
from framework.scheduling.packing import Packer
from framework.scheduling.units import TRAIN, UnitReport, example_share, unit_seed


@dataclass(slots=True)
class Flight:
    """An assignment on its way: where it runs, when it started (backend clock), driver-side faults to act out."""

    assignment: Assignment
    started: float  # when it was submitted, or when the unit ahead of it in its workers' queues ended
    faults: tuple[tuple[Unit, str], ...] = ()  # (unit, action): a pack's are each member's
    queued: bool = False  # submitted behind another unit of one of its workers
    group: int | None = None  # the gang's or pack's id in the schedule log (its ticket); None: a unit of its own

    @property
    def unit(self) -> Unit:
        return self.assignment.unit

    @property
    def worker(self) -> int:
        return self.assignment.workers[0]

    @property
    def workers(self) -> tuple[int, ...]:
        return self.assignment.workers

    def rows(self, report: UnitReport) -> list[UnitReport]:
        """The schedule log's rows of a unit's report: one per worker of its gang that trained the unit's
        partition, each naming the group and counting the examples that worker trained (workers that shared the
        partition's pass took a share each: the rows add up to the report's `num_examples`)."""
        if self.group is None:
            return [report]
        a, p = self.assignment, report.unit.partition
        sharers = [w for w in a.workers if a.partition_of(w) == p]
        return [dataclasses.replace(report, worker=w, group=self.group,
                                    num_examples=example_share(report.num_examples, i, len(sharers)))
                for i, w in enumerate(sharers)]


class Dispatcher:
    """The units that may run (a `DispatchState` per wave), the policy that picks them, and the flights: every
    change to them goes through a method here (`launch`, `land`, `complete`, `requeue`, `reopen`, `drop_config`,
    `lose_worker`, ...), so the handlers never edit its fields."""

    def __init__(
        self, scheduler: str | Scheduler, seed: int, estimate: UnitTimeEstimate | None = None,
        depth: int = RunOptions.queue_depth,
        packer: Packer | None = None,
    ) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"`queue_depth` is {depth!r}, but must be an int >= 1")
        self.spec, self.seed, self.depth = scheduler, seed, depth
        self.packer = packer  # grows the policy's assignments into packs (`framework.scheduling.packing`)
        self.group_base = 0  # a gang's or pack's group in the log is its ticket plus this (a resumed run's: past the log's)
        self._estimate = estimate  # known unit times (a simulation); None: measured ones
        self.state: DispatchState | None = None
        self.scheduler: Scheduler | None = None
        self.waves = 0
        self.flights: dict[int, Flight] = {}  # ticket -> flight, in submission order (read-only outside)
        self._queues: dict[int, list[int]] = {}  # worker -> its tickets in flight, in submission order
        self._per_config: dict[tuple[int, str], dict[int, float]] = {}  # (config, kind) -> worker -> seconds
        self._per_kind: dict[str, tuple[float, int]] = {}  # kind -> (sum of measured seconds, count)
        self.longest = 0.0
        self.decision_s = 0.0  # time spent in the policy's `select` and `start_round`
        self._comm: list[float] = []  # the latest gangs' all-reduce costs, as `DispatchState.comm_s` counts them
        self._unit_by_size: dict[tuple[int, int], float] = {}  # as `DispatchState.unit_s`
        self.select_calls = 0

    def open(self, units: Iterable[Unit], availability: Mapping[int, Iterable[int]], wave: int | None = None) -> None:
        """Add a wave of units (see the module docstring); `wave` numbers it for a named scheduler's seed."""
        units = list(units)
        if not units:
            return
        if self.state is None or self.state.finished:
            self.state = DispatchState(units, availability, estimate=self._estimate or self.estimate)
            self.state.set_capacity(self.depth)
            self.state.comm_s = self.comm_estimate()
            self.state.unit_s = dict(self._unit_by_size)
        else:
            self.state.add_units(units)
        wave = self.waves if wave is None else wave
        self.waves += 1
        if isinstance(self.spec, Scheduler):
            self.scheduler = self.spec
        else:
            self.scheduler = make_scheduler(self.spec, seed=unit_seed(self.seed, wave, 7))
        t0 = time.perf_counter()
        self.scheduler.start_round(self.state)
        self.decision_s += time.perf_counter() - t0

    @property
    def idle(self) -> bool:
        """Nothing pending or running."""
        return self.state is None or self.state.finished

    def select(self) -> Iterator[Assignment]:
        """The policy's assignments: for workers with nothing to run, then for free queue slots. The caller starts
        each (`DispatchState.start`) before taking the next."""
        for capacity in ((1, self.depth) if self.depth > 1 else (1,)):
            if self.state is None or not self.state.pending:
                break
            t0 = time.perf_counter()
            self.state.set_capacity(capacity)
            chosen = self.scheduler.select(self.state)
            if self.packer is not None:
                chosen = self.packer.extend(chosen, self.state, self.scheduler)
            self.state.clear_changes()
            self.decision_s += time.perf_counter() - t0
            self.select_calls += 1
            yield from chosen
        if self.state is not None:
            self.state.set_capacity(self.depth)  # completions mark idle workers against the full queue

    # ---- flights ----------------------------------------------------------------------------------------------
    def launch(self, a: Assignment) -> bool:
        """Start `a` on the dispatch state (its units leave the queue); returns whether it queues behind another
        unit of one of its workers. The caller submits it to the backend and records the ticket (`fly`)."""
        state = self.state
        queued = any(state.load(w) for w in a.workers) if len(a.workers) > 1 else state.load(a.workers[0]) > 0
        state.start(a)
        return queued

    def fly(self, ticket: int, flight: Flight) -> None:
        if flight.assignment.plural:
            flight.group = self.group_base + ticket
        self.flights[ticket] = flight
        for w in flight.workers:
            self._queues.setdefault(w, []).append(ticket)

    def land(self, ticket: int, now: float) -> Flight | None:
        """The unit of `ticket` ended (done, failed in user code, or its state could not be fetched): its flight
        leaves, and the next unit queued on its workers starts now (its hang clock starts here). None: no such
        flight (its worker was declared lost meanwhile, and the unit re-queued)."""
        f = self.flights.pop(ticket, None)
        if f is None:
            return None
        self._dequeue(ticket, f, now)
        return f

    def ground(self, worker: int, now: float) -> list[tuple[int, Flight]]:
        """Every flight of a worker that is gone, in submission order; none of them will land. The gang partners'
        next queued units start now."""
        out = self.flights_of(worker)
        for ticket, f in out:
            del self.flights[ticket]
            self._dequeue(ticket, f, now, gone=worker)
        return out

    def _dequeue(self, ticket: int, f: Flight, now: float, gone: int | None = None) -> None:
        """`ticket` leaves its workers' queues; the next unit queued on each (but worker `gone`) starts now."""
        for w in f.workers:
            queue = self._queues.get(w)
            if queue is None or ticket not in queue:
                continue
            queue.remove(ticket)
            if not queue:
                del self._queues[w]
                continue
            if w == gone:
                continue
            g = self.flights[queue[0]]
            if g.queued and all(self._queues[v][0] == queue[0] for v in g.workers if v in self._queues):
                g.started, g.queued = now, False  # a gang's unit starts once it heads every one of its queues

    def flights_of(self, worker: int) -> list[tuple[int, Flight]]:
        return [(t, self.flights[t]) for t in self._queues.get(worker, ())]

    # ---- what handlers change ------------------------------------------------------------------------------------
    def complete(self, unit: Unit) -> None:
        self.state.complete(unit)

    def requeue(self, unit: Unit) -> None:
        self.state.requeue(unit)

    def reopen(self, unit: Unit) -> None:
        self.state.reopen(unit)

    def drop_config(self, config_id: int) -> None:
        if self.state is not None:
            self.state.drop_config(config_id)

    def add_worker(self, worker: int, partitions: Iterable[int]) -> None:
        if self.state is not None:
            self.state.add_worker(worker, partitions)

    def drain_worker(self, worker: int) -> None:
        if self.state is not None:
            self.state.drain_worker(worker)

    def lose_worker(self, worker: int) -> list[Unit]:
        """A worker is gone: every unit it held goes back to the queue (a gang's with it). Returns them."""
        return self.state.remove_worker(worker) if self.state is not None else []

    def estimate(self, unit: Unit, worker: int) -> float:
        """Measured duration of this config's last unit of this kind on this worker (or the mean over the workers
        it ran on); for a config not measured yet, the mean of the measured configs' (of this kind); else 1."""
        same = self._per_config.get((unit.config_id, unit.kind))
        if not same:
            kind = self._per_kind.get(unit.kind)
            return kind[0] / kind[1] if kind else 1.0
        if worker in same:
            return same[worker]
        return sum(same.values()) / len(same)

    def record(self, unit: Unit, worker: int, seconds: float) -> None:
        """A unit's measured duration (what `estimate` and the hang limit are made of)."""
        self._per_config.setdefault((unit.config_id, unit.kind), {})[worker] = seconds
        if unit.kind == TRAIN:
            self._unit_by_size[(unit.config_id, 1)] = seconds
            if self.state is not None:
                self.state.unit_s[(unit.config_id, 1)] = seconds
        total, n = self._per_kind.get(unit.kind, (0.0, 0))
        self._per_kind[unit.kind] = (total + seconds, n + 1)
        self.longest = max(self.longest, seconds)


    def record_comm(self, a: Assignment, seconds: float) -> None:
        """A gang's step spent `seconds` in its all-reduces: one measurement of `DispatchState.comm_s`, the
        all-reduce seconds of a unit's pass on a ring, from which a gang of k pays `comm_s * 2 (k - 1) / k` per
        1/k of a pass (as `simulators.backend.CostModel.all_reduce_seconds` counts it)."""
        k = len(a.workers)
        if k < 2:
            return
        parts = a.partitions or (a.units[0].partition,) * k  # () : all of them share one partition's pass
        longest = max(1 / parts.count(p) for p in parts)  # the gang's steps: its longest share of a pass
        self._comm = [*self._comm[-31:], seconds / (2 * (k - 1) * longest)]
        if self.state is not None:
            self.state.comm_s = self.comm_estimate()

    def record_gang(self, a: Assignment, seconds: float) -> None:
        """A gang's step took `seconds` for its units: a training step is one measurement of
        `DispatchState.unit_s` (not of its config's units on their own, `estimate`: a gang's members pass in
        lockstep, and may share cores)."""
        if len(a.workers) < 2:
            return
        self.longest = max(self.longest, seconds)
        if a.units[0].kind != TRAIN:
            return
        key = (a.units[0].config_id, len(a.workers))
        self._unit_by_size[key] = seconds / len(a.units)
        if self.state is not None:
            self.state.unit_s[key] = self._unit_by_size[key]

    def comm_estimate(self) -> float | None:
        """The median of the latest gangs' all-reduce measurements (None: no gang has run yet)."""
        if not self._comm:
            return None
        ordered = sorted(self._comm)
        return ordered[len(ordered) // 2]

    def unit_limit(self, unit_timeout_s: float | None, wall_clock: bool = True) -> float | None:
        """How long a unit may run before it is declared hung (None: no limit). Without `unit_timeout_s`, 20x the
        longest unit measured so far (at least 60 s), on a wall clock only: on a simulated one, a long unit is no
        sign of a hang (a simulated hang is an injected fault that its backend reports)."""
        if unit_timeout_s is not None:
            return unit_timeout_s
        if not wall_clock or not self.longest:
            return None
        return max(60.0, 20 * self.longest)

    def overdue(self, now: float, limit: float | None) -> list[Flight]:
        if limit is None:
            return []
        return [f for f in self.flights.values() if not f.queued and now - f.started > limit]

    def poll_timeout(self, now: float, limit: float | None) -> float | None:
        """How long the backend may wait for an event: until the earliest unit deadline (None: no deadline)."""
        if limit is None:
            return None
        started = [f.started for f in self.flights.values() if not f.queued]
        if not started:
            return None
        return max(0.01, min(started) + limit - now)


