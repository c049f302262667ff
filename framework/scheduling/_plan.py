"""The offline contract: an open-shop problem, a `Schedule` (a plan with times), and an `OfflineSolver`.

Offline solvers (CP-SAT, the paper's MILP, the dense-schedule approximation) turn a `ShopProblem` (units, the workers
each unit may run on, and estimated durations) into a `Schedule`. The live engine never executes a `Schedule`'s
absolute times: `PlanScheduler` (plan.py) follows each worker's planned *order*, so the same plan also survives
drifting unit times, failures and the simulator's noise.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.units import TRAIN, Unit

#: solver statuses reported on a `Schedule`
OPTIMAL = "optimal"
FEASIBLE = "feasible"
HEURISTIC = "heuristic"
STATUSES = (OPTIMAL, FEASIBLE, HEURISTIC)


@dataclass(frozen=True)
class ShopProblem:
    """One round as an open shop: `durations[(unit, worker)]` for every worker allowed to run `unit`.

    Eval units of a config may only start after all its train units end (the engine's barrier inside a round).
    """

    units: tuple[Unit, ...]
    durations: Mapping[tuple[Unit, int], float]

    def __post_init__(self) -> None:
        opts: dict[Unit, list[tuple[int, float]]] = {}
        for (u, w), d in self.durations.items():
            if not (d >= 0 and math.isfinite(d)):
                raise ValueError(f"duration of {(u, w)} is {d}, but must be finite and >= 0")
            opts.setdefault(u, []).append((w, float(d)))
        for u in self.units:
            if u not in opts:
                raise ValueError(f"unit {u} has no worker in `durations`")
        object.__setattr__(self, "units", tuple(sorted(set(self.units))))
        object.__setattr__(self, "_opts", {u: sorted(v) for u, v in opts.items()})

    def options(self, unit: Unit) -> list[tuple[int, float]]:
        """(worker, duration) pairs of the workers that may run `unit`, by worker id."""
        return self._opts[unit]  # type: ignore[attr-defined]

    @property
    def workers(self) -> list[int]:
        return sorted({w for (_, w) in self.durations})

    @property
    def configs(self) -> list[int]:
        return sorted({u.config_id for u in self.units})

    def min_duration(self, unit: Unit) -> float:
        return min(d for _, d in self.options(unit))

    def lower_bound(self) -> float:
        """Max over configs of their cheapest total work, and over workers of the load they must carry.

        The worker side is max(forced load of the worker: units it alone can run, total cheapest work / #workers).
        Without replicas this is the classic open-shop bound max(max row sum, max column sum).
        """
        opts = self._opts  # type: ignore[attr-defined]
        config_work: dict[int, float] = {}
        forced: dict[int, float] = {}
        total = 0.0
        for u in self.units:
            best = min(d for _, d in opts[u])
            config_work[u.config_id] = config_work.get(u.config_id, 0.0) + best
            total += best
            if len(opts[u]) == 1:
                w, d = opts[u][0]
                forced[w] = forced.get(w, 0.0) + d
        n_workers = len({w for (_, w) in self.durations}) or 1
        return max([total / n_workers, *config_work.values(), *forced.values(), 0.0])

    @classmethod
    def from_state(cls, state: DispatchState) -> ShopProblem:
        """The pending units of a round with `state.estimate` on every live worker that holds their partition.

        Units whose partition has no live holder are left out (a plan-following policy treats them as unplanned)."""
        durations: dict[tuple[Unit, int], float] = {}
        for u in sorted(state.pending):
            for w in sorted(state.availability.get(u.partition, ())):
                if w in state.workers:
                    durations[(u, w)] = float(state.estimate(u, w))
        return cls(units=tuple(sorted({u for u, _ in durations})), durations=durations)

    @classmethod
    def from_matrix(cls, times: Iterable[Iterable[float]], epoch: int = 0) -> ShopProblem:
        """Classic open shop: `times[i][j]` is config i on partition j held by worker j alone."""
        durations = {}
        units = []
        for i, row in enumerate(times):
            for j, t in enumerate(row):
                u = Unit(i, epoch, j, TRAIN)
                units.append(u)
                durations[(u, j)] = float(t)
        return cls(units=tuple(units), durations=durations)


@dataclass(frozen=True)
class ScheduledUnit:
    unit: Unit
    worker: int
    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"`end` is {self.end}, but must be >= `start` {self.start}")


@dataclass(frozen=True)
class Schedule:
    """A plan: one (unit, worker, start, end) per unit, plus how it was obtained.

    Attributes:
        entries: scheduled units sorted by (start, worker).
        status: "optimal" (proven), "feasible" (solver stopped at its limit), or "heuristic" (no proof attempted).
        bound: the best lower bound known on the optimal makespan (the solver's proven bound, or the simple LB).
        solver: name of what produced it; runtime_s: wall time spent producing it.
    """

    entries: tuple[ScheduledUnit, ...]
    status: str = HEURISTIC
    bound: float = 0.0
    solver: str = ""
    runtime_s: float = 0.0
    info: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"`status` is {self.status!r}, but must be one of {STATUSES}")
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: (e.start, e.worker, e.unit))))

    @property
    def makespan(self) -> float:
        return max((e.end for e in self.entries), default=0.0)

    @property
    def optimal(self) -> bool:
        return self.status == OPTIMAL

    def worker_orders(self) -> dict[int, list[Unit]]:
        """worker -> its units in planned start order (what `PlanScheduler` follows)."""
        orders: dict[int, list[Unit]] = {}
        for e in self.entries:
            orders.setdefault(e.worker, []).append(e.unit)
        return orders

    def to_frame(self):  # -> pandas.DataFrame (imported lazily: the engine's hot path needs no pandas)
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "config_id": e.unit.config_id,
                    "epoch": e.unit.epoch,
                    "partition": e.unit.partition,
                    "worker": e.worker,
                    "kind": e.unit.kind,
                    "start": e.start,
                    "end": e.end,
                }
                for e in self.entries
            ],
            columns=["config_id", "epoch", "partition", "worker", "kind", "start", "end"],
        )


class OfflineSolver(abc.ABC):
    """Turns a `ShopProblem` into a `Schedule`. Pure Python (OR-Tools allowed), deterministic, picklable."""

    name: str = "offline"

    @abc.abstractmethod
    def solve(self, problem: ShopProblem) -> Schedule:
        """A feasible schedule of every unit of `problem` (status and bound filled in)."""


def native_seed(seed: int, bits: int = 31) -> int:
    """`seed` folded into `[0, 2**bits)`, the range a native solver's seed parameter takes (CP-SAT's is an int32).

    Run seeds and the per-wave seeds derived from them (`unit_seed`) are 63-bit: handed on unfolded, they overflow
    the solver's type.
    """
    return int(seed) % (1 << bits)


def left_shift(entries: Iterable[ScheduledUnit], duration) -> list[ScheduledUnit]:
    """Re-time a plan with `duration(unit, worker)`: keep every worker's and config's order, start each unit as early
    as its worker, its config and (for eval units) its config's training allow. Processing in planned start order is
    a topological order of those precedences, so one pass suffices."""
    worker_free: dict[int, float] = {}
    config_free: dict[int, float] = {}
    train_end: dict[int, float] = {}
    out: list[ScheduledUnit] = []
    ordered = sorted(entries, key=lambda e: (e.start, e.unit.kind != TRAIN, e.worker, e.unit))
    # eval units wait for all the config's training: collect its planned training end first
    train_units: dict[int, list[ScheduledUnit]] = {}
    for e in ordered:
        if e.unit.kind == TRAIN:
            train_units.setdefault(e.unit.config_id, []).append(e)
    pending_train = {c: len(v) for c, v in train_units.items()}
    deferred: dict[int, list[ScheduledUnit]] = {}

    def place(e: ScheduledUnit) -> None:
        c = e.unit.config_id
        start = max(worker_free.get(e.worker, 0.0), config_free.get(c, 0.0))
        if e.unit.kind != TRAIN:
            start = max(start, train_end.get(c, 0.0))
        end = start + float(duration(e.unit, e.worker))
        worker_free[e.worker] = end
        config_free[c] = end
        out.append(ScheduledUnit(e.unit, e.worker, start, end))

    for e in ordered:
        c = e.unit.config_id
        if e.unit.kind != TRAIN and pending_train.get(c, 0) > 0:
            deferred.setdefault(c, []).append(e)
            continue
        place(e)
        if e.unit.kind == TRAIN:
            train_end[c] = max(train_end.get(c, 0.0), out[-1].end)
            pending_train[c] -= 1
            if pending_train[c] == 0:
                for d in deferred.pop(c, []):
                    place(d)
    for ds in deferred.values():
        for d in ds:
            place(d)
    return out
