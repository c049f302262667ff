"""Failure handlers (Cerebro 5.6): a lost or hung worker, a lost state object, a config whose user code failed.

The rules themselves are pure functions in `framework.engine.recovery`; these handlers apply them to the run:
a unit whose worker died or hung goes back to the queue and runs again from the config's last state; the worker
restarts or its partitions are re-loaded elsewhere; a config whose state object is gone is restored from its
newest verified checkpoint (or, without one, from its starting point while it is in its first epoch) and the units
the restored state lacks run again; a failure in user code counts against its config only.
"""

from __future__ import annotations

from typing import Any

from automl import STOPPED
from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord
from framework.driver.control import count_workers, end_flight, restart_or_reassign
from framework.engine._base import StateLost, WorkerLost
from framework.engine.recovery import units_to_redo
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitReport
from framework.store.checkpoint import CorruptCheckpointError


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
    worker_lost(run, ev.worker, ev.why, ev.started)


def worker_lost(run: RunState, worker: int, why: str, started: tuple[int, ...] | None = None) -> None:
    """Requeue every unit the worker held (Q' -> Q), then restart it or re-load its partitions elsewhere.

    The `worker_failed` event tells its units apart as the worker knew them (`WorkerLost.started`; None: as the
    driver heard them, where the unit at the head of the worker's queue was running): `requeued`, the unit it was
    running (logged `interrupted`); `lost_results`, units it had finished whose reports died with it (logged `lost`:
    nothing of them counts); `unstarted`, those queued behind that never began. Every one of them runs again."""
    if worker not in run.workers.holds and worker not in run.workers.loading:
        return  # already handled
    now = run.backend.now()
    flights = run.dispatch.ground(worker, now)
    if started is None:
        started = tuple(ticket for ticket, f in flights if not f.queued)
    labels: dict[str, list[str]] = {"requeued": [], "lost_results": [], "unstarted": []}
    for ticket, f in flights:
        if ticket not in started:
            labels["unstarted"] += [str(u) for u in f.assignment.units]
            continue
        running = ticket == started[-1]
        for u in f.assignment.units:
            for row in f.rows(UnitReport(u, worker, f.started, now)):
                run.log.add_unit(run.round, row, "interrupted" if running else "lost")
        labels["requeued" if running else "lost_results"] += [str(u) for u in f.assignment.units]
    lost = run.dispatch.lose_worker(worker)
    for u in lost:
        if run.configs[u.config_id].status == STOPPED:  # (the dispatcher dropped it: its config is stopped)
            leave_stopped(run, run.configs[u.config_id])
    held = run.workers.remove(worker)
    run.backend.stop_worker(worker)
    run.event("worker_failed", worker=worker, why=why, **labels)
    count_workers(run)
    run.write(f"worker {worker} {why}; re-queued {len(lost)} unit(s)")
    restart_or_reassign(run, worker, held)


def leave_stopped(run: RunState, c: ConfigRecord) -> None:
    """A unit of a config a person stopped while it ran has ended (done, or without a result: its user code
    failed, its worker or its state was lost): nothing runs it again; once none of its units runs, its final state
    is kept (none, when it was lost: a resume reloads the newest checkpoint)."""
    if c.release_unit():
        run.defer(lambda: run.checkpoint_final(c))


def check_hung(run: RunState) -> None:
    """Declare every unit that ran over the limit hung: its worker is killed and restarted, the unit re-runs."""
    limit = run.dispatch.unit_limit(run.options.unit_timeout_s, run.backend.wall_clock)
    for f in run.dispatch.overdue(run.backend.now(), limit):
        worker_lost(run, f.worker, f"hung: {f.unit} ran over {limit:.1f}s")


def fail_config(run: RunState, c: ConfigRecord, why: str, event: dict | None = None) -> None:
    """The config fails for good (its other units are dropped); the rest of the run carries on."""
    run.dispatch.drop_config(c.id)
    c.fail()
    run.log.fail_config(c.id, why)
    run.event("config_failed", config_id=c.id, **(event or {"why": why}))
    if event is None:
        run.write(f"config {c.id} failed: {why}")
    if not run.synchronous:
        run.mark_ended(c.id)  # the procedure hears of it at once and may fill its slot


def on_state_lost(run: RunState, ev: StateLost) -> None:
    """The config's latest state object is gone: restore it from its newest verified checkpoint; without one, start
    it again from its starting point when the lost work is less than its current epoch; else it fails."""
    f = end_flight(run, ev.ticket, ev.time)
    if f is None:
        return
    c = run.configs[f.unit.config_id]
    if c.status == STOPPED:  # a person stopped it: it keeps its newest checkpoint, which a resume reloads
        for unit in f.assignment.units:
            run.dispatch.requeue(unit)  # (its config is dropped: the unit leaves)
        c.drop_state()
        leave_stopped(run, c)
        return
    run.run_deferred()  # every completed unit is logged and its checkpoint queued before we look at the disk
    run.log.flush()
    for unit in f.assignment.units:  # a pack's other members go back with it (their state hops with the lost one)
        run.dispatch.requeue(unit)
    lost = f"its state was lost ({ev.error!r})"
    no_checkpoint = None
    try:
        ckpt, _, units = run.log.load_latest(c.id)
    except CorruptCheckpointError as e:
        ckpt, units, no_checkpoint = None, 0, f"no checkpoint is usable: {e}"
    behind = c.units - units
    visited = {e: list(ps) for e, ps in (ckpt or {}).get("visited", {}).items()}
    epoch = f.unit.epoch
    redo = units_to_redo(c.visited, visited, epoch, behind)
    if redo is None:
        why = (f"{no_checkpoint}, and starting it again would re-train epochs it committed" if no_checkpoint
               else f"the newest checkpoint is {behind} units old")
        fail_config(run, c, f"{lost} and {why}")
        return
    if no_checkpoint is not None and c.parent is not None:
        ckpt = _clone_start(run, c)
        if ckpt is None:
            fail_config(run, c, f"{lost} and {no_checkpoint}; the weights it was cloned from (config {c.parent}) "
                        "are no longer held")
            return
    for p in redo:
        run.dispatch.reopen(Unit(c.id, epoch, p, TRAIN))
    # the units to re-do are gone from the config's weights: their log rows and metrics must go too, and so must
    # the epoch's evaluations of those weights (an eval unit that lost the state ran after every train unit)
    gone = [r for r in c.reports
            if redo and r.unit.epoch == epoch and (r.unit.kind != TRAIN or r.unit.partition in redo)]
    for r in gone:
        if r.unit.kind != TRAIN:
            run.dispatch.reopen(r.unit)
    run.log.mark_lost([r.unit for r in gone])
    c.rewind(run.backend.put(ckpt) if ckpt is not None else None, units, visited,
             reopened=len(redo) + sum(r.unit.kind != TRAIN for r in gone), gone=gone, on_disk=no_checkpoint is None)
    source = "checkpoint" if no_checkpoint is None else "model_fn" if c.parent is None else "clone_start"
    run.event("state_restored", config_id=c.id, units=units, rerun=redo, source=source)
    origin = {"checkpoint": f"its checkpoint after {units} units", "model_fn": "model_fn (no checkpoint is usable)",
              "clone_start": "the weights it was cloned from (no checkpoint is usable)"}[source]
    run.write(f"config {c.id}: its state was lost; restored from {origin}, re-running partitions {sorted(redo)} of "
              f"epoch {epoch}")


def _clone_start(run: RunState, c: ConfigRecord) -> dict[str, Any] | None:
    """A clone's starting point (its donor's weights, no visits) while the driver still holds it: until the clone's
    first epoch ends, except where a barrier lets a config's older states go (`units.on_unit_done`). None: gone."""
    if c.history or c.epoch_state is None:
        return None
    try:
        start = run.backend.get(c.epoch_state)
    except Exception:  # noqa: BLE001 - lost like the state it started: the clone cannot start again
        return None
    return start if start is not None and not start.get("visited") else None
