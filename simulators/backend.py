"""`SimulatedBackend`: the driver's backend on a simulated clock, so a simulation runs the real driver loop.

Units take the workload's unit time (times `Noise`), nothing is trained: a unit's metrics come from an optional
`objective(config, epoch)` (the same contract as `simulators.run_procedure_offline`), its state is a small dict with the visit
record. Worker failures, returns and joins are scheduled `WorkerEvent`s on the same clock: a failure is reported as
a lost worker, a return or a join as a command to add that worker with its partitions. Everything else (the event
heap, same-time events delivered together, hung units) is `LocalBackend`'s.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from framework.engine._base import CommandReceived, Event, StateLost, UnitDone, UnitFailed, WorkerJoined, WorkerLost
from framework.engine.local import LocalBackend
from framework.engine.worker import UnitReport, UnitTask
from framework.scheduling import TRAIN
from simulators.workload import Workload

FAIL, RETURN, JOIN = "fail", "return", "join"

Objective = Callable[[dict[str, Any], int], dict[str, float]]


@dataclass(frozen=True)
class WorkerEvent:
    """At `time`, `worker` fails (its running unit is lost and re-queued), returns, or joins for the first time
    (a joining worker is absent until then). Returning and joining workers hold their partitions of the workload."""

    time: float
    worker: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in (FAIL, RETURN, JOIN):
            raise ValueError(f"`kind` is {self.kind!r}, but must be one of {(FAIL, RETURN, JOIN)}")
        if self.time < 0:
            raise ValueError(f"`time` is {self.time}, but must be >= 0")


@dataclass(frozen=True)
class Noise:
    """Actual unit time = estimate * lognormal(sigma, mean 1) * (`straggler_factor` with prob. `straggler_prob`)."""

    sigma: float = 0.0
    straggler_prob: float = 0.0
    straggler_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.sigma < 0:
            raise ValueError(f"`sigma` is {self.sigma}, but must be >= 0")
        if not 0 <= self.straggler_prob <= 1:
            raise ValueError(f"`straggler_prob` is {self.straggler_prob}, but must be in [0, 1]")
        if self.straggler_factor < 1:
            raise ValueError(f"`straggler_factor` is {self.straggler_factor}, but must be >= 1")

    def factor(self, rng: np.random.Generator) -> float:
        f = float(rng.lognormal(-(self.sigma**2) / 2, self.sigma)) if self.sigma > 0 else 1.0
        if self.straggler_prob > 0 and rng.random() < self.straggler_prob:
            f *= self.straggler_factor
        return f


class SimulatedBackend(LocalBackend):
    """Simulated workers for `workload` (see the module docstring).

    Args:
        workload: unit times and which worker holds which partition.
        noise: unit-time noise and stragglers (the policies only see `workload.duration`).
        seed: seeds the noise.
        events: scheduled worker failures, returns and joins.
        objective: `objective(config, epoch) -> metrics` of one epoch (`train_*` / `valid_*` keys; a bare key counts
            as `valid_`), where `epoch` counts the epochs the weights have seen, inherited ones included. Raising,
            or a non-finite `*loss*`, fails the unit's config. None: units report no metrics.
        lose_state: (config_id, epoch, partition) of train units that find their config's state object gone.
    """

    def __init__(
        self,
        workload: Workload,
        noise: Noise | None = None,
        seed: int = 0,
        events: Iterable[WorkerEvent] = (),
        objective: Objective | None = None,
        lose_state: Iterable[tuple[int, int, int]] = (),
    ) -> None:
        super().__init__()
        self.workload, self.noise, self.objective = workload, noise or Noise(), objective
        self.rng = np.random.default_rng(seed)
        self.lose_state = set(lose_state)
        self._n_train = len(workload.train_partitions)
        self._metrics: dict[tuple[int, int], tuple[dict[str, float], dict[str, float]] | str] = {}
        for e in sorted(events, key=lambda e: e.time):
            if not 0 <= e.worker < workload.n_workers:
                raise ValueError(f"event worker {e.worker} is not in 0..{workload.n_workers - 1}")
            if e.kind == FAIL:
                self._at(e.time, WorkerLost(e.time, e.worker, "fail"))
            else:
                parts = [q for q, ws in workload.availability.items() if e.worker in ws]
                self._at(e.time, CommandReceived(e.time, "add", {"worker": e.worker, "partitions": parts}))

    def _new_worker(self, worker: int) -> Any:
        return worker

    def _load(self, worker: int, parts: frozenset[int], fault: str | None) -> tuple[float, Event]:
        if fault is not None:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died while loading", loading=True)
        return 0.0, WorkerJoined(0.0, worker, parts, {"data_bytes": 0})

    def _execute(self, worker: int, ticket: int, task: UnitTask, state: Any) -> tuple[float, Event] | None:
        unit = task.unit
        seconds = self.workload.duration(unit, worker) * self.noise.factor(self.rng)
        if task.fault == "hang":  # the simulated health check sees it when the unit should have ended
            self.workers.pop(worker, None)
            return seconds, WorkerLost(0.0, worker, f"hung: {unit} (injected)", started=(ticket,))
        if task.fault == "kill_worker":
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died (injected kill)", started=(ticket,))
        if task.fault == "lose_state" or (unit.config_id, unit.epoch, unit.partition) in self.lose_state:
            self.lose_state.discard((unit.config_id, unit.epoch, unit.partition))
            return 0.0, StateLost(0.0, ticket, worker, LookupError(f"the state object of {unit} is lost"))
        state = state or {"visited": {}, "trained": 0}
        report = UnitReport(unit, worker, 0.0, 0.0, num_examples=1)
        weights_epoch = state["trained"] // max(self._n_train, 1)
        if unit.kind != TRAIN:
            weights_epoch -= 1  # evaluated after the epoch's training units
        metrics = self._objective(task.config, unit.config_id, weights_epoch)
        if isinstance(metrics, str) or task.fault == "raise":
            report.error = metrics if isinstance(metrics, str) else "InjectedFault: injected fault"
            return seconds, UnitFailed(0.0, ticket, worker, report)
        report.metrics = dict(metrics[0] if unit.kind == TRAIN else metrics[1])
        if unit.kind != TRAIN:
            return seconds, UnitDone(0.0, ticket, worker, report, None)
        visited = {e: list(ps) for e, ps in state["visited"].items()}
        visited.setdefault(unit.epoch, []).append(unit.partition)
        return seconds, UnitDone(0.0, ticket, worker, report, {"visited": visited, "trained": state["trained"] + 1})

    def _objective(self, config: dict, config_id: int, epoch: int) -> tuple[dict, dict] | str:
        """(train metrics, valid metrics) of the config's weights after `epoch` epochs, or a traceback."""
        if self.objective is None:
            return {}, {}
        key = (config_id, epoch)
        if key not in self._metrics:
            try:
                out = dict(self.objective(dict(config), max(epoch, 0)))
                train = {k[6:]: float(v) for k, v in out.items() if k.startswith("train_")}
                valid = {k[6:] if k.startswith("valid_") else k: float(v) for k, v in out.items()
                         if not k.startswith("train_")}
                for k, v in (*train.items(), *valid.items()):
                    if "loss" in k and not math.isfinite(v):
                        what = "NaN" if math.isnan(v) else "infinite"
                        raise FloatingPointError(f"the objective returned a {what} loss: {k} = {v}")
                self._metrics[key] = (train, valid)
            except Exception:  # noqa: BLE001 - a failure of the objective fails its config, as user code would
                self._metrics[key] = traceback.format_exc()
        return self._metrics[key]
