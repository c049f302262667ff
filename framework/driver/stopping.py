"""Stoppers and the time budget on the driver loop (`RunOptions.stop`, `RunOptions.time_budget_s`).

At every decision (`commit.decide`), before the procedure is asked, the run's stopper (`framework.stoppers`) sees
each config whose epoch ended, in id order: a config it stops is STOPPED with the outcome "stopped" (an epoch is
never cut short: it stops at the epoch end it was shown), or "completed" when that epoch completed the config's budget
under the procedure (`Procedure.completes_budget`: the budget wins, as if the procedure had stopped it). Then its `stop_all` may end the run: every active config
stops the same way (those in the middle of an epoch when that epoch ends) and the procedure is not asked again, so
the run finishes. The stops commit with the decision; their reasons are logged right after it (`config_stopped`,
`run_stopped` events).

A stopper that raises (in `on_epoch` or `stop_all`, or while a resume shows it the committed epochs) is not asked
again, and ends the run as `stop_all` does: its reason is one line naming the stopper and its error ("the stopper
failed: FunctionStopper(my_rule) raised KeyError: 'valid_acc'"), shown and logged (`run_stopped`); the traceback goes
to the run's events only (`stopper_failed`), never to the console. `ModelSelection` records the failure with the
run's options (`framework.stoppers.failed_spec`), so a resume does not ask for `stop=` again.

The time budget counts the seconds the driver loop runs on the backend's clock (a simulation's simulated seconds),
summed over the run and its resumes: each session that ran under a budget logs its seconds (a `time_spent` event)
when it ends, and a resume starts from the total. When the budget is spent, nothing new is dispatched, the units in
flight finish (and count: their rows are logged and their configs absorb them), the decisions they complete are
committed, every active config's latest state is checkpointed, and the loop returns: the run has ended by its budget
(a `time_budget_spent` event) but not finished, and resumes with a larger budget where it stopped. A budget spent
before the run's first decision ends the session once that decision is committed (the procedure's state is saved
with it: without one a resume would need the procedure passed again).
"""

from __future__ import annotations

import copy
import os
import traceback
from collections.abc import Callable
from typing import Any

from automl import ACTIVE, PROCEDURE, ConfigState
from automl._checks import show
from framework.driver._state import RunState
from framework.driver.configs import ConfigRecord
from framework.stoppers import Stopper, StopperError, event_detail, failed_spec

#: the most characters of a stopper's error its one line shows (the whole error is in its traceback's event)
MAX_ERROR = 300
#: the outcome of a config a stopper stopped (the same word as a person's stop: it stopped before its procedure said)
BY_STOPPER = "stopped"
#: ... unless the epoch it stopped at completed its budget: then it is what the procedure's stop would have said
BUDGET_DONE = "completed"


class RunStopping:
    """The run's stopper (a private copy: its state is this run's) and its time budget, on one clock."""

    def __init__(self, stopper: Stopper | None, time_budget_s: float | None) -> None:
        self.stopper = copy.deepcopy(stopper)
        budgets = [b for b in (time_budget_s, stopper.timeout_s if stopper is not None else None) if b is not None]
        self.budget_s: float | None = min(budgets) if budgets else None
        self.by = ("time_budget_s" if self.budget_s == time_budget_s else "TimeoutStopper") if budgets else None
        self.spent_before = 0.0  # seconds earlier sessions of the run spent
        self.started: float | None = None  # when this session's loop started (the backend's clock)
        self.stopped_all: str | None = None  # why `stop_all` ended the run
        # the stopper raised (it is not asked again): {"stopper", "error", "traceback"}, and `stopped_all` says so
        self.failed: dict[str, str] | None = None

    def start(self, now: float) -> None:
        """This session's loop starts at `now`."""
        if self.started is None:
            self.started = now

    def spent(self, now: float) -> float:
        """Seconds of the budget spent by `now`: earlier sessions' and this one's."""
        return self.spent_before + (now - self.started if self.started is not None else 0.0)

    def over_budget(self, now: float) -> bool:
        return self.budget_s is not None and self.spent(now) >= self.budget_s

    def resume_from(self, spent: float) -> None:
        """A resumed run's earlier sessions spent `spent` seconds."""
        self.spent_before = spent

    def end_run(self, reason: str) -> None:
        self.stopped_all = reason

    def ask(self, call: Callable[[Stopper], str | None]) -> str | None:
        """`call(stopper)`, unless the stopper failed before; one that raises fails (`fail`) and says nothing."""
        if self.stopper is None or self.failed is not None:
            return None
        try:
            return call(self.stopper)
        except Exception as e:  # noqa: BLE001 (the user's code: its failure ends the run, recorded, in one line)
            self.fail(e)
            return None

    def fail(self, error: Exception) -> None:
        """The stopper raised `error`: the run ends (`stopped_all`) with one line naming the stopper (the one of a
        `CombinedStopper` that raised) and the error; `failed` keeps the traceback for the run's events."""
        culprit, cause = (error.stopper, error.error) if isinstance(error, StopperError) else (self.stopper, error)
        try:
            text = str(cause)
        except Exception:  # noqa: BLE001 (a user's exception whose message cannot be read is still named)
            text = "(its message could not be read)"
        name, what = show(culprit), " ".join(f"{type(cause).__name__}: {text}".split())
        what = what if len(what) <= MAX_ERROR else what[:MAX_ERROR - 3] + "..."
        self.failed = {"stopper": name, "error": what,
                       "traceback": "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))}
        self.end_run(f"the stopper failed: {name} raised {what}")


def stop_ended(run: RunState, ended: list[ConfigRecord]) -> list[tuple[ConfigRecord, str]]:
    """Show the stopper the configs whose epoch ended (in id order), then ask whether the run ends; stop what it
    says. Returns the configs stopped, with their reasons (the caller logs them once the decision committed)."""
    stopping = run.stop_rules
    if stopping is None or stopping.stopper is None:
        return []
    stopper, stopped = stopping.stopper, []
    for c in sorted(ended, key=lambda c: c.id):  # every committed epoch is shown (a resume shows them all again)
        reason = stopping.ask(lambda s: s.on_epoch(c.view()))  # noqa: B023 (called at once)
        if reason and c.status == ACTIVE:  # (one that stops at this epoch end already, e.g. a person's stop, stays so)
            c.stop(_outcome(run, c))
            stopped.append((c, f"{type(stopper).__name__}: {reason}"))
    if stopping.stopped_all is None:
        reason = stopping.ask(lambda s: s.stop_all())
        if reason:
            stopping.end_run(f"{type(stopper).__name__}: {reason}")
    if stopping.stopped_all is not None:
        for c in run.configs.active():
            c.stop(_outcome(run, c))
    return stopped


def _outcome(run: RunState, c: ConfigRecord) -> str:
    """The outcome of the stopper's stop of `c`: "completed" when the epoch that just ended completed its budget
    under the procedure (`Procedure.completes_budget`: the procedure would stop it as completed now; the budget
    wins), else "stopped". A config in the middle of an epoch (a run-wide stop) has not completed it."""
    if c.open or c.owner != PROCEDURE:  # (a person's config stops as completed at its budget by itself)
        return BY_STOPPER
    try:
        done = run.procedure.completes_budget(c.view())
    except Exception:  # noqa: BLE001 (a user's procedure: its label is not worth failing the run)
        done = False
    return BUDGET_DONE if done else BY_STOPPER


def run_stopped(run: RunState) -> bool:
    """Whether a stopper ended the run (the procedure is not asked again)."""
    return run.stop_rules is not None and run.stop_rules.stopped_all is not None


def log_stops(run: RunState, stopped: list[tuple[ConfigRecord, str]], first: bool) -> None:
    """The reasons of the stops a decision committed (`first`: the run-wide stop happened at this decision)."""
    for c, reason in stopped:
        run.event("config_stopped", config_id=c.id, epochs=len(c.history), reason=reason)
        if c.outcome == BUDGET_DONE:
            run.write(f"config {c.id} completed its budget of {len(c.history)} epochs (the stopper stopped it at the "
                      f"same epoch: {reason})")
        else:
            run.write(f"config {c.id} stopped after {len(c.history)} epochs: {reason}")
    if first:
        _log_run_stopped(run)


def _log_run_stopped(run: RunState) -> None:
    """The run-wide stop's reason, shown and logged; a stopper's failure with its traceback (events only)."""
    stopping = run.stop_rules
    if stopping.failed is not None:
        run.event("stopper_failed", **stopping.failed)
    run.event("run_stopped", reason=stopping.stopped_all)
    run.write(f"the run stops: {stopping.stopped_all}"
              + (" (its traceback is in the run's events: stopper_failed)" if stopping.failed is not None else ""))


def failed_meta(run: RunState) -> dict[str, Any]:
    """What the run's meta records when its stopper failed (`{"stop": failed_spec(...)}`: a resume needs no `stop=`
    again); {} when it did not."""
    stopping = run.stop_rules
    if stopping is None or stopping.failed is None:
        return {}
    return {"stop": failed_spec(run.options.stop, stopping.stopped_all)}


def check_budget(run: RunState) -> None:
    """Once the time budget is spent: the session ends (nothing new is dispatched; see the module docstring)."""
    stopping = run.stop_rules
    if stopping is None or stopping.budget_s is None or run.ending is not None:
        return
    if run.round == 0:  # the first decision commits first: a run that committed none could not resume by itself
        return
    now = run.backend.now()
    if stopping.over_budget(now):
        spent = stopping.spent(now)
        run.end_session(f"{stopping.by}={stopping.budget_s:g}")
        run.event("time_budget_spent", budget_s=stopping.budget_s, by=stopping.by, spent_s=round(spent, 3),
                  running=len(run.dispatch.flights))
        run.write(f"the time budget ({stopping.by}={stopping.budget_s:g} s) is spent: {len(run.dispatch.flights)} "
                  "unit(s) in flight finish, nothing new starts; resume the run with a larger budget to go on")


def check_asked(run: RunState) -> None:
    """The backend asks the session to end (`Backend.stop_asked`: the local service the run is attached to is going
    down): it ends as when the time budget is spent, and the run resumes where it stopped (`service_stopping`
    event). Like the budget, not before the run's first decision has committed."""
    if run.ending is not None or run.round == 0:
        return
    reason = run.backend.stop_asked()
    if reason is None:
        return
    run.end_session(reason)
    run.event("service_stopping", reason=reason, running=len(run.dispatch.flights))
    run.write(f"{reason}: {len(run.dispatch.flights)} unit(s) in flight finish, nothing new starts; resume the run "
              "to go on")


def checkpoint_latest(run: RunState) -> None:
    """Every active config's latest state reaches the disk (also in the middle of an epoch: a resume keeps the units
    it holds), after the log rows of the units it absorbed."""
    run.run_deferred()
    for c in run.configs.active():
        if c.state is not None and c.checkpointed[0] != c.units:
            epoch = max((e for e, parts in c.visited.items() if parts), default=0)  # the epoch of its latest unit
            run.checkpoint(c, epoch, c.units, c.state, None)


def session_ended(run: RunState) -> None:
    """The loop returns: a run under a budget logs the seconds spent so far (what a resume counts from)."""
    stopping = run.stop_rules
    if stopping is None or stopping.budget_s is None or stopping.started is None:
        return
    now = run.backend.now()
    run.event("time_spent", session_s=round(now - stopping.started, 3), total_s=round(stopping.spent(now), 3))


def spent_before(events: Any) -> float:
    """Seconds a run's sessions spent, from its `time_spent` events (`catalog.events("time_spent")`): the last
    total."""
    totals = [event_detail(d).get("total_s") for d in events.detail]
    totals = [float(t) for t in totals if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0]
    return totals[-1] if totals else 0.0


def restore(run: RunState, catalog: Any, history: dict[int, list[dict]]) -> None:
    """A resumed run: the budget counts from what earlier sessions spent, and the stopper sees every committed epoch
    again, in the order they were committed (what it returns is ignored), so its state is what it was."""
    stopping = run.stop_rules
    if stopping is None:
        return
    stopping.resume_from(spent_before(catalog.events("time_spent")))
    if stopping.stopper is None:
        return
    epochs = catalog.epochs()
    configs = {int(r.config_id): r.config for r in catalog.configs().itertuples()}
    order = sorted(zip(epochs["round"].tolist(), epochs.config_id.tolist(), epochs.epoch.tolist()))
    for _, cid, e in order:
        cid, e = int(cid), int(e)
        past = tuple(history.get(cid, [])[:e + 1])
        if len(past) == e + 1:
            state = ConfigState(cid, dict(configs.get(cid, {})), e + 1, past)
            stopping.ask(lambda s: s.on_epoch(state))  # noqa: B023 (called at once)
        if stopping.failed is not None:  # the run ends at its next decision, which stops every active config
            _log_run_stopped(run)
            return


def check_budget_left(storage_path: str, time_budget_s: float | None, stop: Stopper | None) -> None:
    """Before a resume starts: its budget (`time_budget_s`, or a `TimeoutStopper`'s) must exceed what the run spent,
    else a `ValueError` naming both."""
    budgets = [b for b in (time_budget_s, stop.timeout_s if stop is not None else None) if b is not None]
    if not budgets:
        return
    from framework.store.catalog import CATALOG_FILE, SQLiteCatalog

    catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE), readonly=True)
    try:
        spent = spent_before(catalog.events("time_spent"))
    finally:
        catalog.close()
    if min(budgets) <= spent:
        arg = "time_budget_s" if min(budgets) == time_budget_s else "stop (its TimeoutStopper)"
        raise ValueError(f"`{arg}` gives a budget of {min(budgets):g} s, but the run has spent {spent:g} s of its "
                         "budget already: pass a larger one (or time_budget_s=None)")
