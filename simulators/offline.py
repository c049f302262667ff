"""An offline engine: drives a procedure through rounds with a synthetic objective, on the engine's own driver.

The run is the driver loop of the live engine (`framework.driver`) on a simulated backend with one worker and one
partition, so a procedure meets exactly the engine's rules (`framework.driver.configs`). It serves unit tests,
quick experiments with a procedure's logic, and users writing their own procedure:

* `bind(metric, mode, storage_path, num_workers=...)` once, then `step([])`, then `step(states)` after every round;
* ids are assigned from 0 in the order of each decision's `add` entries, then its `clone` entries;
* a clone starts from its source's latest "weights"; its own `epochs` count restarts at 0;
* every ACTIVE config trains one epoch per round; the run ends when nothing is active after a decision.

The objective plays the model: `objective(config, epoch)` returns the metrics dict of one epoch, where `epoch` is
the 0-based index of the epoch the *weights* are in, inherited epochs included (a clone of a source that trained 4
epochs trains its first epoch with `epoch=4`). Raising, or returning a NaN `metric`, marks the config FAILED, as
the engine does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from automl._base import ACTIVE, ConfigState, Decision, Procedure
from framework.callbacks import Callback
from framework.driver import Driver, MemoryRunLog
from framework.driver.configs import ConfigRecord
from framework.options import SERIAL_QUEUE_DEPTH, RunOptions
from simulators.backend import SimulatedBackend
from simulators.workload import Workload

Objective = Callable[[dict[str, Any], int], dict[str, float]]



@dataclass
class OfflineRun:
    """What happened in an offline run.

    Attributes:
        states: the final state of every config, in id order.
        decisions: every decision, the first one (for `step([])`) included.
        rounds: how many rounds trained.
        finished: False when `max_rounds` cut the run short.
        weight_epochs: per id, the epochs its weights have seen, inherited ones included.
        errors: per failed id, the error message.
    """

    states: list[ConfigState]
    decisions: list[Decision] = field(default_factory=list)
    rounds: int = 0
    finished: bool = False
    weight_epochs: dict[int, int] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    def trace(self) -> list[tuple[Any, ...]]:
        """A comparable summary: one `(add, stop, clone)` tuple per decision."""
        return [
            (tuple(map(_freeze, d.add)), tuple(d.stop), tuple((s, _freeze(c)) for s, c in d.clone))
            for d in self.decisions
        ]

    def to_frame(self):  # -> pandas.DataFrame
        """Long format: one row per config x epoch with the config's hyper-parameters and metrics."""
        import pandas as pd

        rows = [
            {"config_id": s.id, "parent": s.parent, "epoch": e, **s.config, **metrics}
            for s in self.states
            for e, metrics in enumerate(s.history)
        ]
        return pd.DataFrame(rows)


def _freeze(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


class OfflineEngine:
    """The offline engine as an object, so a run can advance round by round and be pickled mid-run (with its
    procedure; the objective must then be picklable too, or set again after unpickling). `run_procedure_offline`
    is the one-call form. The procedure's first decision is applied on construction.

    The epoch barrier is kept whatever the procedure's `synchronous` says: a round trains every active config one
    epoch, then the procedure decides (`train_round`). Failures of the objective (raising, or a NaN or infinite
    `*loss*`) fail their config, as the engine does.
    """

    def __init__(
        self,
        procedure: Procedure,
        objective: Objective,
        *,
        metric: str = "valid_loss",
        mode: str = "min",
        storage_path: str | None = None,
        num_workers: int | None = None,
    ) -> None:
        self.procedure = procedure
        self.objective = objective
        self.metric, self.mode, self.storage_path, self.num_workers = metric, mode, storage_path, num_workers
        self.run = OfflineRun(states=[])
        self._driver = None
        self._on_round: Callable[[int, list[ConfigState]], None] | None = None
        self._start(None)

    # ---- the driver behind it ---------------------------------------------------------------------------------
    def _start(self, records) -> None:
        workload = Workload(np.ones((1, 1)), {0: (0,), 1: (0,)}, eval_partitions=(1,), eval_fraction=1.0)
        workload = _AnyConfig(workload)
        backend = SimulatedBackend(workload, objective=lambda config, epoch: self.objective(config, epoch))
        options = RunOptions(metric=self.metric, mode=self.mode, storage_path=self.storage_path, barrier=True,
                             max_worker_restarts=0, reassign_partitions=False, num_workers=self.num_workers or 0,
                             queue_depth=SERIAL_QUEUE_DEPTH)
        self.log = MemoryRunLog()
        driver = Driver(backend, self.procedure, self.log, {0: [0, 1]}, [0], options, eval_partitions=[1],
                        observers=[_Watch(self)])
        self._driver = driver
        if records is not None:
            driver.run_state.start_at_round(self.run.rounds)  # the round the restored run is in
        driver.start(records)
        self._sync()

    def _round_trained(self, round: int) -> None:
        self.run.rounds += 1
        self._sync()
        if self._on_round is not None:
            self._on_round(self.run.rounds, list(self.run.states))

    def _sync(self) -> None:
        """Copy the driver's view of every config into `run`."""
        run_state = self._driver.run_state
        self.run.states = run_state.configs.views()
        for c in run_state.configs:
            state = run_state.backend.get(c.state)
            self.run.weight_epochs[c.id] = state["trained"] if state else 0
            error = self.log.configs.get(c.id, {}).get("error")
            if c.status == "failed" and error:
                self.run.errors[c.id] = error.strip().splitlines()[-1]

    def __getstate__(self) -> dict:
        state = dict(vars(self))
        state["_driver"] = state["log"] = None
        state["_on_round"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)

    def _ensure_driver(self) -> None:
        if self._driver is not None:
            return
        records = []
        for s in self.run.states:  # restored from a pickle: each config's weights are its trained epochs
            trained = self.run.weight_epochs.get(s.id, 0)
            handle = {"visited": {e: [0] for e in range(s.epochs)}, "trained": trained}
            records.append(ConfigRecord(s.id, dict(s.config), s.parent, s.status, list(s.history), handle, handle,
                                        units=trained, visited={e: [0] for e in range(s.epochs)}))
        self._start(records)

    # ---- the API ------------------------------------------------------------------------------------------------
    @property
    def states(self) -> list[ConfigState]:
        """Every config's state after the last round (and decision), in id order (the same list as `run.states`)."""
        return self.run.states

    @property
    def done(self) -> bool:
        """Nothing active after the last decision: the run has ended."""
        return not any(s.status == ACTIVE for s in self.run.states)

    def train_round(self) -> None:
        """Every ACTIVE config trains one epoch (a failure marks it FAILED), then the procedure decides."""
        self.run_rounds(1)

    def run_rounds(
        self, max_rounds: int, on_round: Callable[[int, list[ConfigState]], None] | None = None
    ) -> OfflineRun:
        """Train and decide until the run ends or `max_rounds` more rounds have trained."""
        self._ensure_driver()
        self._on_round = on_round
        try:
            if not self.done:
                self._driver.run(max_commits=max_rounds)
        finally:
            self._on_round = None
        self._sync()
        self.run.finished = self.done
        return self.run


class _Watch(Callback):
    """The engine's observer: records every decision, and counts a round as trained at each barrier."""

    def __init__(self, engine: OfflineEngine) -> None:
        self.engine = engine

    def on_decision(self, round: int, decision: Decision) -> None:
        self.engine.run.decisions.append(decision)

    def on_round_end(self, round: int) -> None:
        self.engine._round_trained(round)


class _AnyConfig:
    """A one-row workload that answers for every config id (the offline engine's unit time is always 1)."""

    def __init__(self, workload) -> None:
        self._w = workload

    def __getattr__(self, name: str):
        return getattr(self._w, name)

    def duration(self, unit, worker: int) -> float:
        return 1.0


def run_procedure_offline(
    procedure: Procedure,
    objective: Objective,
    max_rounds: int = 1000,
    *,
    metric: str = "valid_loss",
    mode: str = "min",
    storage_path: str | None = None,
    num_workers: int | None = None,
    on_round: Callable[[int, list[ConfigState]], None] | None = None,
) -> OfflineRun:
    """Run `procedure` to its end (or `max_rounds` rounds) against `objective` (see the module docstring).

    `on_round(round, states)` is called after every round, before `step` (tests use it to advance a fake clock).
    Raises `framework.driver.configs.DecisionError` (a `RuntimeError`) when the procedure breaks the contract (stops
    an unknown or stopped id, clones an unknown id); `TypeError` when `step` returns something else than a Decision. `OfflineRun.finished` is False when `max_rounds` cut it short.
    """
    engine = OfflineEngine(
        procedure, objective, metric=metric, mode=mode, storage_path=storage_path, num_workers=num_workers
    )
    return engine.run_rounds(max_rounds, on_round)
