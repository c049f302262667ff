"""Unit handlers: submitting a unit, a unit that finished, a unit whose user code failed."""

from __future__ import annotations

from framework.driver._state import RunState
from framework.driver.control import finish_drain
from framework.driver.dispatch import Flight
from framework.driver.recovery import fail_config
from framework.engine._base import UnitDone, UnitFailed
from framework.engine.faults import DRIVER_ACTIONS
from framework.engine.recovery import should_retry
from framework.engine.worker import UnitTask
from framework.scheduling import TRAIN, Assignment


def submit(run: RunState, a: Assignment) -> None:
    """Start `a` on the dispatch state and send it to the backend with the config's latest state."""
    run.dispatch.state.start(a)
    c = run.configs[a.unit.config_id]
    injected = run.faults.on_dispatch(a.unit, a.worker) if run.faults.faults else []
    for action in injected:
        run.event("fault_injected", action=action, unit=str(a.unit), worker=a.worker)
    worker_fault = next((f for f in injected if f not in DRIVER_ACTIONS), None)
    task = UnitTask(a.unit, c.config, run.options.seed, fault=worker_fault)
    ticket = run.backend.submit((a.worker,), task, c.state)
    driver_faults = tuple(f for f in injected if f in DRIVER_ACTIONS)
    run.dispatch.flights[ticket] = Flight(a.unit, a.worker, run.backend.now(), driver_faults)


def on_unit_done(run: RunState, ev: UnitDone) -> None:
    f = run.dispatch.flights.pop(ev.ticket, None)
    if f is None:
        return  # its worker was declared lost meanwhile: the unit was re-queued
    finish_drain(run, f.worker)
    unit, report, c = f.unit, ev.report, run.configs[f.unit.config_id]
    run.dispatch.state.complete(unit)
    run.dispatch.record(unit, f.worker, report.end - report.start)
    c.reports.append(report)
    if unit.kind == TRAIN:
        c.state, c.units = ev.state, c.units + 1
        c.visited.setdefault(unit.epoch, []).append(unit.partition)
    round_, units, handle, faults = run.round, c.units, ev.state, f.faults

    def record() -> None:
        # the log row first, then the checkpoint: a checkpoint never holds a unit the log does not know
        run.log.add_unit(round_, report, "done")
        if "crash_driver" in faults:
            run.crash()
        if unit.kind == TRAIN and "skip_checkpoint" not in faults:
            run.log.checkpoint(c.id, unit.epoch, units, lambda: run.backend.get(handle, self_contained=True))

    run.deferred.append(record)  # done once the next units are on their way
    c.open -= 1
    if c.open == 0:
        run.ended.append(c.id)
    if run.on_unit is not None:
        run.on_unit()


def on_unit_failed(run: RunState, ev: UnitFailed) -> None:
    """User code raised: retry the unit while the config has retries left, else the config fails."""
    f = run.dispatch.flights.pop(ev.ticket, None)
    if f is None:
        return
    finish_drain(run, f.worker)
    unit, c = f.unit, run.configs[f.unit.config_id]
    run.log.add_unit(run.round, ev.report, "failed")
    c.failures += 1
    if should_retry(c.failures, run.options.max_unit_retries):
        run.dispatch.state.requeue(unit)
        run.event("unit_retry", config_id=c.id, unit=str(unit), attempt=c.failures)
        return
    run.dispatch.state.complete(unit)
    fail_config(run, c, ev.report.error, event={"unit": str(unit)})
    run.write(f"config {c.id} failed in {unit.kind} unit (epoch {unit.epoch}, partition {unit.partition}):\n"
              + ev.report.error.strip().splitlines()[-1])
    if run.on_unit is not None:
        run.on_unit()
