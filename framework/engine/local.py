"""`LocalBackend`: every worker is a plain `Worker` in this process; no Ray, no threads.

Units run one at a time when the driver polls, in the order they were submitted, so a run is a deterministic
function of its inputs. A unit submitted to a worker that still holds units starts when the last of them ends (a
worker's queue, as on Ray). The clock is logical: it advances by each unit's measured duration (or by `unit_time`
when given) and by the poll timeout when nothing is left to run, so the driver's health check finds a hung unit
at once instead of after a real timeout. Injected faults are acted out without harming this process: a killed
worker is reported lost, a hung unit never reports, a lost state raises `StateLost`.

`framework.replay` runs on it, and the driver's unit tests exercise every recovery path on it in milliseconds.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from framework.engine._base import (
    Backend,
    Event,
    StateLost,
    UnitDone,
    UnitFailed,
    WorkerJoined,
    WorkerLost,
    refuse_plural,
)
from framework.engine.worker import Worker, unpack_state
from framework.engine.worker import self_contained as _self_contained
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitTask


class _Killed(BaseException):
    """An injected `kill_worker` / `kill_loading`: the worker is gone (a BaseException, so user code cannot catch
    it)."""


class _Hung(BaseException):
    """An injected `hang`: the unit never reports."""


class _LocalWorker(Worker):
    """A `Worker` whose injected crashes and hangs are exceptions instead of acts on the process."""

    LOST_STATE_ERRORS = (LookupError,)

    def _act_out(self, fault: str, unit: Unit | None) -> None:
        if fault in ("kill_worker", "kill_loading"):
            raise _Killed(fault)
        if fault == "hang":
            raise _Hung(fault)
        super()._act_out(fault, unit)


class LocalBackend(Backend):
    """Workers as objects in this process (see the module docstring).

    Time is simulated: a unit submitted at time t on the logical clock ends at t + its duration (measured, or
    `unit_time(unit, worker)`), and `poll` returns the events with the earliest time, all of them when several
    happen at once. The user code of a unit runs as soon as the driver polls after submitting it, so units on
    different workers overlap on the logical clock exactly as they would on real workers.

    Args:
        fns: the `Worker` keyword arguments (`model_fn`, `train_fn`, `eval_fn`, `input_fn`, `freezing`, `extract`).
        entries: partition -> (train entries, valid entries).
        num_threads: torch threads per worker (None: leave torch's setting alone).
        device: where models run ("cpu" or "cuda").
        unit_time: `unit_time(unit, worker) -> seconds` on the logical clock (default: the measured duration).
    """

    wall_clock = False

    def __init__(
        self,
        fns: Mapping[str, Any] | None = None,
        entries: Mapping[int, tuple[Sequence[Any], Sequence[Any]]] | None = None,
        num_threads: int | None = None,
        device: str = "cpu",
        unit_time: Callable[[Unit, int], float] | None = None,
    ) -> None:
        super().__init__()
        self.fns, self.entries = dict(fns or {}), dict(entries or {})
        self.num_threads, self.device, self.unit_time = num_threads, device, unit_time
        self.workers: dict[int, Any] = {}
        self._todo: deque[tuple[float, str, tuple]] = deque()  # (submit time, "load" | "unit", args), in order
        self._heap: list[tuple[float, int, Event]] = []  # (time, seq, event): what happens next
        self._seq = itertools.count()
        self._tickets = itertools.count()
        self._clock = 0.0
        self._free_at: dict[int, float] = {}  # worker -> when the last unit it holds ends (its queue)

    # ---- what a subclass changes to simulate instead of run -----------------------------------------------------
    def _new_worker(self, worker: int) -> Any:
        return _LocalWorker(worker, device=self.device, num_threads=self.num_threads, **self.fns)

    def _load(self, worker: int, parts: frozenset[int], fault: str | None) -> tuple[float, Event]:
        """Load `parts` on `worker`: (seconds it took, the event)."""
        try:
            self.workers[worker].load({p: self.entries[p] for p in parts}, fault)
        except _Killed:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died while loading", loading=True)
        return 0.0, WorkerJoined(0.0, worker, parts, {"data_bytes": self.workers[worker].data_nbytes()})

    def _execute(self, workers: tuple[int, ...], ticket: int, task: UnitTask, state: Any) -> tuple[float, Event] | None:
        """Run one unit on `workers` from `state` (a tuple of member states for a pack): (seconds it took, the
        event), or None when it never reports (hung)."""
        worker = workers[0]
        try:
            new_state, report = self.workers[worker].run(task, copy.deepcopy(state))
        except _Killed:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died (injected kill)", started=(ticket,))
        except _Hung:
            return None
        except LookupError as e:
            return 0.0, StateLost(0.0, ticket, worker, e)
        duration = self.unit_time(task.unit, worker) if self.unit_time else report.end - report.start
        if report.error is not None:
            return duration, UnitFailed(0.0, ticket, worker, (report,))
        return duration, UnitDone(0.0, ticket, worker, (report,), (new_state if task.unit.kind == TRAIN else None,))

    # ---- the contract ---------------------------------------------------------------------------------------------
    def start_worker(self, worker: int, partitions: Iterable[int], fault: str | None = None) -> None:
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
        refuse_plural(self, workers, task)
        return self._enqueue(tuple(workers), task, tuple(states))

    def _enqueue(self, workers: tuple[int, ...], task: UnitTask, states: tuple[Any, ...]) -> int:
        ticket = next(self._tickets)
        self._todo.append((self._clock, "unit", (workers, ticket, task, states[0] if len(states) == 1 else states)))
        return ticket

    def _at(self, t: float, event: Event) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), event))

    def poll(self, timeout: float | None) -> list[Event]:
        events: list[Event] = []
        while self._todo:
            t0, what, args = self._todo.popleft()
            workers = _workers_of((t0, what, args))
            if any(w not in self.workers for w in workers):  # stopped or lost meanwhile
                continue
            if what == "unit":  # it starts when the units ahead of it in its workers' queues have ended
                t0 = max(t0, *(self._free_at.get(w, t0) for w in workers))
                if t0 == float("inf"):
                    continue  # behind a hung unit: it never starts
                out = self._execute(*args)
                for w in workers:
                    self._free_at[w] = float("inf") if out is None else t0 + out[0]
            else:
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
        state = unpack_state(handle)
        return _self_contained(state) if self_contained else state

    def now(self) -> float:
        return self._clock


def _workers_of(item: tuple[float, str, tuple]) -> tuple[int, ...]:
    """The workers a queued load or unit runs on."""
    _, what, args = item
    return args[0] if what == "unit" else (args[0],)
