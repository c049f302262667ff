"""The Backend contract: what the driver needs from whatever runs the units (Ray actors, this process, a simulation).

The driver (`framework.driver`) never touches Ray, threads or a clock of its own. It asks a `Backend` to start
workers with their partitions and to run units, and it learns everything that happens from `poll()`, which returns
small frozen `Event`s in one vocabulary:

    WorkerJoined      a worker finished loading its partitions and takes units
    WorkerLost        a worker died (or never finished loading); the tickets it held are gone (`started` names
                      those it was running or had finished, as the worker knew them)
    WorkerOffered     a worker can be started (a simulated node returned, or joined for the first time)
    UnitDone          an assignment finished: per member, a report and a handle to its new state (None for eval)
    UnitFailed        the user's code raised (`report.error` holds the traceback); the worker lives on
    StateLost         the unit could not fetch the config's state (an object lost with its node)

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from framework.scheduling.units import UnitReport, UnitTask


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
class WorkerOffered(Event):
    """A worker can be started with `partitions` (a simulated node that returned, or joined for the first time)."""

    worker: int
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class UnitDone(Event):
    """An assignment ran: one report and one state handle per member (one for a unit of its own), in `members`
    order. A state is None for eval units; a member whose report holds an `error` failed in user code (in a pack,
    the others count)."""

    ticket: int
    worker: int
    reports: tuple[UnitReport, ...]
    states: tuple[Any, ...]  # handles to the new states (train units), None for eval units

    @property
    def report(self) -> UnitReport:
        return self.reports[0]

    @property
    def state(self) -> Any:
        return self.states[0]


@dataclass(frozen=True)
class UnitFailed(Event):
    """User code raised in every member of the assignment (`report.error` holds the traceback); the worker lives
    on."""

    ticket: int
    worker: int
    reports: tuple[UnitReport, ...]

    @property
    def report(self) -> UnitReport:
        return self.reports[0]

    @property
    def states(self) -> tuple[Any, ...]:
        return (None,) * len(self.reports)


@dataclass(frozen=True)
class StateLost(Event):
    ticket: int
    worker: int
    error: BaseException


class Backend(abc.ABC):
    """Runs workers and units for the driver and reports what happened as events (see the module docstring).

    Only the driver's thread calls a backend. Commands from outside the loop (add or drain workers) do not pass
    through it: the loop reads them from a `framework.driver.commands.CommandSource`.
    """

    #: Whether `now()` is wall time. False: a logical or simulated clock, on which a unit's length says nothing of
    #: its health (a simulated unit may last a day), so the driver applies no health check of its own making (an
    #: explicit `unit_timeout_s` still holds) and waits for the next scheduled event instead of a number of seconds.
    wall_clock: bool = True

    # ---- workers ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def start_worker(self, worker: int, partitions: Iterable[int], fault: Any = None) -> None:
        """Start (or restart) `worker` and have it load `partitions`; `WorkerJoined` or `WorkerLost(loading=True)`
        follows. `fault`: an injected fault it acts out while loading (a `framework.engine.faults.Fault` of a kind
        carried out on a load; None: none)."""

    @abc.abstractmethod
    def stop_worker(self, worker: int) -> None:
        """Remove `worker` at once (killing what it runs); no event follows."""

    @abc.abstractmethod
    def kill(self, worker: int) -> None:
        """Chaos testing: crash `worker` the hard way; the backend then reports it lost like any other crash."""

    def free_resources(self) -> dict[str, float]:
        """Resources free for one more worker (elastic scale-out); empty when the backend cannot grow."""
        return {}

    def stop_asked(self) -> str | None:
        """Why the run's session should end now, as when its time budget is spent (what runs finishes, nothing new
        starts, the run resumes later): e.g. the local service the run is attached to is going down. None: go on.
        Asked at every turn of the driver loop: it must not wait."""
        return None

    # ---- units --------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, workers: Sequence[int], task: UnitTask, states: Sequence[Any]) -> int:
        """Run `task` on `workers` (a gang when more than one) from the states behind `states`, one handle per
        member of `task.members` (None: a fresh config); returns its ticket. A backend that cannot run a gang or a
        pack raises `NotImplementedError` naming what it was given."""

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

    @abc.abstractmethod
    def save(self, handle: Any, path: str, worker: int | None = None) -> Callable[[], tuple[str, int]]:
        """Start writing the state behind `handle` as a self-contained checkpoint file at `path` (atomically);
        returns a function that waits for the write and returns (sha256, bytes), which the checkpoint store's
        threads call. `worker`: the worker that produced the state, which a backend may have write it at once (off
        the driver's data path). A backend without such a path returns `framework.store.checkpoint.write_later`,
        whose waiting function does the writing (this contract imports no implementation, so it has no default)."""

    @abc.abstractmethod
    def now(self) -> float:
        """The backend's clock in seconds (wall time, or the simulated clock)."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release every worker and resource."""
