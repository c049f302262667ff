"""An offline engine: drives a procedure through rounds in pure Python with a synthetic objective.

`run_procedure_offline` follows the engine's contract to the letter (see `automl._base`), so it serves unit tests,
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

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from automl._base import ACTIVE, FAILED, STOPPED, ConfigState, Decision, Procedure

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
    procedure; the objective must then be picklable too). `run_procedure_offline` is the one-call form."""

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
        self.metric = metric
        self.run = OfflineRun(states=[])
        procedure.bind(metric, mode, storage_path, num_workers=num_workers)
        self._apply(procedure.step([]))

    @property
    def states(self) -> list[ConfigState]:
        return self.run.states

    @property
    def done(self) -> bool:
        """Nothing active after the last decision: the run has ended."""
        return not any(s.status == ACTIVE for s in self.run.states)

    def _apply(self, decision: Decision) -> None:
        states, run = self.run.states, self.run
        if not isinstance(decision, Decision):
            raise RuntimeError(f"`step` returned {decision!r}, but must return a Decision")
        run.decisions.append(decision)
        for cid in decision.stop:
            known = isinstance(cid, int) and 0 <= cid < len(states)
            if not known or states[cid].status != ACTIVE:
                status = states[cid].status if known else "unknown"
                raise RuntimeError(f"`stop` holds {cid!r}, but only ACTIVE ids can be stopped (it is {status})")
            states[cid] = replace(states[cid], status=STOPPED)
        for config in decision.add:
            run.weight_epochs[len(states)] = 0
            states.append(ConfigState(id=len(states), config=dict(config)))
        for source, config in decision.clone:
            if not (isinstance(source, int) and 0 <= source < len(states)):
                raise RuntimeError(f"`clone` names the source {source!r}, but no config has that id")
            run.weight_epochs[len(states)] = run.weight_epochs[source]
            states.append(ConfigState(id=len(states), config=dict(config), parent=source))

    def train_round(self) -> None:
        """Every ACTIVE config trains one epoch (a failure marks it FAILED)."""
        states, run = self.run.states, self.run
        for i, s in enumerate(states):
            if s.status != ACTIVE:
                continue
            try:
                metrics = dict(self.objective(dict(s.config), run.weight_epochs[i]))
                if math.isnan(float(metrics.get(self.metric, 0.0))):
                    raise FloatingPointError(f"{self.metric} is NaN")
            except Exception as e:  # noqa: BLE001 - a failure in user code is recorded against its config
                run.errors[i] = f"{type(e).__name__}: {e}"
                states[i] = replace(s, status=FAILED)
                continue
            run.weight_epochs[i] += 1
            states[i] = replace(s, epochs=s.epochs + 1, history=(*s.history, metrics))
        run.rounds += 1

    def decide(self) -> None:
        """`step(states)` and apply its decision."""
        self._apply(self.procedure.step(list(self.run.states)))

    def run_rounds(
        self, max_rounds: int, on_round: Callable[[int, list[ConfigState]], None] | None = None
    ) -> OfflineRun:
        """Train and decide until the run ends or `max_rounds` more rounds have trained."""
        for _ in range(max_rounds):
            if self.done:
                break
            self.train_round()
            if on_round is not None:
                on_round(self.run.rounds, list(self.run.states))
            self.decide()
        self.run.finished = self.done
        return self.run


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
    Raises `RuntimeError` when the procedure breaks the contract (stops an unknown or inactive id, clones an unknown
    id, returns something else than a Decision). `OfflineRun.finished` is False when `max_rounds` cut it short.
    """
    engine = OfflineEngine(
        procedure, objective, metric=metric, mode=mode, storage_path=storage_path, num_workers=num_workers
    )
    return engine.run_rounds(max_rounds, on_round)
