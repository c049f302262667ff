"""Which parallelism each config trains with: model hopping (MOP), data-parallel gangs, or a plan that mixes them.

MOP keeps every worker busy while there are at least as many active configs as workers; below that, workers idle.
A data-parallel gang of k workers trains one config in a synchronous pass (`framework.engine.gang`: gradients
averaged at every step), each worker over a partition of the config's that it holds, so a gang step does k of the
config's units at once, at the price of an all-reduce per step (`form_gang`; workers that hold no distinct partition
share one's pass, where partitions are replicated). Data stays where it is: a gang forms, step by step, among the
workers that hold the config's pending partitions.
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

Per unit of work, a gang's cost follows `simulators.backend.CostModel`: `t / k + comm_s * 2 (k - 1) / k` (a ring
all-reduce), whether its k workers pass over k partitions or share one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from framework.scheduling._base import Scheduler
from framework.scheduling.cpsat import bound_by_work, wall_stopped
from framework.scheduling.dispatch_state import DispatchState
from framework.scheduling.randomized import RandomizedScheduler
from framework.scheduling.units import TRAIN, Assignment, Unit


def gang_seconds(unit_s: float, k: int, comm_s: float) -> float:
    """Seconds of one unit on a gang of `k` (`unit_s`: on one worker): a 1/k share of the pass plus the all-reduce."""
    return unit_s / k + (comm_s * 2 * (k - 1) / k if k > 1 else 0.0)


def _configs(state: DispatchState) -> list[int]:
    """The configs with work left in the round (pending or running), ascending."""
    return sorted({u.config_id for u in state.pending} | {u.config_id for u in state.running})


def form_gang(state: DispatchState, config_id: int, workers: Iterable[int], size: int | None = None,
              idle: bool = True) -> Assignment | None:
    """A gang of up to `size` of `workers` (default: all) for the config's next step, or None: each worker takes a
    distinct pending partition of the config that it holds (training units first, eval once training is done);
    workers left over share the pass of a partition they hold that the gang trains (fewest sharers first). A
    gang of one is a hop. Partitions stay where they are: only workers that hold a unit's partition can take it.
    `idle=False`: among `workers` whether idle or not (the gang the config could have once they are)."""
    idle = [w for w in workers if w in state._idle] if idle else list(workers)
    units = [u for u in state.remaining(config_id) if u in state.pending and state._kind_ok(u)]
    if not idle or not units or config_id in state.busy_configs:
        return None
    kind = min(u.kind != "train" for u in units)  # train units first
    units = [u for u in units if (u.kind != "train") == kind]
    options = {w: [u for u in units if w in state.availability.get(u.partition, ())] for w in idle}
    size = len(idle) if size is None else size
    chosen: dict[int, Unit] = {}
    taken: set[int] = set()
    for w in sorted(idle, key=lambda w: (len(options[w]), w)):  # the most constrained workers choose first
        if len(chosen) == size:
            break
        u = next((u for u in options[w] if u.partition not in taken), None)
        if u is not None:
            chosen[w] = u
            taken.add(u.partition)
    for w in idle:  # the rest share a pass (only where every worker of the gang holds every partition, in effect)
        if len(chosen) >= size or w in chosen:
            continue
        shares = [u for u in options[w] if u.partition in taken]
        if shares:
            chosen[w] = min(shares, key=lambda u: (sum(v == u for v in chosen.values()), u))
    if not chosen:
        return None
    ws = tuple(sorted(chosen))
    return Assignment(chosen[ws[0]], ws, partitions=tuple(chosen[w].partition for w in ws))


class DataParallel(Scheduler):
    """Every config as one gang over every live worker, one config at a time (the most work left first): each
    worker trains a distinct pending partition of the config that it holds (`form_gang`), so with one partition
    per worker a gang's step is an epoch."""

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
            gang = form_gang(state, c, workers)
            if gang is not None:
                return [gang]
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


#: a re-plan's plan replaces the one being followed only if it is this much shorter (under the latest costs)
REPLAN_MARGIN = 0.05
#: without a `time_limit_s`, the solver gets this share of the greedy plan's makespan, within `SOLVE_BOUNDS_S`:
#: a plan of what is left of a seconds-long run must not take seconds to make (the workers wait while it is made)
SOLVE_SHARE = 0.02
SOLVE_BOUNDS_S = (0.01, 2.0)
#: a budget is deterministic work, never seconds (the same inputs, the same plan, on any machine under any load):
#: CP-SAT's deterministic time per reference second of budget. Measured on this model (plans of 20-50 configs on 16
#: workers, 2-core x86, per CPU second): a solve stopped at a wall limit of 1-2 s had done 0.07-0.15 units, one of
#: 0.2 s 0.05-0.10, one of 0.01-0.1 s 0.015-0.03 (mostly presolve, which counts little). At 0.1 a budget of 0.2-2 s
#: takes 0.6-2x its seconds of CPU, one of 0.02 s 2.5-6x (50-120 ms), with plans as good or better.
WORK_PER_S = 0.1
SCALE_STEPS = 2000
#: measuring its costs, the planner has a config it gangs hop one unit again after this many gang steps, where the
#: plan's gain of the gang over a hop is under `PROBE_GAIN` (a unit measured alone under other load goes stale; a
#: probe costs at most that gain on one unit)
PROBE_EVERY, PROBE_GAIN = 4, 0.25
#: the end of a plan's status where the wall-clock safety stop, not the deterministic budget, ended its solve
WALL_STOP = " (wall stop)"


class ParallelismPlanner(Scheduler):
    """A gang size per config and an order, from one CP-SAT model (see the module docstring); realized greedily: at
    every step, configs planned as gangs form theirs from the idle workers in the planned order (a gang that cannot
    get its size waits, and the ones after it with it), hopping configs (k = 1) fill the idle workers left.

    Costs: each config's unit times as measured (`DispatchState.estimate`), and the all-reduce term `comm_s` of
    `gang_seconds`: as given, or (None) as measured from the gangs that ran (`DispatchState.comm_s`; 0 until one
    has). That model is Saturn's guess before profiling; what a gang of k of a config's then takes is measured
    (`DispatchState.unit_s`) and replaces it, and the median measured/modelled ratio of each size (or of the
    nearest size measured) corrects the model for the configs that have not run one (`_learn`): where gangs do not
    pay (workers sharing cores, a slow network), a step shows it, and the configs hop. Told nothing
    (`comm_s=None`), it hops until a unit has been measured on its own, the baseline every gang is compared with,
    tries one gang of a size not yet measured at a time (the others hop meanwhile), and has a config it gangs for
    little gain hop a unit again now and then (`PROBE_EVERY`): that baseline, measured under other load, goes stale.
    Re-plans when the live workers change, when the measured all-reduce cost moves by a quarter, when a planned
    gang's measured cost is a quarter off what the plan assumed, and when a config's work ends and leaves workers
    the plan does not use; a re-plan's plan is followed only if it is `REPLAN_MARGIN` shorter than the current one
    costed the same way. `sizes`: the gang sizes it considers (default: 1, 2, 4, ... up to the worker count, and the
    count itself). `time_limit_s`: the solver's budget per plan; None (default) scales it to the work: `SOLVE_SHARE`
    of the greedy plan's makespan, within `SOLVE_BOUNDS_S`, and 1 / (n + 1)^2 of that for the n-th re-plan in a row
    (re-plans can come often, on heterogeneous workers where each gang's measured cost depends on which workers it
    got). A budget is in reference seconds of deterministic work (`WORK_PER_S`), so the same run plans the same on
    any machine under any load; a solve its wall-clock safety stop cut short instead is counted in `wall_stops` and
    its plan's `solver_status` ends in "(wall stop)". Workers wait while a plan is made; `plan_seconds` adds up the
    (wall) time spent making them."""

    name = "planner"

    def __init__(self, seed: int = 0, comm_s: float | None = None, time_limit_s: float | None = None,
                 sizes: tuple[int, ...] | None = None) -> None:
        if comm_s is not None and not comm_s >= 0:
            raise ValueError(f"`comm_s` is {comm_s!r}, but must be >= 0 (or None: measured)")
        if time_limit_s is not None and not time_limit_s > 0:
            raise ValueError(f"`time_limit_s` is {time_limit_s!r}, but must be > 0 (or None: scaled to the work)")
        self.seed, self.sizes = seed, sizes
        self.time_limit_s = None if time_limit_s is None else float(time_limit_s)
        self.comm_s = None if comm_s is None else float(comm_s)
        self.mop = RandomizedScheduler(seed=seed)
        self.plan: dict[int, int] = {}  # config -> gang size (1: it hops)
        self.order: list[int] = []  # configs by planned start
        self.planned_makespan = math.nan
        self.solver_status = ""
        self.replans = 0  # plans made after the round's first
        self.plan_seconds = 0.0  # wall seconds spent making plans (the workers wait meanwhile)
        self.wall_stops = 0  # plans whose solve the wall-clock safety stop cut short (they depend on the machine)
        self._workers: frozenset[int] = frozenset()
        self._comm_used = 0.0  # the all-reduce cost the plan was made with
        self._unit_s: dict[int, float] = {}  # a planned gang's seconds per unit, as the plan assumed
        self._ratios: dict[int, dict[int, float]] = {}  # k -> config -> measured / modelled seconds of its gang
        self._sizes_seen: set[int] = set()  # the sizes measured (any config's) when the plan was made
        self._measured = 0  # how many (config, size) measurements there were then
        self._attempts = 0  # re-plans tried since the last plan made afresh (each gets a smaller solver budget)
        self._hop_s: dict[int, float | None] = {}  # a planned gang's config: its hop's measured seconds then
        self._steps: dict[int, int] = {}  # config -> gang steps since its hop was measured (or probed)

    def start_round(self, state: DispatchState) -> None:
        self.mop.start_round(state)
        self._replan(state)

    def _comm(self, state: DispatchState) -> float:
        return self.comm_s if self.comm_s is not None else (state.comm_s or 0.0)

    def _replan(self, state: DispatchState, keep: bool = False) -> None:
        """Plan what is left; `keep`: unless the new plan beats the current one by `REPLAN_MARGIN`."""
        configs = _configs(state)
        p = len(state.workers)
        self._workers, self._comm_used = frozenset(state.workers), self._comm(state)
        if not configs or not p:
            self.plan, self.order = {}, []
            return
        sizes = self.sizes or tuple(sorted({k for k in (2 ** i for i in range(p.bit_length())) if k <= p} | {p}))
        work = {}
        for c in configs:  # (units left, a unit's mean seconds on each worker, fastest first, measured gangs')
            units = [u for u in state.remaining(c) if u.kind == TRAIN]  # (evaluation is a small share, and its
            # times are not known before the round's training ends: they would blur what training costs)
            per = [sum(state.estimate(u, w) for u in units) / max(len(units), 1) for w in state.workers]
            gangs = {k: v for (c2, k), v in state.unit_s.items() if c2 == c and k > 1}
            work[c] = (len(units), tuple(sorted(per)), gangs)
        self._learn(work, sizes)
        t0 = time.perf_counter()
        self._attempts = self._attempts + 1 if keep else 0
        plan, order, span, status = plan_parallelism(work, p, sizes, self._comm_used, self.time_limit_s,
                                                     budget_scale=1 / (1 + self._attempts) ** 2)
        self.plan_seconds += time.perf_counter() - t0
        self.wall_stops += status.endswith(WALL_STOP)
        if keep and all(c in self.plan for c in configs):
            old = {c: min(max(self.plan[c], 1), p) for c in configs}
            dur = _durations(work, {k for k in old.values()} | set(sizes), self._comm_used)
            _, old_span = _list_schedule(configs, dur, p, old)
            if span < old_span * (1 - REPLAN_MARGIN):
                self.replans += 1
                self.plan, self.order, self.planned_makespan, self.solver_status = plan, order, span, status
        else:
            self.replans += bool(self.plan)
            self.plan, self.order, self.planned_makespan, self.solver_status = plan, order, span, status
        self._sizes_seen, self._measured = {k for _, k in state.unit_s}, len(state.unit_s)
        # what the plan followed now assumes of its gangs (a kept plan: under the latest costs)
        dur = _durations(work, {self.plan.get(c, 1) for c in configs}, self._comm_used)
        self._unit_s = {c: dur[c, self.plan[c]] / max(work[c][0], 1) for c in configs if self.plan.get(c, 1) > 1}
        self._hop_s = {c: state.unit_s.get((c, 1)) for c in self._unit_s}

    def _learn(self, work: dict[int, tuple], sizes: tuple[int, ...]) -> None:
        """Where a config's gang of k has run, how far off the cost model was (measured / modelled seconds); a
        config's gang of a size it has not run is costed as the model's times the median of those of that size,
        or of the nearest size measured (`work` gains them), so one measurement corrects the plan of every config.
        (A gang can come out smaller than planned: fewer of its config's partitions were left.)"""
        measured_sizes = {k for w in work.values() for k in w[2]}
        model = _durations({c: w[:2] for c, w in work.items()}, set(sizes) | measured_sizes, self._comm_used)
        for c, (n, _, measured) in work.items():
            for k, seconds in measured.items():
                if model[c, k] > 0:
                    self._ratios.setdefault(k, {})[c] = seconds * n / model[c, k]
        if not self._ratios:
            return
        for c, (n, _, measured) in work.items():
            for k in sizes:
                if k > 1 and k not in measured:
                    ratios = self._ratios[min(self._ratios, key=lambda m: (abs(m - k), m))]
                    measured[k] = model[c, k] / max(n, 1) * sorted(ratios.values())[len(ratios) // 2]

    def _stale(self, state: DispatchState, live: set[int]) -> bool:
        """Whether what the plan was made from has changed enough to plan again (see the class docstring)."""
        comm = self._comm(state)
        if abs(comm - self._comm_used) > 0.25 * max(self._comm_used, 1e-12):
            return True
        if len(state.unit_s) != self._measured and {k for _, k in state.unit_s} - self._sizes_seen:
            return True  # a size measured for the first time
        for c, assumed in self._unit_s.items():  # a planned gang measured a quarter off what the plan assumed
            measured = state.unit_s.get((c, self.plan.get(c, 1)))
            if c in live and measured is not None and abs(measured - assumed) > 0.25 * assumed:
                return True
            if c in live and state.unit_s.get((c, 1)) != self._hop_s.get(c):
                return True  # its hop was measured again (a probe)
        return any(c not in live for c in self.plan) and sum(self.plan.get(c, 1) for c in live) < len(state.workers)

    def select(self, state: DispatchState) -> list[Assignment]:
        live = set(_configs(state))
        if frozenset(state.workers) != self._workers:
            self._replan(state)
        elif self._stale(state, live):
            self._replan(state, keep=True)
            self.plan = {c: k for c, k in self.plan.items() if c in live}
        if all(self.plan.get(c, 1) == 1 for c in live) or (self.comm_s is None and self._sizes_seen == set()):
            # nothing to gang, or costs to be measured and not a unit measured yet: first the hop policy as it is
            # (what a unit takes on its own is what every gang's measured cost is compared with)
            return self.mop.select(state)
        out: list[Assignment] = []
        idle, busy = state.idle_workers(), state.busy_configs
        # measuring its costs, one gang of a size not yet measured at a time: the others hop meanwhile
        trying = {len(a.workers) for a in state.running.values()} if self.comm_s is None else set()
        seen = {k for _, k in state.unit_s}
        hop_now: set[int] = set()
        for c in self.order:  # a gang's next step forms in the planned order, from the idle workers
            k = self.plan.get(c, 1)
            if c not in live or k == 1 or c in busy:
                continue
            if k not in seen and any(t > 1 and t not in seen for t in trying):  # (a gang can come out smaller)
                hop_now.add(c)
                continue
            units = state.remaining(c)
            probe = self._probe(state, c, idle)
            if probe is not None:
                out.append(probe)
                idle = [w for w in idle if w not in probe.workers]
                continue
            fastest = sorted(idle, key=lambda w: (sum(state.estimate(u, w) for u in units[:8]), w))
            gang = form_gang(state, c, fastest, size=k)
            if gang is None:
                continue
            if len(gang.workers) < len(form_gang(state, c, sorted(state.workers), size=k, idle=False).workers):
                break  # the next gang waits for workers (the plan put it after what runs now)
            out.append(gang)
            self._steps[c] = self._steps.get(c, 0) + 1
            idle = [w for w in idle if w not in gang.workers]
            if self.comm_s is None:
                trying.add(len(gang.workers))
        hoppers = [c for c in self.order if (self.plan.get(c, 1) == 1 or c in hop_now) and c in live]
        taken: set[int] = set()
        for w in idle:
            for c in hoppers:
                if c in taken or c in busy:
                    continue
                unit = next((u for u in state.remaining(c) if state.is_eligible(u, w)), None)
                if unit is not None:
                    out.append(Assignment(unit, (w,)))
                    taken.add(c)
                    break
        return out


    def _probe(self, state: DispatchState, c: int, idle: list[int]) -> Assignment | None:
        """A hop of one of config `c`'s training units, to measure its hop again (see `PROBE_EVERY`), or None."""
        hop = state.unit_s.get((c, 1))
        if self.comm_s is not None or hop is None or self._steps.get(c, 0) < PROBE_EVERY:
            return None
        if self._unit_s.get(c, 0.0) < (1 - PROBE_GAIN) * hop:
            return None  # the gang gains enough that a stale hop time cannot matter
        for u in (u for u in state.remaining(c) if u.kind == TRAIN):
            w = next((w for w in idle if state.is_eligible(u, w)), None)
            if w is not None:
                self._steps[c] = 0
                return Assignment(u, (w,))
        return None


def plan_parallelism(work: dict[int, tuple[int, float]], workers: int, sizes: tuple[int, ...], comm_s: float,
                     time_limit_s: float | None = None,
                     budget_scale: float = 1.0) -> tuple[dict[int, int], list[int], float, str]:
    """Gang size per config and a start order minimising the makespan (see the module docstring).

    `work[c] = (units left, seconds of one unit[, measured])`: one number for every worker, or one per worker,
    fastest first (a config that hops takes their mean; a gang, the slowest's: its members wait for the slowest, and
    which workers a gang gets depends on what else runs, so the plan does not count on the fast ones); a gang of k
    costs `gang_seconds` of that per unit, or `measured[k]` where a gang of k of the config's has run (the model is
    a guess until then: workers that share cores, or a slow network, make it optimistic). `time_limit_s`: the
    solver's budget in reference seconds (`WORK_PER_S` of CP-SAT's deterministic time each; one worker, seed 0);
    None: `SOLVE_SHARE` of the greedy plan's makespan, within `SOLVE_BOUNDS_S`, times `budget_scale` (the planner's
    n-th re-plan in a row passes 1 / (n + 1)^2, so that all of them together take at most 1.65 plans' budget).
    Returns (size per config, configs by start, planned makespan in seconds, how it was found: "greedy", "greedy
    (optimal)" (it meets a lower bound) or the solver's status; followed by " (wall stop)" where the wall-clock
    safety stop, not the deterministic budget, ended the solve: that plan depends on the machine)."""
    from ortools.sat.python import cp_model

    configs = sorted(work)
    sizes = tuple(sorted(k for k in set(sizes) if 1 <= k <= workers)) or (1,)
    dur = _durations(work, sizes, comm_s)
    greedy, greedy_span = _greedy_plan(configs, dur, workers, sizes)
    # a bound no plan beats: the least worker-seconds of all the work spread over every worker, and each config's
    # own least time; a greedy plan that meets it is optimal, and the solver is not asked
    bound = max(sum(min(k * dur[c, k] for k in sizes) for c in configs) / workers,
                max(min(dur[c, k] for k in sizes) for c in configs))
    if greedy_span <= bound * (1 + 1e-9):
        order = sorted(configs, key=lambda c: (greedy[c][1], -greedy[c][0], c))
        return {c: greedy[c][0] for c in configs}, order, greedy_span, "greedy (optimal)"
    # durations in integer steps, the greedy makespan being SCALE_STEPS of them, rounded up: a plan's makespan in
    # steps bounds its makespan in seconds from above (finer steps make the solver far slower to prove a plan best)
    scale = SCALE_STEPS / max(greedy_span, 1e-9)
    size = {(c, k): max(1, math.ceil(dur[c, k] * scale - 1e-9)) for c in configs for k in sizes}
    m = cp_model.CpModel()
    horizon = SCALE_STEPS + len(configs) + 1  # the greedy plan, with each of its durations rounded up
    end = m.NewIntVar(0, horizon, "makespan")
    chosen, starts, intervals, demands = {}, {}, [], []
    for c in configs:
        picks = []
        for k in sizes:
            on = m.NewBoolVar(f"x{c}_{k}")
            s = m.NewIntVar(0, horizon, f"s{c}_{k}")
            intervals.append(m.NewOptionalFixedSizeIntervalVar(s, size[c, k], on, f"i{c}_{k}"))
            demands.append(k)
            m.Add(s + size[c, k] <= end).OnlyEnforceIf(on)
            chosen[c, k], starts[c, k] = on, s
            picks.append(on)
        m.AddExactlyOne(picks)
    m.AddCumulative(intervals, demands, workers)
    # the two bounds of `bound` above, per choice, as linear constraints (cumulative's own reasoning is weaker)
    m.Add(workers * end >= sum(k * size[c, k] * chosen[c, k] for c in configs for k in sizes))
    for c in configs:
        m.Add(end >= sum(size[c, k] * chosen[c, k] for k in sizes))
    m.Minimize(end)
    for c in configs:  # the greedy plan as a hint
        k0, s0 = greedy[c]
        for k in sizes:
            m.AddHint(chosen[c, k], k == k0)
            if k == k0:
                m.AddHint(starts[c, k], int(round(s0 * scale)))
    solver = cp_model.CpSolver()
    budget = solve_budget(greedy_span, time_limit_s) * (budget_scale if time_limit_s is None else 1.0)
    bound_by_work(solver.parameters, budget * WORK_PER_S, budget)
    status = solver.Solve(m)
    stopped = WALL_STOP if wall_stopped(solver, status) else ""
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) and solver.ObjectiveValue() / scale < greedy_span * 0.999:
        plan = {c: next(k for k in sizes if solver.Value(chosen[c, k])) for c in configs}
        begin = {c: solver.Value(starts[c, plan[c]]) for c in configs}
        order = sorted(configs, key=lambda c: (begin[c], -plan[c], c))
        return plan, order, solver.ObjectiveValue() / scale, solver.StatusName(status) + stopped
    order = sorted(configs, key=lambda c: (greedy[c][1], -greedy[c][0], c))
    return {c: greedy[c][0] for c in configs}, order, greedy_span, "greedy" + stopped


def solve_budget(greedy_span: float, time_limit_s: float | None = None) -> float:
    """The solver's budget, in reference seconds, for a plan whose greedy makespan is `greedy_span`: `time_limit_s`
    if given, else `SOLVE_SHARE` of the span within `SOLVE_BOUNDS_S`."""
    if time_limit_s is not None:
        return time_limit_s
    return min(max(SOLVE_SHARE * greedy_span, SOLVE_BOUNDS_S[0]), SOLVE_BOUNDS_S[1])


def _durations(work: dict[int, tuple], sizes: Iterable[int], comm_s: float) -> dict[tuple[int, int], float]:
    """Seconds of each config's remaining work on a gang of each size (see `plan_parallelism`)."""
    def unit_s(c: int, k: int) -> float:
        measured = work[c][2] if len(work[c]) > 2 else {}
        if k > 1 and k in measured:
            return measured[k]
        t = work[c][1]
        if isinstance(t, (int, float)):
            return gang_seconds(float(t), k, comm_s)
        return gang_seconds(sum(t) / len(t) if k == 1 else t[-1], k, comm_s)

    return {(c, k): work[c][0] * unit_s(c, k) for c in work for k in sizes}


def _list_schedule(configs: list[int], dur: dict[tuple[int, int], float], workers: int,
                   size: dict[int, int]) -> tuple[dict[int, tuple[int, float]], float]:
    """Longest work first onto the earliest free workers, each config on a gang of `size[c]`. Returns (config ->
    (size, start), makespan)."""
    free = [0.0] * workers  # when each worker is next free
    plan = {}
    for c in sorted(configs, key=lambda c: (-dur[c, size[c]], c)):
        k = size[c]
        free.sort()
        start = free[k - 1]  # the k earliest free workers start together
        for i in range(k):
            free[i] = start + dur[c, k]
        plan[c] = (k, start)
    return plan, max(free)


def _greedy_plan(configs: list[int], dur: dict[tuple[int, int], float], workers: int,
                 sizes: tuple[int, ...]) -> tuple[dict[int, tuple[int, float]], float]:
    """The best of a few list schedules: one gang size for every config (all hop, all data parallel, and each size
    between). Returns (config -> (size, start), makespan)."""
    best: tuple[float, dict[int, tuple[int, float]]] | None = None
    for k in sizes:
        plan, span = _list_schedule(configs, dur, workers, {c: k for c in configs})
        if best is None or span < best[0]:
            best = (span, plan)
    return best[1], best[0]
