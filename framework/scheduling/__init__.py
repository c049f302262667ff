"""Scheduling policies shared by the live engine and the simulators (pure Python, no Ray)."""

from __future__ import annotations

from collections.abc import Callable

from framework.registry import Registry
from framework.scheduling._base import Scheduler
from framework.scheduling._plan import (
    FEASIBLE,
    HEURISTIC,
    OPTIMAL,
    OfflineSolver,
    Schedule,
    ScheduledUnit,
    ShopProblem,
    left_shift,
)
from framework.scheduling._replay import replay
from framework.scheduling.approx import DenseApproxSolver
from framework.scheduling.cpsat import CPSATSolver
from framework.scheduling.dispatch_state import DispatchState, greedy_select
from framework.scheduling.lookahead import LookaheadScheduler, LookaheadSolver
from framework.scheduling.lpt import LPTScheduler
from framework.scheduling.milp import MILPSolver
from framework.scheduling.mwr import MWRScheduler
from framework.scheduling.parallelism import CerebroSwitch, DataParallel, ParallelismPlanner
from framework.scheduling.plan import PlanScheduler
from framework.scheduling.randomized import RandomizedScheduler
from framework.scheduling.seeded import SeededOrderScheduler
from framework.scheduling.units import (
    EVAL,
    KINDS,
    TRAIN,
    Assignment,
    Unit,
    UnitReport,
    UnitTask,
    UnitTimeEstimate,
    epoch_metrics,
    unit_seed,
)


def _plan(solver_cls: type[OfflineSolver], name: str) -> Callable[..., Scheduler]:
    def factory(seed: int = 0, **options) -> Scheduler:
        return PlanScheduler(solver_cls(seed=seed, **options), seed=seed, name=name)

    factory.__name__ = f"{name}_plan"
    return factory


#: name -> factory(seed, **options) of every online policy the engine accepts as `scheduler=...`.
#: "cpsat", "milp" and "approx" solve the round at `start_round` and follow each worker's planned order.
SCHEDULERS: Registry[Callable[..., Scheduler]] = Registry("scheduler", {
    "randomized": RandomizedScheduler,
    "mwr": MWRScheduler,
    "lpt": LPTScheduler,
    "lookahead": LookaheadScheduler,
    "approx": _plan(DenseApproxSolver, "approx"),
    "cpsat": _plan(CPSATSolver, "cpsat"),
    "milp": _plan(MILPSolver, "milp"),
    "data_parallel": DataParallel,
    "cerebro": CerebroSwitch,
    "planner": ParallelismPlanner,
})
#: the policies above that form data-parallel gangs
GANG_POLICIES = ("data_parallel", "cerebro", "planner")

#: name -> offline solver class (ShopProblem -> Schedule)
SOLVERS: Registry[type[OfflineSolver]] = Registry("solver", {
    "approx": DenseApproxSolver,
    "cpsat": CPSATSolver,
    "milp": MILPSolver,
    "lookahead": LookaheadSolver,
})


def make_scheduler(name: str | Scheduler, seed: int = 0, **options) -> Scheduler:
    """A scheduler by name (see `SCHEDULERS`), or `name` itself when it already is a `Scheduler`.

    `options` go to the factory, e.g. `make_scheduler("cpsat", time_limit_s=5)`; unknown ones raise `TypeError`.
    """
    if isinstance(name, Scheduler):
        return name
    return SCHEDULERS.lookup(name, "scheduler", " or a Scheduler instance")(seed=seed, **options)


__all__ = [
    "EVAL",
    "FEASIBLE",
    "HEURISTIC",
    "KINDS",
    "OPTIMAL",
    "SCHEDULERS",
    "GANG_POLICIES",
    "CerebroSwitch",
    "DataParallel",
    "ParallelismPlanner",
    "SOLVERS",
    "TRAIN",
    "Assignment",
    "CPSATSolver",
    "DenseApproxSolver",
    "DispatchState",
    "LPTScheduler",
    "LookaheadScheduler",
    "LookaheadSolver",
    "MILPSolver",
    "MWRScheduler",
    "OfflineSolver",
    "PlanScheduler",
    "RandomizedScheduler",
    "Schedule",
    "ScheduledUnit",
    "Scheduler",
    "SeededOrderScheduler",
    "ShopProblem",
    "Unit",
    "UnitReport",
    "UnitTask",
    "UnitTimeEstimate",
    "epoch_metrics",
    "greedy_select",
    "left_shift",
    "make_scheduler",
    "replay",
    "unit_seed",
]
