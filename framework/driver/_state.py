"""What every handler of the driver loop reads and changes: the run's state in one object (its options are
`framework.options.RunOptions`).

Handlers are functions `handle(run, event)` in their own modules (`units`, `recovery`, `control`, `commit`);
they import this module and never each other's loop, so the loop (`framework.driver.loop`) is the only place
that knows them all.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from automl import Procedure
from framework.callbacks import CallbackList
from framework.driver.configs import ConfigTable
from framework.driver.dispatch import Dispatcher
from framework.driver.workers import WorkerTable
from framework.engine._base import Backend
from framework.engine.faults import FaultPlan
from framework.options import RunOptions


@dataclass
class RunState:
    backend: Backend
    log: Any  # framework.driver.log.SQLiteRunLog or MemoryRunLog
    procedure: Procedure
    options: RunOptions
    faults: FaultPlan
    workers: WorkerTable
    configs: ConfigTable = field(default_factory=ConfigTable)
    dispatch: Dispatcher | None = None
    round: int = 0  # the round in progress: commits so far (a barrier run commits once per round)
    synchronous: bool = True  # epoch barrier: every config's epoch ends before the procedure decides
    ended: list[int] = field(default_factory=list)  # configs whose epoch ended since the last decision, in order
    deferred: list[Callable[[], None]] = field(default_factory=list)
    live_workers: int | None = None  # what the procedure was last told
    round_open: bool = False  # a barrier round is open (its units are dispatched or done)
    paused: bool = False  # a person paused the run: nothing new is dispatched until `unpause`
    # a person stopped a config since the procedure last decided: its slot was freed without an epoch's end, so an
    # asynchronous run asks the procedure again before it ends (`commit.refill`)
    stops_untold: bool = False
    # the driver process's CPU seconds and completed units per epoch (`account_cpu`): is its cost per unit flat?
    cpu_by_epoch: dict[int, list[float]] = field(default_factory=dict)
    _cpu_mark: float = field(default_factory=time.process_time)
    cpu_units: list[int] = field(default_factory=list)  # epochs of the units done since the last mark
    metric_seen: bool = False  # a report of the metric's kind (train or eval) held the metric
    # the one observer channel: progress bar, leaderboard, trackers, the mirror, the fault plan's observer
    observers: CallbackList = field(default_factory=CallbackList)

    def event(self, kind: str, **detail: Any) -> None:
        """Log an event (the run's record of what happened) and show it to the observers."""
        self.log.add_event(kind, **detail)
        self.observers.call("on_event", kind, detail)

    def write(self, line: str) -> None:
        """A one-line notice for a person watching (the observers' `on_notice`)."""
        self.observers.call("on_notice", line)

    def run_deferred(self) -> None:
        for fn in self.deferred:
            fn()
        self.deferred.clear()

    def start_cpu_clock(self) -> None:
        """Units are charged for the driver's CPU from now on (start-up is not a unit's cost)."""
        self.cpu_units.clear()
        self._cpu_mark = time.process_time()

    def account_cpu(self, at_least: int = 1) -> None:
        """Share the driver process's CPU time since the last call among the units completed since then (once at
        least `at_least` units completed: the clock itself costs a system call)."""
        if len(self.cpu_units) < at_least:
            return
        now = time.process_time()
        if self.cpu_units:
            share = (now - self._cpu_mark) / len(self.cpu_units)
            for e in self.cpu_units:
                acc = self.cpu_by_epoch.setdefault(e, [0.0, 0])
                acc[0] += share
                acc[1] += 1
            self.cpu_units.clear()
            self._cpu_mark = now

    def crash(self) -> None:
        """An injected driver crash: every queued checkpoint reaches the disk, then the process dies unannounced."""
        self.log.flush()
        os.kill(os.getpid(), signal.SIGKILL)
