"""`ClockBackend`: a backend on a logical clock, in this process, with no Ray, no threads and no torch.

Units run one at a time when the driver polls, in the order they were submitted, so a run is a deterministic
function of its inputs. A unit submitted to a worker that still holds units starts when the last of them ends (a
worker's queue, as on Ray). The clock is logical: it advances by each unit's duration (whatever the subclass says
running it took) and by the poll timeout when nothing is left to run, so the driver's health check finds a hung unit
at once instead of after a real timeout. What happens next sits on an event heap keyed by `(time, seq)`, so events
at the same time come back together, in the order they were scheduled.

What a worker is, and what loading partitions and running a unit mean, are the subclass's: `LocalBackend`
(`framework.engine.local`) runs real `Worker`s, `simulators.backend.SimulatedBackend` only advances the clock.
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from framework.engine._base import Backend, Event, WorkerLost
from framework.engine.faults import Fault
from framework.scheduling.units import UnitTask
from framework.store.checkpoint import write_later


class ClockBackend(Backend):
    """Workers in this process on a logical clock (see the module docstring).

    A unit submitted at time t on the logical clock ends at t + the seconds `_execute` says it took, and `poll`
    returns the events with the earliest time, all of them when several happen at once. A unit's `_execute` runs as
    soon as the driver polls after submitting it, so units on different workers overlap on the logical clock exactly
    as they would on real workers. Events a subclass returns carry time 0.0 and are stamped with their time here;
    events it schedules itself (`_at`) carry their own.
    """

    wall_clock = False

    def __init__(self) -> None:
        super().__init__()
        self.workers: dict[int, Any] = {}
        self._todo: deque[tuple[float, str, tuple]] = deque()  # (submit time, "load" | "unit", args), in order
        self._heap: list[tuple[float, int, Event]] = []  # (time, seq, event): what happens next
        self._seq = itertools.count()
        self._tickets = itertools.count()
        self._clock = 0.0
        self._free_at: dict[int, float] = {}  # worker -> when the last unit it holds ends (its queue)

    # ---- what a subclass says a worker is and does ----------------------------------------------------------------
    @abc.abstractmethod
    def _new_worker(self, worker: int) -> Any:
        """The object kept in `self.workers[worker]` when `worker` starts."""

    @abc.abstractmethod
    def _load(self, worker: int, parts: frozenset[int], fault: Fault | None) -> tuple[float, Event]:
        """Load `parts` on `worker`: (seconds it took, the event). A worker that dies is removed from `workers`."""

    @abc.abstractmethod
    def _execute(self, workers: tuple[int, ...], ticket: int, task: UnitTask, state: Any) -> tuple[float, Event] | None:
        """Run one unit on `workers` from `state` (a tuple of member states for a pack): (seconds it took, the
        event), or None when it never reports (hung). A worker that dies is removed from `workers`."""

    # ---- the contract ---------------------------------------------------------------------------------------------
    def start_worker(self, worker: int, partitions: Iterable[int], fault: Fault | None = None) -> None:
        if worker not in self.workers:
            self.workers[worker] = self._new_worker(worker)
        self._free_at.pop(worker, None)
        self._todo.append((self._clock, "load", (worker, frozenset(partitions), fault)))

    def stop_worker(self, worker: int) -> None:
        self.workers.pop(worker, None)
        self._free_at.pop(worker, None)
        self._todo = deque(item for item in self._todo if worker not in _workers_of(item))
        kept = [item for item in self._heap  # its units' outcomes go; scheduled worker events stay
                if not (hasattr(item[2], "ticket") and item[2].worker == worker)]
        if len(kept) != len(self._heap):
            self._heap = kept
            heapq.heapify(self._heap)

    def kill(self, worker: int) -> None:
        if worker in self.workers:
            self.stop_worker(worker)
            self._at(self._clock, WorkerLost(self._clock, worker, "killed"))

    def submit(self, workers: Sequence[int], task: UnitTask, states: Sequence[Any]) -> int:
        return self._enqueue(tuple(workers), task, tuple(states))

    def _enqueue(self, workers: tuple[int, ...], task: UnitTask, states: tuple[Any, ...]) -> int:
        ticket = next(self._tickets)
        self._todo.append((self._clock, "unit", (workers, ticket, task, states[0] if len(states) == 1 else states)))
        return ticket

    def _at(self, t: float, event: Event) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), event))

    def poll(self, timeout: float | None) -> list[Event]:
        events: list[Event] = []
        live, free_at = self.workers, self._free_at
        while self._todo:
            t0, what, args = self._todo.popleft()
            if what == "unit":  # it starts when the units ahead of it in its workers' queues have ended
                workers = args[0]
                if len(workers) == 1:
                    if workers[0] not in live:  # stopped or lost meanwhile
                        continue
                    t0 = max(t0, free_at.get(workers[0], t0))
                elif any(w not in live for w in workers):
                    continue
                else:
                    t0 = max(t0, *(free_at.get(w, t0) for w in workers))
                if t0 == _NEVER:
                    continue  # behind a hung unit: it never starts
                out = self._execute(*args)
                for w in workers:
                    free_at[w] = _NEVER if out is None else t0 + out[0]
            else:
                if args[0] not in live:
                    continue
                out = self._load(*args)
            if out is not None:
                seconds, event = out
                for report in getattr(event, "reports", ()):  # the unit's times on the logical clock
                    report.start, report.end = t0, t0 + seconds
                self._at(t0 + seconds, event)
        if not self._heap or (timeout is not None and self._heap[0][0] > self._clock + timeout):
            self._clock += timeout or 0.0  # nothing happens before the timeout (a hung unit's deadline comes)
            return []
        t = self._heap[0][0]
        self._clock = max(self._clock, t)
        while self._heap and self._heap[0][0] <= t:
            event = heapq.heappop(self._heap)[2]
            if event.time != t:  # the backend's own fresh event: stamped in place (cheaper than a copy)
                object.__setattr__(event, "time", t)
            events.append(event)
        return events

    def put(self, state: dict[str, Any] | None) -> Any:
        return state

    def get(self, handle: Any, *, self_contained: bool = False) -> dict[str, Any] | None:
        """Handles are the states themselves."""
        return handle

    def save(self, handle: Any, path: str, worker: int | None = None) -> Callable[[], tuple[str, int]]:
        return write_later(lambda: self.get(handle, self_contained=True), path)

    def now(self) -> float:
        return self._clock


_NEVER = float("inf")


def _workers_of(item: tuple[float, str, tuple]) -> tuple[int, ...]:
    """The workers a queued load or unit runs on."""
    _, what, args = item
    return args[0] if what == "unit" else (args[0],)
