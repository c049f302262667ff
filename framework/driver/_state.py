"""What every handler of the driver loop reads and changes: the run's state in one object, and its options.

Handlers are functions `handle(run, event)` in their own modules (`units`, `recovery`, `control`, `commit`);
they import this module and never each other's loop, so the loop (`framework.driver.loop`) is the only place
that knows them all.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from automl import Procedure
from framework.driver.configs import ConfigTable
from framework.driver.dispatch import Dispatcher
from framework.driver.workers import WorkerTable
from framework.engine._base import Backend
from framework.engine.faults import FaultPlan


@dataclass(frozen=True)
class DriverOptions:
    """The run's knobs the loop acts on (validated by `ModelSelection`)."""

    seed: int = 0
    metric: str = "valid_loss"
    mode: str = "min"
    scheduler: Any = "randomized"  # a name from framework.scheduling.SCHEDULERS or a Scheduler instance
    unit_timeout_s: float | None = None
    max_unit_retries: int = 0
    max_worker_restarts: int = 3
    max_workers: int | None = None
    worker_resources: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1})
    deterministic: bool = False
    storage_path: str | None = None  # handed to the procedure's `bind`
    holder_wait_s: float = 300.0  # how long units of a partition nobody holds wait for a worker
    num_workers: int | None = None  # the concurrency hint `bind` gets (None: the placement's workers; 0: unknown)
    barrier: bool | None = None  # keep the epoch barrier (None: as the procedure's `synchronous` says)
    reassign_partitions: bool = True  # re-load the partitions of a worker out of restarts onto live workers
    queue_depth: int = 1  # units a worker holds: the one it runs and the next ones queued behind it
    checkpoint: str | float = "epoch"  # when states reach the disk: "unit", "epoch", "off", or every N seconds
    check_metric: bool = False  # the first report of the metric's kind must hold it, or the run stops at once


@dataclass
class RunState:
    backend: Backend
    log: Any  # framework.driver.log.SQLiteRunLog or MemoryRunLog
    procedure: Procedure
    options: DriverOptions
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
    bar: Any = None  # a tqdm progress bar over units, or None
    bar_planned: bool = False  # the bar's total is the run's planned work (else it grows as epochs open)
    leaderboard: Callable[[], None] = lambda: None  # called at every barrier, before the procedure decides
    on_decision: Callable[[Any], None] | None = None  # sees every Decision the procedure returns
    on_unit: Callable[[], None] | None = None  # progress callback, once per completed unit
    write: Callable[[str], None] = lambda line: None  # where one-line notices go (tqdm.write in ModelSelection)
    # the driver process's CPU seconds and completed units per epoch (`account_cpu`): is its cost per unit flat?
    cpu_by_epoch: dict[int, list[float]] = field(default_factory=dict)
    _cpu_mark: float = field(default_factory=time.process_time)
    cpu_units: list[int] = field(default_factory=list)  # epochs of the units done since the last mark
    metric_seen: bool = False  # a report of the metric's kind (train or eval) held the metric
    callbacks: Any = None  # a framework.callbacks.CallbackList, or None

    def event(self, kind: str, **detail: Any) -> None:
        """Log an event (the run's record of what happened) and show it to the fault plan's observer."""
        self.log.add_event(kind, **detail)
        self.faults.observe(kind, detail)

    def run_deferred(self) -> None:
        for fn in self.deferred:
            fn()
        self.deferred.clear()

    def start_cpu_clock(self) -> None:
        """Units are charged for the driver's CPU from now on (start-up is not a unit's cost)."""
        self.cpu_units.clear()
        self._cpu_mark = time.process_time()

    def account_cpu(self) -> None:
        """Share the driver process's CPU time since the last call among the units completed since then."""
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
