"""Unit handlers: submitting a unit, a unit that finished, a unit whose user code failed."""

from __future__ import annotations

from functools import partial
from typing import Any

from automl import STOPPED
from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord
from framework.driver.control import end_flight
from framework.driver.dispatch import Flight
from framework.driver.recovery import fail_config, leave_stopped
from framework.engine._base import UnitDone, UnitFailed
from framework.engine.faults import CRASH_DRIVER, DRIVER, SKIP_CHECKPOINT
from framework.engine.recovery import should_retry
from framework.scheduling import TRAIN, Assignment, Unit
from framework.scheduling.units import UnitReport, UnitTask


def submit(run: RunState, a: Assignment) -> None:
    """Start `a` on the dispatcher and send it to the backend with its members' latest states (behind the units
    its workers hold already, if any)."""
    queued = run.dispatch.launch(a)
    if not run.faults.faults and len(a.members) == 1 and len(a.workers) == 1:  # the common case: nothing to inject
        c = run.configs[a.unit.config_id]
        ticket = run.backend.submit(a.workers, UnitTask(a.unit, c.config, run.options.seed), (c.state,))
        run.dispatch.fly(ticket, Flight(a, run.backend.now(), (), queued))
        return
    members = [run.configs[cid] for cid in a.members]
    # a pack's faults are each member's own (a gang's, its unit's); a worker's fault is acted out by its member
    hit = a.units if len(members) > 1 else (a.unit,)
    injected = [run.faults.on_dispatch(u, a.worker) if run.faults.faults else [] for u in hit]
    for u, fired in zip(hit, injected, strict=True):
        for f in fired:
            run.event("fault_injected", action=f.action, unit=str(u), worker=a.worker)
    acts = [next((f for f in fired if f.spec.where != DRIVER), None) for fired in injected]
    if len(members) == 1 and len(a.workers) == 1:
        task = UnitTask(a.unit, members[0].config, run.options.seed, fault=acts[0])
    else:
        task = UnitTask(a.unit, members[0].config, run.options.seed, fault=acts[0], members=a.members,
                        configs=tuple(c.config for c in members), workers=a.workers, partitions=a.partitions,
                        faults=tuple(acts) if len(acts) > 1 and any(acts) else (), epochs=a.epochs)
    ticket = run.backend.submit(a.workers, task, tuple(c.state for c in members))
    driver_faults = tuple((u, f.spec.effect) for u, fired in zip(hit, injected, strict=True) for f in fired
                          if f.spec.where == DRIVER)
    run.dispatch.fly(ticket, Flight(a, run.backend.now(), driver_faults, queued))


def on_unit_ended(run: RunState, ev: UnitDone | UnitFailed) -> None:
    """An assignment ran: each member's unit is done, or failed in user code (its report holds the error)."""
    f = end_flight(run, ev.ticket, ev.time)
    if f is None:
        return  # its worker was declared lost meanwhile: the unit was re-queued
    a = f.assignment
    if run.dispatch.packer is not None and len(a.workers) == 1:
        observe_pack(run, a, ev.reports, ev.time - f.started)
    if len(a.members) == 1 and len(a.workers) > 1 and any(r.error is not None for r in ev.reports):
        unit_failed(run, f, a.units, ev.reports)  # a gang trains one state: it fails, and is retried, as one
        return
    afters: list | None = [] if len(a.members) > 1 else None
    for unit, report, state in zip(a.units, ev.reports, ev.states, strict=True):
        if report.error is None:
            unit_done(run, f, unit, report, state, afters)
        else:
            unit_failed(run, f, (unit,), (report,))
    # a pack's rows (and its injected crashes) come before any of its checkpoints: an injected crash never leaves
    # some members of a fused pass checkpointed and the others to re-run (a replay then re-fuses what ran)
    if afters:
        run.defer(*afters)


def observe_pack(run: RunState, a: Assignment, reports: tuple[UnitReport, ...], seconds: float) -> None:
    """What the packer learns from an assignment of one worker that held it `seconds` (on the backend's clock): its
    time per example (for `pack="auto"`), its states' size (the memory cap), and whether a pack fused (one that did
    not refuses its key, said once)."""
    packer, ok = run.dispatch.packer, [r for r in reports if r.error is None]
    if not ok:
        return
    first = ok[0]
    refused = len(packer.refused)
    packer.observe(a, seconds, first.num_examples, max(r.state_bytes for r in ok), first.note)
    if len(packer.refused) > refused:
        run.event("pack_not_fused", configs=list(a.members), unit_kind=a.unit.kind, why=first.note)
        did = "trained" if a.unit.kind == TRAIN else "evaluated"
        run.write(f"configs {list(a.members)} {did} one after another, {first.note}; configs like them are "
                  f"{did} alone from now on")


def log_unit(run: RunState, round_: int, f: Flight, report: UnitReport, status: str) -> None:
    for row in f.rows(report):
        run.log.add_unit(round_, row, status)


def save_unit(run: RunState, c: ConfigRecord, unit: Unit, units: int, handle: Any, worker: int,
              effects: tuple[str, ...]) -> None:
    """A training unit's checkpoint, when one is due (deferred after its log row: see `unit_done`)."""
    if SKIP_CHECKPOINT not in effects and checkpoint_due(run, c, unit, units):
        run.checkpoint(c, unit.epoch, units, handle, worker)


def unit_done(run: RunState, f: Flight, unit: Unit, report: UnitReport, handle: Any, afters: list | None = None
              ) -> None:
    """A member's unit is done: its config takes the state and the report; its log row, then its checkpoint, are
    deferred until the next units are on their way (a pack's checkpoints go to `afters`, after all its rows)."""
    c = run.configs[unit.config_id]
    run.dispatch.complete(unit)
    a = f.assignment
    if len(a.workers) == 1:  # (a pack's members share its time)
        run.dispatch.record(unit, report.worker, (report.end - report.start) / len(a.members))
    elif unit == f.assignment.units[0]:
        run.dispatch.record_gang(f.assignment, report.end - report.start)
        if report.comm_s:
            run.dispatch.record_comm(f.assignment, report.comm_s)
    c.absorb(unit, report, handle, barrier=run.synchronous)
    run.charge_unit(unit.epoch)
    if run.options.check_metric and not run.metric_seen:
        check_metric(run, unit, report)
    units = c.units
    effects = tuple(effect for u, effect in f.faults if u == unit or len(a.members) == 1) if f.faults else ()
    if run.observers.listens("on_unit_end"):
        run.observers.call("on_unit_end", unit.config_id, unit.epoch, unit.partition, unit.kind, f.worker,
                           report.end - report.start, dict(report.metrics))
    # deferred: the log row first, then the checkpoint (a checkpoint never holds a unit the log does not know)
    run.defer(partial(log_unit, run, run.round, f, report, "done"))
    if CRASH_DRIVER in effects:  # the driver's injected crash
        run.defer(run.crash)
    if unit.kind == TRAIN:
        save = partial(save_unit, run, c, unit, units, handle, f.worker, effects)
        if afters is None:  # done once the next units are on their way
            run.defer(save)
        else:
            afters.append(save)
    if c.status == STOPPED:  # a person stopped it while this unit ran
        leave_stopped(run, c)
        return
    if c.complete_unit():
        run.mark_ended(c.id)


class MetricNotReportedError(ValueError):
    """The run ranks by a metric that the user's `train_fn` / `eval_fn` does not return."""


def check_metric(run: RunState, unit: Unit, report: Any) -> None:
    """The first report of the metric's kind (`eval_fn` for `valid_*`, `train_fn` for `train_*`) must hold it:
    a typo in `metric` stops the run at its first report, not after the whole run."""
    metric = run.options.metric
    prefix, fn = ("valid_", "eval_fn") if unit.kind != TRAIN else ("train_", "train_fn")
    if not metric.startswith(prefix):
        return
    name = metric[len(prefix):]
    if name not in report.metrics:
        reported = sorted(prefix + k for k in report.metrics)
        raise MetricNotReportedError(
            f"`metric` is {metric!r}, but {fn} returned no {name!r} (config {unit.config_id}, {unit.kind} unit of "
            f"epoch {unit.epoch}); {fn} reported {reported or 'nothing'}: use one of these or return {name!r}")
    run.metric_found()


def checkpoint_due(run: RunState, c: ConfigRecord, unit: Unit, units: int) -> bool:
    """Whether the state after this training unit goes to disk (`RunOptions.checkpoint`): every unit, the last
    unit of each epoch, the last unit of each epoch and any unit N seconds after the config's last checkpoint, or
    none (then only a config's final state is written, when it stops: `RunState.checkpoint_final`)."""
    policy = run.options.checkpoint
    if policy == "unit":
        return True
    if policy == "off":
        return False
    epoch_end = len(c.visited.get(unit.epoch, ())) == len(run.workers.partitions) and c.units == units
    if policy == "epoch":
        return epoch_end
    now = run.backend.now()
    if c.checkpointed[1] is None:
        c.start_checkpoint_clock(now)  # the first N seconds count from the config's first unit
    return epoch_end or now - c.checkpointed[1] >= float(policy)


def unit_failed(run: RunState, f: Flight, units: tuple[Unit, ...], reports: tuple[UnitReport, ...]) -> None:
    """User code raised in a unit (or in a member of a gang, whose `units` fail together, as one failure): retry
    while the config has retries left, else the config fails."""
    unit = units[0]
    report = next(r for r in reports if r.error is not None)
    c = run.configs[unit.config_id]
    for r in reports:
        log_unit(run, run.round, f, r, "failed")
    if c.status == STOPPED:  # a person stopped it while this unit ran: nothing is retried
        for u in units:
            run.dispatch.requeue(u)  # (its config is dropped: the unit leaves)
            leave_stopped(run, c)
        return
    if should_retry(c.count_failure(), run.options.max_unit_retries):
        for u in units:
            run.dispatch.requeue(u)
        run.event("unit_retry", config_id=c.id, unit=str(unit), attempt=c.failures)
        return
    for u in units:
        run.dispatch.complete(u)
    fail_config(run, c, report.error, event={"unit": str(unit)})
    run.write(f"config {c.id} failed in {unit.kind} unit (epoch {unit.epoch}, partition {unit.partition}):\n"
              + report.error.strip().splitlines()[-1])
    run.observers.call("on_unit_failed", unit.config_id, unit.epoch, unit.partition, unit.kind, f.worker,
                       report.error)
