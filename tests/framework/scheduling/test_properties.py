"""Properties of every registered policy and solver on random workloads, replicas and worker failures (Hypothesis).

The profile is derandomized (the same examples on every run, so CI is reproducible) and small (20 examples per test).
To hunt for new counterexamples, raise `max_examples` and set `derandomize=False` locally: 150-400 random examples per
test passed when this file was written. A counterexample found that way goes into an `@example`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from framework.scheduling import (
    OPTIMAL,
    SCHEDULERS,
    CPSATSolver,
    DenseApproxSolver,
    LookaheadSolver,
    MILPSolver,
    make_scheduler,
)
from simulators import FAIL, JOIN, RETURN, WorkerEvent, Workload, lower_bound, shop_problem, simulate, validate_schedule

settings.register_profile(
    "scheduling-properties",
    deadline=None,
    max_examples=20,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROPERTIES = settings.get_profile("scheduling-properties")

# short solver limits: an instance that needs longer only comes back "feasible", which the properties allow
FAST = {"cpsat": {"time_limit_s": 0.5}, "milp": {"time_limit_s": 0.5}, "lookahead": {"tries": 10},
        "planner": {"time_limit_s": 0.05}}
TOL = 1e-6


@st.composite
def workloads(draw) -> Workload:
    """1-6 configs, 1-4 workers, 1-4 training partitions (+ 0-1 validation one), each held by 1+ random workers."""
    n_configs, n_workers = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    n_train, n_eval = draw(st.integers(1, 4)), draw(st.integers(0, 1))
    times = draw(
        st.lists(
            st.lists(st.integers(1, 9), min_size=n_workers, max_size=n_workers), min_size=n_configs, max_size=n_configs
        )
    )
    # worker speeds make some times fractional and incommensurate: CP-SAT then rounds them (its alpha path)
    speed = draw(st.lists(st.sampled_from([1.0, 1.0, 0.7, 1.3]), min_size=n_workers, max_size=n_workers))
    holders = st.sets(st.integers(0, n_workers - 1), min_size=1)
    availability = {q: tuple(sorted(draw(holders))) for q in range(n_train + n_eval)}
    return Workload(np.array(times, dtype=float) * speed, availability, tuple(range(n_train, n_train + n_eval)))


@st.composite
def worker_events(draw, n_workers: int) -> list[WorkerEvent]:
    """Per worker: maybe a late JOIN, then 0-2 FAIL/RETURN pairs; every worker ends alive, so no round can stall.

    Times are multiples of 0.5, so events often coincide with unit completions (at speed 1: whole or quarter times)."""
    events = []
    for w in range(n_workers):
        t = 0.5 * draw(st.integers(0, 6))
        if draw(st.booleans()):
            events.append(WorkerEvent(t, w, JOIN))
        for _ in range(draw(st.integers(0, 2))):
            t += 0.5 * draw(st.integers(0, 8))
            events.append(WorkerEvent(t, w, FAIL))
            t += 0.5 * draw(st.integers(1, 8))
            events.append(WorkerEvent(t, w, RETURN))
    return events


@st.composite
def runs(draw) -> tuple[Workload, list[WorkerEvent], int, int]:
    w = draw(workloads())
    return w, draw(worker_events(w.n_workers)), draw(st.integers(1, 2)), draw(st.integers(0, 3))


def _dead_intervals(events: list[WorkerEvent]) -> list[tuple[int, float, float]]:
    """(worker, from, to) while a worker is down: before its JOIN, and from a FAIL to its RETURN (WorkerEvent rules)."""
    down = {e.worker: 0.0 for e in events if e.kind == JOIN}
    out = []
    for e in sorted(events, key=lambda e: e.time):  # stable: same-time events apply in list order, as simulated
        if e.kind == FAIL and e.worker not in down:
            down[e.worker] = e.time
        elif e.kind in (RETURN, JOIN) and e.worker in down:
            out.append((e.worker, down.pop(e.worker), e.time))
    return out + [(w, t, float("inf")) for w, t in down.items()]


def _units(df) -> list[tuple]:
    """One entry per visit: a gang's rows (one per member worker, sharing a `group`) count once."""
    grouped = df[df["group"].notna()].drop_duplicates(["config_id", "epoch", "partition", "kind", "group"])
    visits = pd.concat([df[df["group"].isna()], grouped])
    return sorted(visits[["config_id", "epoch", "partition", "kind"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@PROPERTIES
@given(run=runs())
def test_policy_schedule_is_valid_complete_and_above_bound_under_failures(name, run):
    w, events, epochs, seed = run
    r = simulate(w, make_scheduler(name, seed=seed, **FAST.get(name, {})), epochs=epochs, events=events)
    report = validate_schedule(r.schedule, w.availability, w.train_partitions, w.eval_partitions)
    assert report.ok, report.violations
    expected = sorted((u.config_id, u.epoch, u.partition, u.kind) for e in range(epochs) for u in w.units(e))
    assert _units(r.schedule) == expected  # every unit completed exactly once, eval units included
    if r.schedule["group"].isna().all():  # the bound is one worker per unit's; a gang shares a unit's pass
        assert r.makespan >= lower_bound(w, epochs=epochs) - TOL
    for worker, down, up in _dead_intervals(events):  # nothing runs on a worker while it is down
        rows = r.schedule[r.schedule["worker"] == worker]
        assert not ((rows["start"] < up) & (rows["end"] > down)).any(), (worker, down, up)
    fails = {(e.worker, e.time) for e in events if e.kind == FAIL}
    for f in r.failed.itertuples():  # only failures lose work (a gang's unit: the failure of one of its members)
        rows = list(r.failed[r.failed["group"] == f.group].itertuples()) if pd.notna(f.group) else [f]
        assert any((int(m.worker), m.end) in fails for m in rows)
    assert len(r.failed) == len(r.requeued)


@PROPERTIES
@given(w=workloads())
# the MILP pins replicated units to its warm start's workers; its bound (2) once exceeded the optimum (1, on worker 1)
@example(w=Workload(np.array([[2.0, 1.0]]), {0: (0, 1)}))
# small instances that CP-SAT must model faithfully: per-config no-overlap, and a bound corrected for rounded times
@example(w=Workload(np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]]), {0: (0,), 1: (0, 1)}))
@example(w=Workload(np.array([[1.0, 0.7, 1.0]]), {0: (0,), 1: (0, 1)}, (1,)))
def test_exact_solver_proven_optimal_is_never_worse_than_any_heuristic(w):
    problem = shop_problem(w)
    lb = problem.lower_bound()
    solved = {
        "cpsat": CPSATSolver(**FAST["cpsat"]).solve(problem),
        "milp": MILPSolver(**FAST["milp"]).solve(problem),
        "approx": DenseApproxSolver().solve(problem),
        "lookahead": LookaheadSolver(**FAST["lookahead"]).solve(problem),
    }
    for s in solved.values():
        assert validate_schedule(s, w.availability).ok
        assert s.makespan >= lb - TOL and s.bound <= s.makespan + TOL
    # the exact solvers' optimum is one worker per unit's: policies that form gangs share a unit's pass instead
    online = sorted(set(SCHEDULERS) - {"cpsat", "milp", "data_parallel", "cerebro", "planner"})
    heuristics = {f"sim-{n}": simulate(w, make_scheduler(n, **FAST.get(n, {}))).makespan for n in online}
    heuristics |= {n: solved[n].makespan for n in ("approx", "lookahead")}
    optimal = [n for n in ("cpsat", "milp") if solved[n].status == OPTIMAL]
    for n in optimal:
        best = solved[n].makespan
        assert all(best <= m + TOL for m in heuristics.values()), (n, best, heuristics)
        assert all(s.bound <= best + TOL for s in solved.values())  # no solver claims a bound above the optimum
    if len(optimal) == 2:
        assert solved["cpsat"].makespan == pytest.approx(solved["milp"].makespan, abs=TOL)
