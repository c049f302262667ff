"""The Backend contract: what the driver needs from whatever runs the units (Ray actors, this process, a simulation).

The driver (`framework.driver`) never touches Ray, threads or a clock of its own. It asks a `Backend` to start
workers with their partitions and to run units, and it learns everything that happens from `poll()`, which returns
small frozen `Event`s in one vocabulary:

    WorkerJoined      a worker finished loading its partitions and takes units
    WorkerLost        a worker died (or never finished loading); the tickets it held are gone (`started` names
                      those it was running or had finished, as the worker knew them)
    WorkerPreempted   a worker will be taken away after `notice_s` (spot instances, a cluster draining a node)
    UnitStarted       a unit began on its worker (backends that queue several units per worker report it)
    UnitDone          a unit finished; `state` is a handle to the config's new state (None for eval units)
    UnitFailed        the user's code raised in a unit (`report.error` holds the traceback); the worker lives on
    StateLost         the unit could not fetch the config's state (an object lost with its node)
    CommandReceived   a command from outside the loop (add or drain workers, kill one for chaos testing)

A unit is submitted with a *ticket* (an int the backend returns); every unit event names its ticket, so a worker may
hold several queued units (queue depth) and a unit may be given several workers (a gang: `workers` has more than
one id). The backends here run one unit per worker at a time and gangs of one; both limits are the backend's, not
the contract's.

State handles are opaque to the driver: an object ref on Ray, the state dict itself in-process, a token in the
simulation. `put` turns a state into a handle, `get` a handle back into a state (`self_contained=True`: with
anything shared between workers fetched back in, what a checkpoint stores).
"""

from __future__ import annotations

import abc
import queue
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from framework.engine.worker import UnitReport, UnitTask


@dataclass(frozen=True)
class Event:
    """Base class of everything `Backend.poll` reports. `time` is the backend's clock when it happened."""

    time: float


@dataclass(frozen=True)
class WorkerJoined(Event):
    worker: int
    partitions: frozenset[int]
    info: Mapping[str, Any] = field(default_factory=dict)  # e.g. data bytes, extraction statistics


@dataclass(frozen=True)
class WorkerLost(Event):
    """`started`: the tickets of the worker's unreported units that it had started, in the order it ran them, as
    the worker itself knew them: the last one was running when it died (or had just ended, with nothing started
    after it: a worker records starts, not ends); any before it had finished, but their reports died with the
    process, so their results are lost; the worker's other tickets were queued behind and never started. None: the
    backend cannot tell, and the driver goes by what it heard (the first unit it has not heard back about was
    running)."""

    worker: int
    why: str
    loading: bool = False  # it died while loading its partitions (it never joined)
    started: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WorkerPreempted(Event):
    worker: int
    notice_s: float


@dataclass(frozen=True)
class UnitStarted(Event):
    ticket: int
    worker: int


@dataclass(frozen=True)
class UnitDone(Event):
    ticket: int
    worker: int
    report: UnitReport
    state: Any  # handle to the new state (train units), None for eval units


@dataclass(frozen=True)
class UnitFailed(Event):
    ticket: int
    worker: int
    report: UnitReport  # `report.error` holds the user's traceback


@dataclass(frozen=True)
class StateLost(Event):
    ticket: int
    worker: int
    error: BaseException


@dataclass(frozen=True)
class CommandReceived(Event):
    command: str  # "add", "drain" or "kill"
    args: Mapping[str, Any] = field(default_factory=dict)


COMMANDS = ("add", "drain", "kill")


class Backend(abc.ABC):
    """Runs workers and units for the driver and reports what happened as events (see the module docstring).

    Only the driver's thread calls a backend, except `command`, which any thread may call: the command comes back
    from `poll` as a `CommandReceived`, so the loop applies it at a point of its own choosing.
    """

    #: Whether `now()` is wall time. False: a logical or simulated clock, on which a unit's length says nothing of
    #: its health (a simulated unit may last a day), so the driver applies no health check of its own making (an
    #: explicit `unit_timeout_s` still holds) and waits for the next scheduled event instead of a number of seconds.
    wall_clock: bool = True

    def __init__(self) -> None:
        self._commands: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()

    # ---- workers ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def start_worker(self, worker: int, partitions: Iterable[int], fault: str | None = None) -> None:
        """Start (or restart) `worker` and have it load `partitions`; `WorkerJoined` or `WorkerLost(loading=True)`
        follows. `fault`: an injected fault it acts out while loading (`framework.engine.faults.LOAD_ACTIONS`)."""

    @abc.abstractmethod
    def stop_worker(self, worker: int) -> None:
        """Remove `worker` at once (killing what it runs); no event follows."""

    @abc.abstractmethod
    def kill(self, worker: int) -> None:
        """Chaos testing: crash `worker` the hard way; the backend then reports it lost like any other crash."""

    def free_resources(self) -> dict[str, float]:
        """Resources free for one more worker (elastic scale-out); empty when the backend cannot grow."""
        return {}

    # ---- units --------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, workers: Sequence[int], task: UnitTask, state: Any) -> int:
        """Run `task` from the state behind handle `state` (None: a fresh config) on `workers`; returns its ticket."""

    @abc.abstractmethod
    def poll(self, timeout: float | None) -> list[Event]:
        """Events that happened since the last call, waiting up to `timeout` seconds (None: until one happens) for
        the first. Events that happen together come back together, in the order they happened."""

    # ---- states and time ---------------------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, state: dict[str, Any] | None) -> Any:
        """A handle to `state`."""

    @abc.abstractmethod
    def get(self, handle: Any, *, self_contained: bool = False) -> dict[str, Any] | None:
        """The state behind `handle` (`self_contained`: shared pieces fetched in, fit for a checkpoint)."""

    def save(self, handle: Any, path: str, worker: int | None = None) -> Callable[[], tuple[str, int]]:
        """Start writing the state behind `handle` as a self-contained checkpoint file at `path` (atomically);
        returns a function that waits for the write and returns (sha256, bytes), which the checkpoint store's
        threads call. `worker`: the worker that produced the state, which a backend may have write it at once (off
        the driver's data path); by default the waiting function does the writing."""
        from framework.engine.checkpoint import write_atomic

        return lambda: write_atomic(self.get(handle, self_contained=True), path)

    @abc.abstractmethod
    def now(self) -> float:
        """The backend's clock in seconds (wall time, or the simulated clock)."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release every worker and resource."""

    # ---- commands from other threads ---------------------------------------------------------------------------
    def command(self, command: str, **args: Any) -> None:
        """Queue a command for the driver loop (thread-safe): `add` (count, partitions), `drain` (worker) or
        `kill` (worker). It comes back from `poll` as a `CommandReceived`."""
        if command not in COMMANDS:
            raise ValueError(f"`command` is {command!r}, but must be one of {list(COMMANDS)}")
        self._commands.put((command, args))

    def commands_received(self) -> list[Event]:
        """Commands queued so far, as events (non-blocking; `poll` returns them too)."""
        out: list[Event] = []
        while True:
            try:
                command, args = self._commands.get_nowait()
            except queue.Empty:
                return out
            out.append(CommandReceived(self.now(), command, args))
