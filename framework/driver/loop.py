"""The driver loop: one loop for the engine, the simulator, replay and offline runs.

    start the workers; ask the procedure for its first decision; open the first units
    while a config is active or a unit is in flight:
        settle: close the epochs that ended, ask the procedure, commit, open the next units
        dispatch: the scheduler picks units for idle workers; submit them to the backend (none while paused)
        commands: apply what the command source holds (add or drain workers, pause, ...)
        for event in backend.poll(): handle(event)

What runs the units is a `framework.engine._base.Backend` (`RayBackend`, `LocalBackend`, or the simulator's
`SimulatedBackend`); what records them is a run log (`framework.driver.log`). Handlers live in their own modules
(`units`, `recovery`, `control`, `commit`); this module only maps events to them. No other thread touches the
backend: commands from outside the loop come from a `framework.driver.commands.CommandSource`, read between events
(a wall-clock backend is polled in slices of `COMMAND_WAIT_S`, so a command waits at most that long).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from automl import ACTIVE, FAILED, Procedure
from framework.callbacks import Callback
from framework.driver import commands, commit, control, recovery, stopping, units
from framework.driver._state import RunState
from framework.driver.commands import CommandSource, QueueCommands
from framework.driver.dispatch import Dispatcher
from framework.driver.workers import WorkerTable
from framework.engine._base import Backend, StateLost, UnitDone, UnitFailed, WorkerJoined, WorkerLost, WorkerOffered
from framework.engine.faults import FaultPlan
from framework.options import RunOptions
from framework.scheduling import SeededOrderScheduler, Unit
from framework.scheduling.packing import Packer

HANDLERS = {
    UnitDone: units.on_unit_ended,
    UnitFailed: units.on_unit_ended,
    StateLost: recovery.on_state_lost,
    WorkerJoined: control.on_joined,
    WorkerLost: recovery.on_worker_lost,
    WorkerOffered: control.on_offered,
}

#: the longest a wall-clock backend is polled before the loop looks at its command source again
COMMAND_WAIT_S = 0.25


#: new objects between two collections of the cyclic GC while a simulation's driver runs (`_old_objects_frozen`)
YOUNG_OBJECTS = 20_000


@contextlib.contextmanager
def _old_objects_frozen(active: bool):
    """Yields `freeze`, which moves every object alive now out of the cyclic GC's sight (`gc.freeze`) while the
    block runs; they all return at its end (`gc.unfreeze`). A simulation's driver makes and keeps hundreds of
    thousands of small objects (units, reports, log rows), and Python's collector scans the kept ones again and
    again: a third of a 500,000-unit simulation's time. The loop freezes after each decision, so collections look
    only at what is newer, and a collection waits for `YOUNG_OBJECTS` new objects (Python's default: 700), so most
    short-lived ones are gone by then. Refcounting still frees frozen objects; only cyclic garbage made before a
    freeze waits for the end. Inactive on a wall clock (units take seconds there, the GC does not show) and in a
    process that froze objects itself (its freeze is not ours to undo)."""
    if not active or gc.get_freeze_count():
        yield lambda: None
        return
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_OBJECTS), *threshold[1:])
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class Driver:
    """Runs a procedure's configs to the end on `backend`, recording into `log`.

    Args:
        backend: what runs the units.
        procedure: the model-selection procedure (asked at every barrier, or at every epoch end when it is not
            `synchronous`).
        log: a `framework.driver.log.SQLiteRunLog` (a run directory) or `MemoryRunLog`.
        placement: worker -> partitions it loads at the start.
        partitions: every partition id (each config trains on all of them per epoch, then evaluates).
        eval_partitions: what each config evaluates on per epoch (default: `partitions`; may be empty).
        estimate: `estimate(unit, worker) -> seconds` the policies see (default: the durations measured so far).
        options: the run's knobs (`framework.options.RunOptions`).
        faults: faults to inject and an observer of events.
        commands: where commands from outside the loop come from (default: an in-process `QueueCommands`).
        observers: `framework.Callback`s that watch the run (after the fault plan's observer, in this order).
        pack_key: a config's pack key under `options.pack` (`framework.scheduling.packing`; None: never packs).
        pack_epochs: whether configs at different epochs may share a pack (the step takes no `epoch`).
    """

    def __init__(
        self,
        backend: Backend,
        procedure: Procedure,
        log: Any,
        placement: Mapping[int, list[int]],
        partitions: list[int],
        options: RunOptions | None = None,
        faults: FaultPlan | None = None,
        eval_partitions: list[int] | None = None,
        estimate: Callable[[Unit, int], float] | None = None,
        commands: CommandSource | None = None,
        observers: Sequence[Callback] = (),
        pack_key: Callable[[Mapping[str, Any]], Hashable | None] | None = None,
        pack_epochs: bool = False,
    ) -> None:
        options = options or RunOptions()
        self.commands = commands if commands is not None else QueueCommands()
        self.placement = {w: list(ps) for w, ps in placement.items()}
        scheduler = SeededOrderScheduler(options.seed) if options.deterministic else options.scheduler
        synchronous = options.barrier if options.barrier is not None else getattr(procedure, "synchronous", True)
        synchronous = synchronous or options.deterministic
        faults = faults or FaultPlan()
        self.run_state = run = RunState(
            backend=backend, log=log, procedure=procedure, options=options, faults=faults,
            workers=WorkerTable(partitions, eval_partitions),
            dispatch=Dispatcher(scheduler, options.seed, estimate, options.queue_depth, self._packer(options, pack_key, pack_epochs)),
            round=-1,
            synchronous=synchronous,
            stop_rules=stopping.RunStopping(options.stop, options.time_budget_s),
        )
        if faults.on_event is not None:
            run.observers.add(_PlanObserver(faults), propagate=True)
        for observer in observers:
            run.observers.add(observer)

    def _packer(self, options: RunOptions, pack_key: Callable | None, pack_epochs: bool) -> Packer | None:
        """What grows assignments into packs under `options.pack` (None at 1); a config's key is `pack_key(config)`
        (default: its batch size; the worker checks the rest, and a pack that cannot fuse trains one by one)."""
        if options.pack == 1:
            return None
        key = pack_key or (lambda config: config.get("batch_size"))
        return Packer(options.pack, lambda cid: key(self.run_state.configs[cid].config), mix_epochs=pack_epochs)

    # ---- the loop -----------------------------------------------------------------------------------------------
    def start_workers(self) -> None:
        """Start every worker of the placement and wait until each has joined (or failed for good)."""
        run = self.run_state
        for w, parts in sorted(self.placement.items()):
            control.start_worker(run, w, parts)
        while run.workers.loading:
            for ev in run.backend.poll(None):
                HANDLERS[type(ev)](run, ev)
        if self.placement and not run.workers.holds and run.backend.wall_clock:  # (a simulation's may return)
            raise RuntimeError("no worker could be started; see the run's events for the errors")

    def start(self, resume_from: Any = None) -> None:
        """Start the workers, bind the procedure, and open the first units: after the procedure's first decision,
        or where a run left off. `resume_from`: the catalog of a crashed run, or the `ConfigRecord`s of a run
        held in memory (an offline run restored from a pickle: no first decision, every active config opens its
        next epoch)."""
        run = self.run_state
        if not run.workers.holds:
            self.start_workers()
        bind = run.procedure.bind
        n = len(self.placement) if run.options.num_workers is None else run.options.num_workers
        n = n or None  # None: unknown (no worker yet: a simulation whose workers all join later)
        if n is not None:
            n *= run.config_slots  # (packs: each worker trains several configs at once)
        extra = {"num_workers": n} if "num_workers" in inspect.signature(bind).parameters else {}
        bind(run.options.metric, run.options.mode, run.options.storage_path, **extra)
        run.told_workers(len(self.placement))
        control.count_workers(run)  # fewer may have started
        if isinstance(resume_from, list):
            for c in resume_from:
                run.configs.add(c)
            commit.open_epochs(run, run.configs.active())
        elif resume_from is not None:
            groups = resume_from.units(status=None).group
            run.dispatch.group_base = int(groups.max()) + 1 if groups.notna().any() else 0  # (tickets restart at 0)
            todo = commit.restore(run, resume_from)
            commit.open_epochs(run, run.configs.active(), todo)
        else:
            run.procedure.claim()
            commit.decide(run, [])
            commit.open_epochs(run, run.configs.active())
        if run.configs.active():
            run.open_round()
        else:
            run.close_round()
        self._started = True

    def run(self, resume_from: Any = None, max_commits: int | None = None) -> bool:
        """Run to the end (starting first, see `start`), or until `max_commits` more decisions have committed.
        Returns True when the run has ended."""
        with _old_objects_frozen(not self.run_state.backend.wall_clock) as freeze:
            return self._run(resume_from, max_commits, freeze)

    def _run(self, resume_from: Any, max_commits: int | None, freeze: Callable[[], None]) -> bool:
        run = self.run_state
        if not getattr(self, "_started", False):
            self.start(resume_from)
        stop_at = None if max_commits is None else run.round + max_commits
        run.start_cpu_clock()
        run.stop_rules.start(run.backend.now())
        while True:
            if commit.settle(run):
                freeze()
            if run.dispatch.idle and not run.dispatch.flights and not run.ended:
                if run.stops_untold and not run.synchronous and commit.refill(run):
                    continue  # the procedure started configs where a person's stops had left none
                return self._end()  # nothing open: every config has stopped or failed (an active one has units)
            if stop_at is not None and run.round >= stop_at:
                run.run_deferred()
                run.account_cpu()
                return False
            for command in self.commands.poll():  # commands act before the next dispatch
                commands.apply(run, command)
            stopping.check_budget(run)
            stopping.check_asked(run)
            if run.ending is not None and not run.dispatch.flights and not run.workers.loading:
                stopping.checkpoint_latest(run)  # the time budget is spent and what was in flight has finished
                return self._end()
            for a in run.dispatch.select() if not (run.paused or run.ending) else []:
                units.submit(run, a)
            run.run_deferred()  # log and checkpoint the last completions once their successors are on their way
            if not run.dispatch.flights and not run.workers.loading:
                if run.paused:  # every running unit has finished: wait for `unpause` (or a worker's news)
                    for ev in run.backend.poll(COMMAND_WAIT_S):
                        HANDLERS[type(ev)](run, ev)
                    continue
                if run.dispatch.idle:  # a command stopped what was left to run: the loop's top decides or ends
                    continue
                self._wait_for_holders()
                continue
            limit = run.dispatch.unit_limit(run.options.unit_timeout_s, run.backend.wall_clock)
            timeout = run.dispatch.poll_timeout(run.backend.now(), limit)
            wait = min(timeout, COMMAND_WAIT_S) if timeout is not None else COMMAND_WAIT_S
            events = run.backend.poll(wait if run.backend.wall_clock else timeout)
            if not events:
                if timeout is None and not run.backend.wall_clock:  # nothing is scheduled to happen, ever
                    stuck = sorted(str(f.unit) for f in run.dispatch.flights.values())
                    raise RuntimeError(f"stuck: units {stuck} never report on the simulated clock and no "
                                       "`unit_timeout_s` is set to declare them hung")
                recovery.check_hung(run)
                continue
            for ev in events:
                HANDLERS[type(ev)](run, ev)
            run.account_cpu(at_least=64)

    def _end(self) -> bool:
        """The session ends: the run finished, or its time budget is spent (`RunState.ending`)."""
        run = self.run_state
        run.run_deferred()
        run.account_cpu()
        self.commands.close()
        commit.check_complete(run)
        stopping.session_ended(run)
        return True

    def _wait_for_holders(self) -> None:
        """Nothing runs and nothing loads, yet units wait: their partitions have no live holder."""
        run = self.run_state
        state = run.dispatch.state
        stalled = sorted(state.stalled_partitions()) if state is not None else []
        run.event("waiting_for_holder", partitions=stalled)
        run.write(f"units of partitions {stalled} wait for a worker that holds them (add_workers() to provide one)")
        # wait for an event or a command (an `add_workers` answers the notice); a simulated clock waits for the next
        # scheduled event (a worker that returns, however late), if any
        deadline = run.backend.now() + run.options.holder_wait_s
        while True:
            applied = [commands.apply(run, command) for command in self.commands.poll()]
            if any(applied) and (run.workers.loading or run.dispatch.flights):
                return
            left = deadline - run.backend.now()
            if run.backend.wall_clock and left <= 0:
                events = []
            else:
                events = run.backend.poll(min(left, COMMAND_WAIT_S) if run.backend.wall_clock else None)
            if events:
                for ev in events:
                    HANDLERS[type(ev)](run, ev)
                return
            if not run.backend.wall_clock or left <= 0:
                break
        within = f"joined within {run.options.holder_wait_s:g} s" if run.backend.wall_clock else "is scheduled to join"
        raise RuntimeError(
            f"stalled: no worker holds partitions {stalled} and none {within} "
            f"(at t={run.backend.now():g}; {len(state.pending) if state else 0} units pending)")

    # ---- what the caller reads ----------------------------------------------------------------------------------
    @property
    def rounds_completed(self) -> int:
        return max(0, self.run_state.round)

    def live_workers(self) -> list[int]:
        for _ in range(10):  # read from another thread while the loop changes it: try again
            try:
                return sorted(self.run_state.workers.holds)
            except RuntimeError:
                continue
        return []

    def leaderboard_line(self, seconds: float) -> str:
        run = self.run_state
        metric, mode = run.options.metric, run.options.mode
        scored = [(c.history[-1].get(metric), c.id) for c in run.configs if c.history and c.status != FAILED]
        scored = [(v, cid) for v, cid in scored if v is not None]
        active, failed = run.configs.count(ACTIVE), run.configs.count(FAILED)
        round_ = run.round
        if not scored:
            return f"round {round_}: {seconds:.1f}s, no {metric} reported yet ({failed} failed)"
        v, cid = (min if mode == "min" else max)(scored)
        return (f"round {round_}: {seconds:.1f}s | best config {cid} {metric}={v:.4f} | "
                f"{active} active, {failed} failed, {len(run.configs)} total")


class _PlanObserver(Callback):
    """The fault plan's `on_event`, first on the run's observer channel."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan

    def on_event(self, kind: str, detail: dict[str, Any]) -> None:
        self.plan.observe(kind, detail)
