"""What every handler of the driver loop reads and changes: the run's state in one object (its options are
`framework.options.RunOptions`).

Handlers are functions `handle(run, event)` in their own modules (`units`, `recovery`, `control`, `commit`);
they import this module and never each other's loop, so the loop (`framework.driver.loop`) is the only place
that knows them all. They read `RunState`'s fields freely but change them only through its named operations
(`defer`, `mark_ended`, `pause`, `open_round`, ...); its parts (the config table, the dispatcher, the worker table)
change through their own methods (`tests/framework/driver/test_state_owners.py` keeps it so).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from automl import Procedure
from framework.callbacks import CallbackList
from framework.driver._base import RunLog
from framework.driver.configs import ConfigRecord, ConfigTable
from framework.driver.dispatch import Dispatcher
from framework.driver.workers import WorkerTable
from framework.engine._base import Backend
from framework.engine.faults import FaultPlan
from framework.fingerprints import DataChangedError, fingerprint_change, schema_change
from framework.options import RunOptions


@dataclass
class RunState:
    backend: Backend
    log: RunLog  # the contract: framework.driver._base (kept by framework.driver.log's SQLiteRunLog, MemoryRunLog)
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
    # the run's stopper and time budget (`framework.driver.stopping.RunStopping`; None: a driver built without them)
    stop_rules: Any = None
    ending: str | None = None  # why this session ends before the run does (its time budget is spent); None: it runs
    # what each data source read, by "split/partition/entry" (`framework.sources.Source.fingerprint`): recorded at
    # its first load, compared at every later one and on resume and replay (`sources_read`)
    prints: dict[str, dict[str, Any]] = field(default_factory=dict)
    accept_changed_data: bool = False  # a changed source is logged and used, not refused
    # the one observer channel: progress bar, leaderboard, trackers, the mirror, the fault plan's observer (what
    # one of them raises is logged as the run's event)
    observers: CallbackList = field(init=False)

    def __post_init__(self) -> None:
        self.observers = CallbackList(on_error=self.event)

    def event(self, kind: str, **detail: Any) -> None:
        """Log an event (the run's record of what happened) and show it to the observers."""
        self.log.add_event(kind, **detail)
        self.observers.call("on_event", kind, detail)

    def expect_prints(self, recorded: Mapping[str, dict[str, Any]], accept_changed_data: bool = False) -> None:
        """A resumed or replayed run's record of what its sources read (its `source_read` events): later loads
        must read the same, unless `accept_changed_data`."""
        self.prints.update(recorded)
        self.accept_changed_data = accept_changed_data

    def sources_read(self, worker: int, prints: Mapping[str, dict[str, Any]]) -> None:
        """A worker that joined read these sources: each print new to the run is recorded (a `source_read` event),
        its tables' schemas checked against the split's other files; one the run recorded is compared, and a change
        raises `DataChangedError` naming the file, or with `accept_changed_data` is logged and used."""
        for entry, now in prints.items():
            recorded = self.prints.get(entry)
            if recorded is None:
                split = entry.split("/")[0]
                for f in now.get("files", []):
                    other = min((g for e, p in self.prints.items() if e.split("/")[0] == split
                                 for g in p.get("files", []) if g.get("schema") is not None),
                                key=lambda g: g["path"], default=None)
                    if other is not None and f.get("schema") is not None and f["schema"] != other["schema"]:
                        # (named in path order, whichever worker joined first)
                        a, b = sorted((other, f), key=lambda g: g["path"])
                        raise DataChangedError(f"{b['path']}: {schema_change(a['schema'], b['schema'])} against "
                                               f"{a['path']}; every file of the {split} data must have the same "
                                               "columns and types")
                self.prints[entry] = dict(now)
                self.event("source_read", entry=entry, worker=worker, **now)
                continue
            change = fingerprint_change(f"the {entry.split('/')[0]} data of partition {entry.split('/')[1]}",
                                        recorded, now)
            if change is None:
                continue
            if not self.accept_changed_data:
                raise DataChangedError(f"{change}: the run would train on other data than it recorded; put the data "
                                       "back, or pass accept_changed_data=True (modelhopper resume/replay "
                                       "--accept-changed-data) to go on with it knowingly")
            self.event("source_changed_accepted", entry=entry, worker=worker, change=change)
            self.write(f"data changed since the run read it, and accepted: {change}")

    def write(self, line: str) -> None:
        """A one-line notice for a person watching (the observers' `on_notice`)."""
        self.observers.call("on_notice", line)

    def run_deferred(self) -> None:
        for fn in self.deferred:
            fn()
        self.deferred.clear()

    def checkpoint(self, c: ConfigRecord, epoch: int, units: int, handle: Any, worker: int | None) -> None:
        """Queue config `c`'s state behind `handle` (made on `worker`) after `units` training units (in `epoch`)."""
        c.checkpointed_at(units, self.backend.now())
        self.log.checkpoint(c.id, epoch, units, self.backend, handle, worker)

    def checkpoint_final(self, c: ConfigRecord) -> None:
        """A config that stopped keeps its final state on disk, whatever the policy (what `Result.load_model`
        loads)."""
        if c.state is not None and c.checkpointed[0] != c.units:
            self.checkpoint(c, max(c.epoch - 1, 0), c.units, c.state, None)

    # ---- named operations: the only places its fields change ---------------------------------------------------
    def defer(self, *fns: Callable[[], None]) -> None:
        """Call `fns`, in order, at the next `run_deferred` (once the next units are on their way)."""
        self.deferred.extend(fns)

    def mark_ended(self, config_id: int) -> None:
        """The config's epoch ended (or, without a barrier, it failed): the next `settle` decides about it."""
        self.ended.append(config_id)

    def pop_ended(self) -> int:
        """The config that ended first of those not decided about yet (taken off the list)."""
        return self.ended.pop(0)

    def take_ended(self) -> list[int]:
        """Every config that ended since the last decision, in order (the list starts empty again)."""
        ended = list(self.ended)
        self.ended.clear()
        return ended

    def open_round(self) -> None:
        """A round is open: units of it are dispatched (or done); a barrier closes it once none is left."""
        self.round_open = True

    def close_round(self) -> None:
        """The barrier was reached: the round's epochs close and the procedure decides."""
        self.round_open = False

    def round_committed(self) -> None:
        """The round's decision is committed: the next round begins."""
        self.round += 1

    def start_at_round(self, round_: int) -> None:
        """A resumed run goes on at `round_` (the round after the last one it committed)."""
        self.round = round_

    def pause(self) -> None:
        """A person paused the run: nothing new is dispatched until `unpause`."""
        self.paused = True

    def unpause(self) -> None:
        """A person unpaused the run: units are dispatched again."""
        self.paused = False

    def config_stopped_by_person(self) -> None:
        """A person stopped a config: its slot is free, but no epoch ended to tell the procedure so."""
        self.stops_untold = True

    def procedure_asked(self) -> None:
        """The procedure is asked to decide: it sees every stop so far."""
        self.stops_untold = False

    @property
    def config_slots(self) -> int:
        """Configs a worker trains at once: the pack size under packing (`Packer.slots`), else 1. The procedures'
        concurrency hint is the live workers times this."""
        return self.dispatch.packer.slots if self.dispatch.packer is not None else 1

    def told_workers(self, n: int) -> None:
        """The procedure was told that `n` workers live (at `bind`, then at each change)."""
        self.live_workers = n

    def end_session(self, reason: str) -> None:
        """The session ends before the run does (`reason`: its time budget is spent): nothing new is dispatched,
        what is in flight finishes, then the loop returns."""
        self.ending = reason

    def metric_found(self) -> None:
        """A report of the metric's kind held the metric: the check is done."""
        self.metric_seen = True

    def charge_unit(self, epoch: int) -> None:
        """A unit of `epoch` completed: it shares the driver's CPU time at the next `account_cpu`."""
        self.cpu_units.append(epoch)

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
