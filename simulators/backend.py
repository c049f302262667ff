"""`SimulatedBackend`: the driver's backend on a simulated clock, so a simulation runs the real driver loop.

Units take the workload's unit time (times `Noise`), nothing is trained: a unit's metrics come from an optional
`objective(config, epoch)` (the same contract as `simulators.run_procedure_offline`), its state is a small dict with the visit
record. Worker failures, returns and joins are scheduled `WorkerEvent`s on the same clock: a failure is reported as
a lost worker, a return or a join as the offer of that worker with its partitions (`WorkerOffered`). Everything else (the event
heap, same-time events delivered together, hung units) is `framework.engine.clock.ClockBackend`'s, which
`LocalBackend` shares, so the simulation imports neither torch nor the engine's `Worker`.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from framework.engine._base import (
    Event,
    StateLost,
    UnitDone,
    UnitFailed,
    WorkerJoined,
    WorkerLost,
    WorkerOffered,
)
from framework.engine.clock import ClockBackend
from framework.engine.faults import DIE, HANG, LOSE_STATE, RAISE, STRETCH, Fault
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitReport, UnitTask
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
        """One draw of the multiplier on a unit's estimated time (1.0 when `sigma` and `straggler_prob` are 0).

        Lognormal with mean 1 (`sigma` is the standard deviation of its log), times `straggler_factor` with
        probability `straggler_prob`. Draws from `rng` only for the parts that are on.
        """
        f = float(rng.lognormal(-(self.sigma**2) / 2, self.sigma)) if self.sigma > 0 else 1.0
        if self.straggler_prob > 0 and rng.random() < self.straggler_prob:
            f *= self.straggler_factor
        return f


@dataclass(frozen=True)
class CostModel:
    """How long a gang or a pack unit takes, from the workload's time `t(config, worker)` of a unit of its own.

    gang (k workers, data-parallel): each worker takes a 1/k share of the partition's pass and the gang
    all-reduces its gradients: `max_w t(c, w) / k + comm_s * 2 (k - 1) / k` (a ring all-reduce).
    pack (m configs fused on one worker, one state): one pass feeds every member:
    `max_c t(c, w) + pack_overhead * (sum_c t(c, w) - max_c t(c, w))`; `pack_overhead` 1 is no sharing (the sum),
    0 is members that ride free. A gang of packs composes the two.
    """

    comm_s: float = 0.0
    pack_overhead: float = 1.0

    def __post_init__(self) -> None:
        if not self.comm_s >= 0:
            raise ValueError(f"`comm_s` is {self.comm_s!r}, but must be >= 0")
        if not 0 <= self.pack_overhead <= 1:
            raise ValueError(f"`pack_overhead` is {self.pack_overhead!r}, but must be in [0, 1]")

    def seconds(self, duration: Callable[[Unit, int], float], units: tuple[Unit, ...], workers: tuple[int, ...],
                partitions: tuple[int, ...] = ()) -> float:
        """`partitions`: the partition each worker of a gang trains (a gang over several partitions: each worker
        passes over its own, or its share of one that several have; the gang takes as many steps as its longest
        share, and the all-reduce term grows with them: `comm_s * 2 (k - 1) / k` per 1/k of a pass)."""
        if partitions:
            u0 = units[0]
            sharers = {p: partitions.count(p) for p in partitions}
            pass_s = max(duration(Unit(u0.config_id, u0.epoch, p, u0.kind), w) / sharers[p]
                         for w, p in zip(workers, partitions))
            return pass_s + self.all_reduce_seconds(workers, partitions)
        per = [max(duration(u, w) for w in workers) for u in units]  # each member's pass on the gang's slowest
        top = max(per)
        pass_s = top + self.pack_overhead * (sum(per) - top)
        return pass_s / len(workers) + self.all_reduce_seconds(workers, partitions)

    def all_reduce_seconds(self, workers: tuple[int, ...], partitions: tuple[int, ...] = ()) -> float:
        """The all-reduce part of a gang's unit (0 for one worker): `comm_s * 2 (k - 1) / k` per 1/k of a pass, the
        gang taking as many steps as its longest share of a partition."""
        k = len(workers)
        if k == 1:
            return 0.0
        longest = max(1 / partitions.count(p) for p in partitions) if partitions else 1 / k
        return self.comm_s * 2 * (k - 1) / k * longest * k


class SimulatedBackend(ClockBackend):
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
        cost: how long gang and pack units take (`CostModel`); units of their own take the workload's time.

    A state handle is the state itself (a small dict, `ClockBackend.get`).
    """

    def __init__(
        self,
        workload: Workload,
        noise: Noise | None = None,
        seed: int = 0,
        events: Iterable[WorkerEvent] = (),
        objective: Objective | None = None,
        lose_state: Iterable[tuple[int, int, int]] = (),
        cost: CostModel | None = None,
    ) -> None:
        super().__init__()
        self.workload, self.noise, self.objective = workload, noise or Noise(), objective
        self.cost = cost or CostModel()
        self.rng = np.random.default_rng(seed)
        self.lose_state = set(lose_state)
        self._n_train = len(workload.train_partitions)
        self._noisy = self.noise.sigma > 0 or self.noise.straggler_prob > 0  # else every factor is 1, drawing nothing
        self._metrics: dict[tuple[int, int], tuple[dict[str, float], dict[str, float]] | str] = {}
        for e in sorted(events, key=lambda e: e.time):
            if not 0 <= e.worker < workload.n_workers:
                raise ValueError(f"event worker {e.worker} is not in 0..{workload.n_workers - 1}")
            if e.kind == FAIL:
                self._at(e.time, WorkerLost(e.time, e.worker, "fail"))
            else:
                parts = [q for q, ws in workload.availability.items() if e.worker in ws]
                self._at(e.time, WorkerOffered(e.time, e.worker, tuple(parts)))

    def _new_worker(self, worker: int) -> Any:
        return worker

    def _load(self, worker: int, parts: frozenset[int], fault: Fault | None) -> tuple[float, Event]:
        if fault is not None and fault.spec.effect == DIE:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died while loading", loading=True)
        return 0.0, WorkerJoined(0.0, worker, parts, {"data_bytes": 0})

    def _execute(self, workers: tuple[int, ...], ticket: int, task: UnitTask, state: Any) -> tuple[float, Event] | None:
        if (task.fault is None and len(workers) == 1 and len(task.members) <= 1 and not task.partitions
                and not (self.lose_state and (task.unit.config_id, task.unit.epoch, task.unit.partition)
                         in self.lose_state)):
            return self._execute_one(workers[0], ticket, task, state)
        units = task.units
        worker = workers[0]
        if len(units) == 1 and len(workers) == 1:
            seconds = self.workload.duration(units[0], worker)
        else:
            seconds = self.cost.seconds(self.workload.duration, units, workers, task.partitions)
        factor = self.noise.factor(self.rng)
        seconds *= factor
        unit = task.unit
        # an injected fault's effect (`framework.engine.faults.FaultKind.effect`), acted out on the simulated clock
        effect = task.fault.spec.effect if task.fault is not None else None
        if effect == HANG:  # the simulated health check sees it when the unit should have ended
            self.workers.pop(worker, None)
            return seconds, WorkerLost(0.0, worker, f"hung: {unit} (injected)", started=(ticket,))
        if effect == DIE:
            self.workers.pop(worker, None)
            return 0.0, WorkerLost(0.0, worker, "died (injected kill)", started=(ticket,))
        if effect == STRETCH:
            seconds += task.fault.seconds
        fail = effect == RAISE
        if effect == LOSE_STATE or (unit.config_id, unit.epoch, unit.partition) in self.lose_state:
            self.lose_state.discard((unit.config_id, unit.epoch, unit.partition))
            return 0.0, StateLost(0.0, ticket, worker, LookupError(f"the state object of {unit} is lost"))
        group = ticket if len(units) > 1 or len(workers) > 1 else None
        reports, new_states = [], []
        if task.partitions and len(task.members) <= 1:  # a gang over several partitions: one state absorbs them all
            for u in units:
                w = workers[task.partitions.index(u.partition)]
                report, new = self._member(u, task.config, state, w, group, fail)
                state = new if new is not None else state
                reports.append(report)
                new_states.append(new)
        else:
            states = state if len(units) > 1 else (state,)
            for u, config, s in zip(units, task.configs or (task.config,), states):
                report, new = self._member(u, config, s, worker, group, fail)
                reports.append(report)
                new_states.append(new)
        if len(workers) > 1:  # what the gang's all-reduces took (a live worker measures it)
            comm = self.cost.all_reduce_seconds(workers, task.partitions) * factor
            for r in reports:
                r.comm_s = comm
        if all(r.error is not None for r in reports):
            return seconds, UnitFailed(0.0, ticket, worker, tuple(reports))
        return seconds, UnitDone(0.0, ticket, worker, tuple(reports), tuple(new_states))

    def _execute_one(self, worker: int, ticket: int, task: UnitTask, state: Any) -> tuple[float, Event]:
        """What `_execute` does for the most common assignment, in one step: a unit of its own on one worker, with
        no fault to act out (the same clock, draws and reports as the general path)."""
        unit = task.unit
        seconds = self.workload.duration(unit, worker)
        if self._noisy:
            seconds *= self.noise.factor(self.rng)
        report, new = self._member(unit, task.config, state, worker, None, False)
        if report.error is not None:
            return seconds, UnitFailed(0.0, ticket, worker, (report,))
        return seconds, UnitDone(0.0, ticket, worker, (report,), (new,))

    def _member(self, unit: Unit, config: dict, state: Any, worker: int, group: int | None,
                fail: bool) -> tuple[UnitReport, Any]:
        """One member's report and new state (None for eval units and failures)."""
        state = state or {"visited": {}, "trained": 0}
        weights_epoch = state["trained"] // (self._n_train or 1)
        if unit.kind != TRAIN:
            weights_epoch -= 1  # evaluated after the epoch's training units
        metrics = self._objective(config, unit.config_id, weights_epoch)
        if isinstance(metrics, str) or fail:
            error = metrics if isinstance(metrics, str) else "InjectedFault: injected fault"
            return UnitReport(unit, worker, 0.0, 0.0, num_examples=1, error=error, group=group), None
        report = UnitReport(unit, worker, 0.0, 0.0, dict(metrics[0] if unit.kind == TRAIN else metrics[1]),
                            num_examples=1, group=group)
        if unit.kind != TRAIN:
            return report, None
        visited = dict(state["visited"])  # states are never changed in place: only this epoch's list is new
        visited[unit.epoch] = [*visited.get(unit.epoch, ()), unit.partition]
        return report, {"visited": visited, "trained": state["trained"] + 1}

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
