"""Discrete-event simulator: the live engine's policy objects on a simulated clock, over several epochs.

Events live in a heap keyed by (time, seq), so ties resolve in insertion order and every run is reproducible. All
events at the same instant are applied before the policy is asked again, exactly like the engine reacting to a batch
of completions. Failures, returns and joins act through `DispatchState.remove_worker` / `add_worker`, the same calls
the engine makes, so a failure re-queues exactly the units the failed worker was running.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from framework.scheduling import Assignment, DispatchState, Scheduler, Unit, make_scheduler
from simulators.validate import COLUMNS
from simulators.workload import Workload

FAIL, RETURN, JOIN = "fail", "return", "join"
_COMPLETE = "complete"


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


@dataclass
class SimulationResult:
    """`schedule`: one row per completed unit (validator columns); `failed`: attempts lost to failures."""

    schedule: pd.DataFrame
    failed: pd.DataFrame
    makespan: float
    epochs: int
    decision_time_s: float
    n_select_calls: int
    requeued: list[Unit] = field(default_factory=list)

    @property
    def decision_ms_per_unit(self) -> float:
        return 1000.0 * self.decision_time_s / max(len(self.schedule), 1)


class Simulator:
    """Run `scheduler` (a `Scheduler` or a registry name) on `workload` for `epochs` barrier-separated rounds.

    Args:
        workload: unit times and availability.
        scheduler: policy object (used unchanged, as the engine would) or name for `make_scheduler`.
        epochs: rounds; each round holds every config's units of that epoch.
        events: worker failures / returns / joins at given simulated times.
        noise: unit-time noise and stragglers; policies only see the estimates (`workload.duration`).
        seed: seeds the noise and, for a scheduler given by name, the policy.
    """

    def __init__(
        self,
        workload: Workload,
        scheduler: Scheduler | str,
        epochs: int = 1,
        events: list[WorkerEvent] | tuple[WorkerEvent, ...] = (),
        noise: Noise | None = None,
        seed: int = 0,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"`epochs` is {epochs}, but must be >= 1")
        for e in events:
            if not 0 <= e.worker < workload.n_workers:
                raise ValueError(f"event worker {e.worker} is not in 0..{workload.n_workers - 1}")
        self.workload = workload
        self.scheduler = make_scheduler(scheduler, seed=seed)
        self.epochs = epochs
        self.events = sorted(events, key=lambda e: e.time)
        self.noise = noise or Noise()
        self.seed = seed

    def _partitions_of(self, worker: int) -> list[int]:
        return [q for q, ws in self.workload.availability.items() if worker in ws]

    def _dispatch(self, state, now, heap, active, rng, seq: int, decision: float) -> tuple[int, float]:
        """Ask the policy (timed), start what it chose, schedule the completions. Returns (seq, decision time)."""
        t0 = time.perf_counter()
        chosen: list[Assignment] = self.scheduler.select(state)
        decision += time.perf_counter() - t0
        for a in chosen:
            state.start(a)
            d = self.workload.duration(a.unit, a.worker) * self.noise.factor(rng)
            active[a.unit] = (a.worker, now, seq)
            heapq.heappush(heap, (now + d, seq, _COMPLETE, a.unit))
            seq += 1
        return seq, decision

    def run(self) -> SimulationResult:
        wl, sched = self.workload, self.scheduler
        rng = np.random.default_rng(self.seed)
        heap: list[tuple[float, int, str, object]] = []
        seq = 0
        for e in self.events:
            heapq.heappush(heap, (e.time, seq, e.kind, e.worker))
            seq += 1
        live = set(range(wl.n_workers)) - {e.worker for e in self.events if e.kind == JOIN}
        rows: list[tuple] = []
        failed: list[tuple] = []
        requeued: list[Unit] = []
        active: dict[Unit, tuple[int, float, int]] = {}  # unit -> (worker, start, attempt seq)
        decision = 0.0
        calls = 0
        now = 0.0

        for epoch in range(self.epochs):
            avail = {q: [w for w in ws if w in live] for q, ws in wl.availability.items()}
            state = DispatchState(wl.units(epoch), avail, wl.duration)
            t0 = time.perf_counter()
            sched.start_round(state)
            decision += time.perf_counter() - t0

            seq, decision = self._dispatch(state, now, heap, active, rng, seq, decision)
            calls += 1
            while not state.finished:
                if not heap:
                    raise RuntimeError(
                        f"simulation stalled at t={now:g} in epoch {epoch}: {len(state.pending)} units pending, "
                        f"partitions {sorted(state.stalled_partitions())} have no live worker and no worker returns"
                    )
                now = heap[0][0]
                while heap and heap[0][0] <= now:
                    _, s, kind, payload = heapq.heappop(heap)
                    if kind == _COMPLETE:
                        unit = payload
                        att = active.get(unit)
                        if att is None or att[2] != s:
                            continue  # stale: its worker failed, the unit was re-queued
                        del active[unit]
                        state.complete(unit)
                        rows.append((unit.config_id, unit.epoch, unit.partition, att[0], unit.kind, att[1], now))
                    elif kind == FAIL:
                        if payload not in live:
                            continue
                        live.discard(payload)
                        for unit in state.remove_worker(payload):
                            w, start, _ = active.pop(unit)
                            failed.append((unit.config_id, unit.epoch, unit.partition, w, unit.kind, start, now))
                            requeued.append(unit)
                    else:  # RETURN / JOIN
                        if payload in live:
                            continue
                        live.add(payload)
                        state.add_worker(payload, self._partitions_of(payload))
                seq, decision = self._dispatch(state, now, heap, active, rng, seq, decision)
                calls += 1

        df = pd.DataFrame(rows, columns=COLUMNS)
        return SimulationResult(
            schedule=df,
            failed=pd.DataFrame(failed, columns=COLUMNS),
            makespan=float(df["end"].max()) if len(df) else 0.0,
            epochs=self.epochs,
            decision_time_s=decision,
            n_select_calls=calls,
            requeued=requeued,
        )


def simulate(workload: Workload, scheduler: Scheduler | str, **kwargs) -> SimulationResult:
    """`Simulator(workload, scheduler, **kwargs).run()`."""
    return Simulator(workload, scheduler, **kwargs).run()
