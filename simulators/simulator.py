"""The simulator: the real driver loop (`framework.driver`) on a `SimulatedBackend`.

`simulate(workload, scheduler, epochs=...)` trains every config of the workload for `epochs` barrier-separated
epochs with the policy the live engine would use, on a simulated clock: the same dispatch state, the same
recovery of failed workers (a failed worker's running unit is re-queued; the worker stays away until a scheduled
return), the same rule that a named scheduler is rebuilt from (seed, round) every round. Events that happen at
the same instant are applied together before the policy is asked again, as the live engine does with a batch of
completions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from automl import FixedEpochsProcedure, Procedure
from framework.driver import Driver, MemoryRunLog
from framework.options import SERIAL_QUEUE_DEPTH, RunOptions
from framework.scheduling import Scheduler, Unit, make_scheduler
from simulators.backend import FAIL, JOIN, RETURN, CostModel, Noise, Objective, SimulatedBackend, WorkerEvent
from simulators.workload import Workload

__all__ = ["FAIL", "JOIN", "RETURN", "Noise", "SimulationResult", "Simulator", "WorkerEvent", "simulate",
           "simulate_selection"]


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
    wall_s: float = 0.0  # how long the simulation itself took
    configs: pd.DataFrame | None = None  # `simulate_selection`: every config's status, epochs and last metric
    rounds: int = 0  # decisions committed

    @property
    def decision_ms_per_unit(self) -> float:
        """Wall-clock milliseconds the scheduler spent deciding (`decision_time_s`) per completed unit."""
        return 1000.0 * self.decision_time_s / max(len(self.schedule), 1)

    @property
    def events_per_s(self) -> float:
        """Unit events (completions and lost attempts) the driver handled per second of wall time."""
        return (len(self.schedule) + len(self.failed)) / max(self.wall_s, 1e-9)


class _Workload(FixedEpochsProcedure):
    """Every config of the workload (ids 0..n-1, empty dicts), trained for a fixed number of epochs."""

    def __init__(self, n_configs: int, epochs: int) -> None:
        super().__init__(epochs)
        self.n_configs = n_configs

    def configs(self) -> list[dict]:
        return [{} for _ in range(self.n_configs)]


class Simulator:
    """Run `scheduler` (a `Scheduler` or a registry name) on `workload` for `epochs` barrier-separated rounds.

    Args:
        workload: unit times and availability.
        scheduler: policy object (used unchanged, as the engine would) or name for `make_scheduler`.
        epochs: rounds; each round holds every config's units of that epoch.
        events: worker failures / returns / joins at given simulated times.
        noise: unit-time noise and stragglers; policies only see the estimates (`workload.duration`).
        seed: seeds the noise and, for a scheduler given by name, the policy.
        queue_depth: units a worker holds at once (the engine's `queue_depth`): a unit queued behind another starts
            when it ends, and its config is reserved meanwhile. Default `framework.options.SERIAL_QUEUE_DEPTH` (1,
            Cerebro's model); the engine's default is `RunOptions.queue_depth`.
        cost: how long gang and pack units take (`simulators.backend.CostModel`).
    """

    def __init__(
        self,
        workload: Workload,
        scheduler: Scheduler | str,
        epochs: int = 1,
        events: list[WorkerEvent] | tuple[WorkerEvent, ...] = (),
        noise: Noise | None = None,
        seed: int = RunOptions.seed,
        queue_depth: int = SERIAL_QUEUE_DEPTH,
        cost: CostModel | None = None,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"`epochs` is {epochs}, but must be >= 1")
        for e in events:
            if not 0 <= e.worker < workload.n_workers:
                raise ValueError(f"event worker {e.worker} is not in 0..{workload.n_workers - 1}")
        make_scheduler(scheduler, seed=seed)  # validates a name now
        self.workload, self.scheduler, self.epochs = workload, scheduler, epochs
        self.events = sorted(events, key=lambda e: e.time)
        self.noise, self.seed, self.queue_depth, self.cost = noise or Noise(), seed, queue_depth, cost

    def run(self) -> SimulationResult:
        """Simulate every config of the workload for `epochs` rounds and return what happened.

        Times in the result are simulated seconds, except `wall_s` and `decision_time_s` (the real clock).
        """
        return simulate_selection(_Workload(self.workload.n_configs, self.epochs), self.workload,
                                  scheduler=self.scheduler, events=self.events, noise=self.noise, seed=self.seed,
                                  queue_depth=self.queue_depth, cost=self.cost)


def simulate(workload: Workload, scheduler: Scheduler | str, **kwargs) -> SimulationResult:
    """`Simulator(workload, scheduler, **kwargs).run()`."""
    return Simulator(workload, scheduler, **kwargs).run()


def simulate_selection(
    procedure: Procedure,
    workload: Workload,
    objective: Objective | None = None,
    *,
    scheduler: Scheduler | str = RunOptions.scheduler,
    events: list[WorkerEvent] | tuple[WorkerEvent, ...] = (),
    noise: Noise | None = None,
    seed: int = RunOptions.seed,
    metric: str = RunOptions.metric,
    mode: str = RunOptions.mode,
    max_worker_restarts: int = 0,  # a failed simulated worker stays away until its scheduled return
    queue_depth: int = SERIAL_QUEUE_DEPTH,
    cost: CostModel | None = None,
) -> SimulationResult:
    """A whole model selection (`procedure` deciding, the driver recovering from `events`) on a simulated clock.

    Config i takes row i of `workload.times` (the workload needs at least as many rows as the procedure starts
    configs); its metrics come from `objective(config, epoch)` (see `SimulatedBackend`). The result's `configs`
    holds every config's status and history. `cost`: how long gang and pack units take (`CostModel`).
    """
    joining = {e.worker for e in events if e.kind == JOIN}
    placement = {w: [q for q, ws in workload.availability.items() if w in ws]
                 for w in range(workload.n_workers) if w not in joining}
    backend = SimulatedBackend(workload, noise, seed, events, objective=objective, cost=cost)
    log = MemoryRunLog()
    options = RunOptions(seed=seed, metric=metric, mode=mode, scheduler=scheduler,
                         max_worker_restarts=max_worker_restarts, reassign_partitions=False, queue_depth=queue_depth)
    driver = Driver(backend, procedure, log, placement, workload.train_partitions, options,
                    eval_partitions=list(workload.eval_partitions), estimate=workload.duration)
    t0 = time.perf_counter()
    driver.run()
    wall = time.perf_counter() - t0
    df, failed = log.schedule(), log.schedule(status="interrupted")
    dispatch = driver.run_state.dispatch
    configs = pd.DataFrame([{"config_id": c.id, "status": c.status, "epochs": len(c.history),
                             **({metric: c.history[-1].get(metric)} if c.history else {})}
                            for c in driver.run_state.configs])
    return SimulationResult(
        schedule=df, failed=failed, makespan=float(df["end"].max()) if len(df) else 0.0,
        epochs=int(configs["epochs"].max()) if len(configs) else 0, decision_time_s=dispatch.decision_s,
        n_select_calls=dispatch.select_calls,
        requeued=[Unit(int(r.config_id), int(r.epoch), int(r.partition), r.kind) for r in failed.itertuples()],
        wall_s=wall, configs=configs, rounds=driver.run_state.round)
