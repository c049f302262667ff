"""`LocalBackend`: every worker is a plain `Worker` in this process; no Ray, no threads.

It is a `framework.engine.clock.ClockBackend` (the logical clock, the workers' queues, the event heap) whose
workers run the user's code for real: a unit runs when the driver polls, on the logical clock it takes its measured
duration (or `unit_time` when given). Injected faults are acted out without harming this process: a killed worker is
reported lost, a hung unit never reports, a lost state raises `StateLost`, a slow unit takes its extra seconds on
the logical clock.

`framework.replay` runs on it, and the driver's unit tests exercise every recovery path on it in milliseconds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from framework.engine._base import Event, StateLost, UnitDone, UnitFailed, WorkerJoined, WorkerLost
from framework.engine.clock import ClockBackend
from framework.engine.faults import DIE, HANG, STRETCH, Fault
from framework.engine.state import self_contained as _self_contained
from framework.engine.state import unpack_state
from framework.engine.worker import Worker
from framework.functions import UserFunctions
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitTask


class _Killed(BaseException):
    """An injected fault whose effect is `DIE` (`kill_worker`, `kill_loading`): the worker is gone (a BaseException,
    so user code cannot catch it)."""


class _Hung(BaseException):
    """An injected fault whose effect is `HANG`: the unit never reports."""


class _LocalWorker(Worker):
    """A `Worker` whose injected crashes and hangs are exceptions instead of acts on the process, and whose slow units
    take their extra seconds on the logical clock (`LocalBackend._execute`), not in real time."""

    LOST_STATE_ERRORS = (LookupError,)

    def act_out(self, fault: Fault, unit: Unit | None) -> None:
        effect = fault.spec.effect
        if effect == DIE:
            raise _Killed(fault.action)
        if effect == HANG:
            raise _Hung(fault.action)
        if effect == STRETCH:
            return
        super().act_out(fault, unit)


class LocalBackend(ClockBackend):
    """Workers as objects in this process (see the module docstring).

    Time is logical (`ClockBackend`): a unit submitted at time t ends at t + its duration (measured, or
    `unit_time(unit, worker)`). The user code of a unit runs as soon as the driver polls after submitting it.

    Args:
        functions: what the workers run (`framework.functions.UserFunctions`).
        entries: partition -> (train entries, valid entries).
        num_threads: torch threads per worker (None: leave torch's setting alone).
        device: where models run ("cpu" or "cuda").
        unit_time: `unit_time(unit, worker) -> seconds` on the logical clock (default: the measured duration).
        worker_options: the other `Worker` keyword arguments (`freezing`, `data_on_device`, `cache_dir`).
    """

    def __init__(
        self,
        functions: UserFunctions | None = None,
        entries: Mapping[int, tuple[Sequence[Any], Sequence[Any]]] | None = None,
        num_threads: int | None = None,
        device: str = "cpu",
        unit_time: Callable[[Unit, int], float] | None = None,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.functions, self.worker_options, self.entries = functions, dict(worker_options or {}), dict(entries or {})
        self.num_threads, self.device, self.unit_time = num_threads, device, unit_time

    def _new_worker(self, worker: int) -> Any:
        if self.functions is None:
            raise ValueError("this LocalBackend was made without `functions`, so it cannot start a worker")
        return _LocalWorker(worker, self.functions, device=self.device, num_threads=self.num_threads,
                            **self.worker_options)

    def _load(self, worker: int, parts: frozenset[int], fault: Fault | None) -> tuple[float, Event]:
        try:
            self.workers[worker].load({p: self.entries[p] for p in parts}, fault)
        except _Killed:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died while loading", loading=True)
        return 0.0, WorkerJoined(0.0, worker, parts, self.workers[worker].data_info())

    def submit(self, workers: Sequence[int], task: UnitTask, states: Sequence[Any]) -> int:
        """A unit of its own, or a pack (its members run one after another, `Worker.run_members`); not a gang, whose
        members are processes that average gradients (`RayBackend`)."""
        if len(workers) != 1:
            raise NotImplementedError(f"{type(self).__name__} runs workers in one process, so not a gang of workers "
                                      f"{tuple(workers)}: RayBackend runs gangs")
        return super().submit(workers, task, states)

    def _execute(self, workers: tuple[int, ...], ticket: int, task: UnitTask, state: Any) -> tuple[float, Event] | None:
        worker = workers[0]
        states = state if len(task.members) > 1 else (state,)
        try:
            new_states, reports = self.workers[worker].run_members(task, copy.deepcopy(states))
        except _Killed:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died (injected kill)", started=(ticket,))
        except _Hung:
            return None
        except LookupError as e:
            return 0.0, StateLost(0.0, ticket, worker, e)
        duration = (sum(self.unit_time(r.unit, worker) for r in reports) if self.unit_time
                    else reports[-1].end - reports[0].start)
        duration += sum(f.seconds for f in (task.faults or (task.fault,)) if f is not None and f.spec.effect == STRETCH)
        if all(r.error is not None for r in reports):
            return duration, UnitFailed(0.0, ticket, worker, reports)
        return duration, UnitDone(0.0, ticket, worker, reports,
                                  new_states if task.unit.kind == TRAIN else (None,) * len(reports))

    def get(self, handle: Any, *, self_contained: bool = False) -> dict[str, Any] | None:
        state = unpack_state(handle)
        return _self_contained(state) if self_contained else state
