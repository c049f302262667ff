"""Failure handlers (Cerebro 5.6): a lost or hung worker, a lost state object, a config whose user code failed.

The rules themselves are pure functions in `framework.engine.recovery`; these handlers apply them to the run:
a unit whose worker died or hung goes back to the queue and runs again from the config's last state; the worker
restarts or its partitions are re-loaded elsewhere; a config whose state object is gone is restored from its
newest verified checkpoint and the units the checkpoint lacks run again; a failure in user code counts against its
config only.
"""

from __future__ import annotations

from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord
from framework.driver.control import count_workers, restart_or_reassign
from framework.engine._base import StateLost, WorkerLost
from framework.engine.checkpoint import CorruptCheckpointError
from framework.engine.recovery import units_to_redo
from framework.engine.worker import UnitReport
from framework.scheduling import TRAIN, Unit


def on_worker_lost(run: RunState, ev: WorkerLost) -> None:
    # a worker that dies loading before it ever joined had nothing in flight; a live worker that dies loading a
    # partition it was given (a re-load) is lost with its units like any other
    if ev.loading and ev.worker not in run.workers.holds:
        if ev.worker not in run.workers.loading:
            return
        parts = run.workers.remove(ev.worker)
        run.backend.stop_worker(ev.worker)
        run.event("worker_start_failed", worker=ev.worker, error=ev.why)
        restart_or_reassign(run, ev.worker, parts)
        return
    worker_lost(run, ev.worker, ev.why)


def worker_lost(run: RunState, worker: int, why: str) -> None:
    """Requeue what the worker ran (Q' -> Q), then restart it or re-load its partitions elsewhere."""
    if worker not in run.workers.holds and worker not in run.workers.loading:
        return  # already handled
    now = run.backend.now()
    waiting = set()  # units queued behind the one it ran: they never started
    for ticket, f in run.dispatch.flights_of(worker):
        del run.dispatch.flights[ticket]
        if f.queued:
            waiting.add(f.unit)
        else:
            run.log.add_unit(run.round, UnitReport(f.unit, worker, f.started, now), "interrupted")
    state = run.dispatch.state
    lost = state.remove_worker(worker) if state is not None else []
    held = run.workers.remove(worker)
    run.backend.stop_worker(worker)
    run.event("worker_failed", worker=worker, why=why, requeued=[str(u) for u in lost if u not in waiting],
              unstarted=[str(u) for u in lost if u in waiting])
    count_workers(run)
    run.write(f"worker {worker} {why}; re-queued {len(lost)} unit(s)")
    restart_or_reassign(run, worker, held)


def check_hung(run: RunState) -> None:
    """Declare every unit that ran over the limit hung: its worker is killed and restarted, the unit re-runs."""
    limit = run.dispatch.unit_limit(run.options.unit_timeout_s)
    for f in run.dispatch.overdue(run.backend.now(), limit):
        worker_lost(run, f.worker, f"hung: {f.unit} ran over {limit:.1f}s")


def fail_config(run: RunState, c: ConfigRecord, why: str, event: dict | None = None) -> None:
    """The config fails for good (its other units are dropped); the rest of the run carries on."""
    if run.dispatch.state is not None:
        run.dispatch.state.drop_config(c.id)
    run.configs.fail(c.id)
    run.log.fail_config(c.id, why)
    run.event("config_failed", config_id=c.id, **(event or {"why": why}))
    if event is None:
        run.write(f"config {c.id} failed: {why}")
    if not run.synchronous:
        run.ended.append(c.id)  # the procedure hears of it at once and may fill its slot


def on_state_lost(run: RunState, ev: StateLost) -> None:
    """The config's latest state object is gone: restore it from its newest verified checkpoint."""
    f = run.dispatch.flights.pop(ev.ticket, None)
    if f is None:
        return
    state, c = run.dispatch.state, run.configs[f.unit.config_id]
    run.run_deferred()  # every completed unit is logged and its checkpoint queued before we look at the disk
    run.log.flush()
    state.requeue(f.unit)
    try:
        ckpt, _, units = run.log.load_latest(c.id)
    except CorruptCheckpointError as e:
        ckpt, units = None, 0
        if c.units:
            fail_config(run, c, f"its state was lost ({ev.error!r}) and no checkpoint is usable: {e}")
            return
    behind = c.units - units
    visited = {e: list(ps) for e, ps in (ckpt or {}).get("visited", {}).items()}
    epoch = f.unit.epoch
    redo = units_to_redo(c.visited, visited, epoch, behind)
    if redo is None:
        fail_config(run, c, f"its state was lost ({ev.error!r}) and the newest checkpoint is {behind} units old")
        return
    for p in redo:
        state.reopen(Unit(c.id, epoch, p, TRAIN))
    c.open += len(redo)
    # the units to re-do are gone from the config's weights: their log rows and metrics must go too
    gone = [r for r in c.reports if r.unit.kind == TRAIN and r.unit.epoch == epoch and r.unit.partition in redo]
    c.reports = [r for r in c.reports if r not in gone]
    run.log.mark_lost([r.unit for r in gone])
    c.state = run.backend.put(ckpt) if ckpt is not None else None
    c.units, c.visited = units, visited
    run.event("state_restored", config_id=c.id, units=units, rerun=redo)
    run.write(f"config {c.id}: its state was lost; restored from its checkpoint after {units} units, re-running "
              f"partitions {sorted(redo)} of epoch {epoch}")

