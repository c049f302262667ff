"""Which parallelism each config trains with: model hopping (MOP), data-parallel gangs, or a plan that mixes them.

MOP keeps every worker busy while there are at least as many active configs as workers; below that, workers idle.
A data-parallel gang of k workers shares each of a config's passes (each member a 1/k share of the partition's
batches, gradients averaged at every step: `framework.engine.gang`), at the price of an all-reduce per step.
Policies (each a `Scheduler`, the engine's and the simulators' alike):

    MOP (`"randomized"`, ...)   one config per worker, configs hop
    DataParallel                every config as one gang over all workers, one config at a time
    CerebroSwitch               MOP while more than p/2 configs are active, else data parallel (Cerebro, VLDB 2020,
                                section 5.7 and appendix D: the crossover of its Figure 17)
    ParallelismPlanner          for each config, hop or a gang of k, and when, from one CP-SAT model (Saturn's
                                SPASE, Nagrecha and Kumar, VLDB 2024): each config's remaining work takes k workers
                                for `units x (t / k + all-reduce(k))`, k = 1 being a hop; at most p workers at any
                                time; minimise the makespan. A greedy plan warm-starts it, and wins when the solver
                                does not beat it.

A gang's workers must each hold the unit's partition (`DispatchState.can_start`), so gangs need partitions that
several workers hold (the simulators' crossover study gives every worker every partition). The cost of a gang unit
follows `simulators.backend.CostModel`: `max_w t(c, w) / k + comm_s * 2 (k - 1) / k` (a ring all-reduce).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from framework.scheduling._base import DispatchState, Scheduler
from framework.scheduling.randomized import RandomizedScheduler
from framework.scheduling.units import Assignment, Unit


def gang_seconds(unit_s: float, k: int, comm_s: float) -> float:
    """Seconds of one unit on a gang of `k` (`unit_s`: on one worker): a 1/k share of the pass plus the all-reduce."""
    return unit_s / k + (comm_s * 2 * (k - 1) / k if k > 1 else 0.0)


def _configs(state: DispatchState) -> list[int]:
    """The configs with work left in the round (pending or running), ascending."""
    return sorted({u.config_id for u in state.pending} | {u.config_id for u in state.running})


def _next_unit(state: DispatchState, config_id: int, workers: Iterable[int]) -> Unit | None:
    """The config's first pending unit that every one of `workers` may start now."""
    workers = tuple(workers)
    for u in state.remaining(config_id):
        if all(state.is_eligible(u, w) for w in workers):
            return u
    return None


class DataParallel(Scheduler):
    """Every config as one gang over every live worker, one config at a time (the most work left first). Where
    not every worker holds a partition, a unit's gang is the workers that hold it."""

    name = "data_parallel"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def select(self, state: DispatchState) -> list[Assignment]:
        if state.running:
            return []
        workers = state.idle_workers()
        if not workers or len(workers) < len(state.workers):
            return []
        for c in sorted(_configs(state), key=lambda c: (-state.work_left(c), c)):
            best: tuple[Unit, tuple[int, ...]] | None = None
            for u in state.remaining(c):  # the unit with the most idle holders (every one, when all hold it)
                holders = tuple(w for w in workers if state.is_eligible(u, w))
                if holders and (best is None or len(holders) > len(best[1])):
                    best = (u, holders)
            if best is not None:
                return [Assignment(*best)]
        return []


class CerebroSwitch(Scheduler):
    """MOP (the randomized scheduler) while more than half the workers' count of configs is active, else data
    parallel. The switch is looked at every time the policy is asked; a data-parallel gang waits for the hops in
    flight to end."""

    name = "cerebro"

    def __init__(self, seed: int = 0) -> None:
        self.mop, self.dp = RandomizedScheduler(seed=seed), DataParallel(seed)

    def start_round(self, state: DispatchState) -> None:
        self.mop.start_round(state)

    def select(self, state: DispatchState) -> list[Assignment]:
        if len(_configs(state)) > len(state.workers) / 2:
            return self.mop.select(state)
        return self.dp.select(state)


class ParallelismPlanner(Scheduler):
    """A gang size per config and an order, from one CP-SAT model (see the module docstring); realized greedily:
    configs take their gang of idle workers in the planned order, hopping configs (k = 1) fill the workers no gang
    holds. Re-plans when the live workers change. `comm_s`: the all-reduce term of a gang unit (as `CostModel`).
    `sizes`: the gang sizes it considers (default: 1, 2, 4, ... up to the worker count, and the count itself)."""

    name = "planner"

    def __init__(self, seed: int = 0, comm_s: float = 0.0, time_limit_s: float = 2.0,
                 sizes: tuple[int, ...] | None = None) -> None:
        if not comm_s >= 0:
            raise ValueError(f"`comm_s` is {comm_s!r}, but must be >= 0")
        self.seed, self.comm_s, self.time_limit_s, self.sizes = seed, float(comm_s), float(time_limit_s), sizes
        self.mop = RandomizedScheduler(seed=seed)
        self.plan: dict[int, int] = {}  # config -> gang size (1: it hops)
        self.order: list[int] = []  # configs by planned start
        self.gangs: dict[int, tuple[int, ...]] = {}  # config -> the workers of its gang while it has one
        self.planned_makespan = math.nan
        self.solver_status = ""
        self._workers: frozenset[int] = frozenset()
        self._full: list[int] = []  # the workers that hold every partition the round needs (where gangs form)

    def start_round(self, state: DispatchState) -> None:
        self.mop.start_round(state)
        self._replan(state)

    def _replan(self, state: DispatchState) -> None:
        configs = _configs(state)
        p = len(state.workers)
        self._workers = frozenset(state.workers)
        self.gangs = {}
        if not configs or not p:
            self.plan, self.order = {}, []
            return
        work = {}
        for c in configs:  # (units left, a unit's mean seconds on each worker, fastest first)
            units = state.remaining(c)
            per = [sum(state.estimate(u, w) for u in units) / max(len(units), 1) for w in state.workers]
            work[c] = (len(units), tuple(sorted(per)))
        # a gang keeps its workers for all of a config's units, so each must hold every partition: gangs form among
        # the workers that hold them all (every worker, where every partition is everywhere)
        needed = {u.partition for c in configs for u in state.remaining(c)}
        self._full = sorted(w for w in state.workers if needed <= state.partitions_of(w))
        sizes = self.sizes or tuple(sorted({k for k in (2 ** i for i in range(p.bit_length())) if k <= p} | {p}))
        sizes = tuple(k for k in sizes if k <= max(len(self._full), 1)) or (1,)
        self.plan, self.order, self.planned_makespan, self.solver_status = plan_parallelism(
            work, p, sizes, self.comm_s, self.time_limit_s)

    def select(self, state: DispatchState) -> list[Assignment]:
        if frozenset(state.workers) != self._workers:
            self._replan(state)
        if all(self.plan.get(c, 1) == 1 for c in _configs(state)):
            return self.mop.select(state)  # nothing to gang: the hop policy as it is
        out: list[Assignment] = []
        live = set(_configs(state))
        for c in [c for c in self.gangs if c not in live]:
            del self.gangs[c]  # its work is done: its workers are free
        held = {w for ws in self.gangs.values() for w in ws}
        full = set(self._full)
        idle = [w for w in state.idle_workers() if w not in held and w in full]
        for c in self.order:  # gangs form in the planned order, from idle workers no gang holds
            k = self.plan.get(c, 1)
            if c not in live or k == 1 or c in self.gangs:
                continue
            if len(idle) < k:
                break  # the next gang waits for workers (the plan put it after what runs now)
            units = state.remaining(c)
            fastest = sorted(idle, key=lambda w: (sum(state.estimate(u, w) for u in units[:8]), w))[:k]
            self.gangs[c], idle = tuple(sorted(fastest)), [w for w in idle if w not in fastest]
        for c, ws in sorted(self.gangs.items()):
            unit = _next_unit(state, c, ws) if c not in state.busy_configs else None
            if unit is not None:
                out.append(Assignment(unit, ws))
        held = {w for ws in self.gangs.values() for w in ws}
        hoppers = [c for c in self.order if self.plan.get(c, 1) == 1 and c in live]
        taken: set[int] = set()
        for w in [w for w in state.idle_workers() if w not in held]:
            for c in hoppers:
                if c in taken or c in state.busy_configs:
                    continue
                unit = next((u for u in state.remaining(c) if state.is_eligible(u, w)), None)
                if unit is not None:
                    out.append(Assignment(unit, (w,)))
                    taken.add(c)
                    break
        return out


def plan_parallelism(work: dict[int, tuple[int, float]], workers: int, sizes: tuple[int, ...], comm_s: float,
                     time_limit_s: float = 2.0) -> tuple[dict[int, int], list[int], float, str]:
    """Gang size per config and a start order minimising the makespan (see the module docstring).

    `work[c] = (units left, seconds of one unit)`: one number for every worker, or one per worker, fastest first
    (a config that hops takes their mean; a gang, the slowest's: its members wait for the slowest, and which
    workers a gang gets depends on what else runs, so the plan does not count on the fast ones).
    Returns (size per config, configs by start, planned makespan in seconds, how it was found: "greedy" or the
    solver's status)."""
    from ortools.sat.python import cp_model

    configs = sorted(work)
    sizes = tuple(sorted(k for k in set(sizes) if 1 <= k <= workers)) or (1,)

    def unit_s(c: int, k: int) -> float:
        t = work[c][1]
        if isinstance(t, (int, float)):
            return float(t)
        return sum(t) / len(t) if k == 1 else t[-1]

    dur = {(c, k): work[c][0] * gang_seconds(unit_s(c, k), k, comm_s) for c in configs for k in sizes}
    greedy, greedy_span = _greedy_plan(configs, dur, workers, sizes)
    scale = 1000.0 / max(max(dur.values()), 1e-9) * 1000  # about 1e6 integer steps for the longest duration
    m = cp_model.CpModel()
    horizon = int(math.ceil(greedy_span * scale)) + 1
    end = m.NewIntVar(0, horizon, "makespan")
    chosen, starts, intervals, demands = {}, {}, [], []
    for c in configs:
        picks = []
        for k in sizes:
            d = max(1, int(round(dur[c, k] * scale)))
            on = m.NewBoolVar(f"x{c}_{k}")
            s = m.NewIntVar(0, horizon, f"s{c}_{k}")
            intervals.append(m.NewOptionalFixedSizeIntervalVar(s, d, on, f"i{c}_{k}"))
            demands.append(k)
            m.Add(s + d <= end).OnlyEnforceIf(on)
            chosen[c, k], starts[c, k] = on, s
            picks.append(on)
        m.AddExactlyOne(picks)
    m.AddCumulative(intervals, demands, workers)
    m.Minimize(end)
    for c in configs:  # the greedy plan as a hint
        k0, s0 = greedy[c]
        for k in sizes:
            m.AddHint(chosen[c, k], k == k0)
            if k == k0:
                m.AddHint(starts[c, k], int(round(s0 * scale)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.Solve(m)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and solver.ObjectiveValue() / scale < greedy_span * 0.999:
        plan = {c: next(k for k in sizes if solver.Value(chosen[c, k])) for c in configs}
        begin = {c: solver.Value(starts[c, plan[c]]) for c in configs}
        order = sorted(configs, key=lambda c: (begin[c], -plan[c], c))
        return plan, order, solver.ObjectiveValue() / scale, solver.StatusName(status)
    order = sorted(configs, key=lambda c: (greedy[c][1], -greedy[c][0], c))
    return {c: greedy[c][0] for c in configs}, order, greedy_span, "greedy"


def _greedy_plan(configs: list[int], dur: dict[tuple[int, int], float], workers: int,
                 sizes: tuple[int, ...]) -> tuple[dict[int, tuple[int, float]], float]:
    """The best of a few list schedules: one gang size for every config (all hop, all data parallel, and each size
    between), longest work first onto the earliest free workers. Returns (config -> (size, start), makespan)."""
    best: tuple[float, dict[int, tuple[int, float]]] | None = None
    for k in sizes:
        free = [0.0] * workers  # when each worker is next free
        plan = {}
        for c in sorted(configs, key=lambda c: (-dur[c, k], c)):
            free.sort()
            start = free[k - 1]  # the k earliest free workers start together
            for i in range(k):
                free[i] = start + dur[c, k]
            plan[c] = (k, start)
        span = max(free)
        if best is None or span < best[0]:
            best = (span, plan)
    return best[1], best[0]
