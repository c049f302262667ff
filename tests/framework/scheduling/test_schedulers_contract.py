"""Contract suite: every registered online policy and every offline solver, on the same small workloads."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from framework.scheduling import (
    SCHEDULERS,
    SOLVERS,
    Assignment,
    DispatchState,
    ParallelismPlanner,
    ShopProblem,
    Unit,
    make_scheduler,
    replay,
)
from framework.scheduling import cpsat as cpsat_module
from framework.scheduling.parallelism import WALL_STOP, plan_parallelism
from simulators import heterogeneous, replicate, shop_problem, simulate, validate_schedule

FAST = {"cpsat": {"time_limit_s": 2.0}, "milp": {"time_limit_s": 2.0}, "lookahead": {"tries": 20}}
NAMES = sorted(SCHEDULERS)


def _make(name: str, seed: int = 0):
    return make_scheduler(name, seed=seed, **FAST.get(name, {}))


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_schedule_is_feasible(name):
    w = heterogeneous(6, 3, seed=1)
    r = simulate(w, _make(name), epochs=2)
    rep = validate_schedule(r.schedule, w.availability)
    assert rep.ok, rep.violations
    assert len(r.schedule) == 2 * 6 * 3


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_replica_schedule_is_feasible(name):
    w = replicate(heterogeneous(5, 4, seed=2), factor=2, seed=0)
    r = simulate(w, _make(name))
    assert validate_schedule(r.schedule, w.availability).ok


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_same_seed_same_trace(name):
    w = heterogeneous(6, 3, seed=3)
    a = simulate(w, _make(name, seed=7)).schedule
    b = simulate(w, _make(name, seed=7)).schedule
    assert a.equals(b)


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_same_seed_same_trace_beside_a_cpu_hog(name, cpu_hog):
    w = heterogeneous(6, 3, seed=3)
    quiet = simulate(w, _make(name, seed=7)).schedule
    with cpu_hog():  # every core busy with another process: the solvers get a fraction of the CPU they had
        loaded = [simulate(w, _make(name, seed=7)).schedule for _ in range(2)]
    assert all(quiet.equals(b) for b in loaded)


def _unproven(solver: str) -> tuple[ShopProblem, dict]:
    """A problem and options where the exact solvers' deterministic budget, not a proof, ends the solve."""
    if solver == "milp":  # SCIP: 4 nodes (0.02 x 20,000 / 121 variables), optimality not proven by then
        return ShopProblem.from_matrix(np.random.default_rng(1).integers(1, 100, size=(5, 5))), {"time_limit_s": 0.02}
    return shop_problem(heterogeneous(30, 8, seed=1)), {"time_limit_s": 0.1, "tries": 20}


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_solver_same_problem_same_schedule_at_any_load(solver, cpu_hog):
    problem, opts = _unproven(solver)
    make = SOLVERS[solver]
    opts = {k: v for k, v in opts.items() if k in make.__init__.__code__.co_varnames}
    quiet = make(seed=3, **opts).solve(problem)
    with cpu_hog():
        loaded = make(seed=3, **opts).solve(problem)
    if solver in ("cpsat", "milp"):  # stopped by its budget (an older OR-Tools may prove the optimum within it)
        assert quiet.status in ("feasible", "optimal") and quiet.info["wall_stop"] is False
    assert (loaded.entries, loaded.status, loaded.bound) == (quiet.entries, quiet.status, quiet.bound)
    assert loaded.info.get("wall_stop") == quiet.info.get("wall_stop")


def test_planner_plans_the_same_at_any_load(cpu_hog):
    rng = np.random.default_rng(1)  # 20 configs with 2-29 units each on 16 workers of different speeds
    work = {c: (int(rng.integers(2, 30)), tuple(sorted(rng.uniform(0.5, 3.0, size=16)))) for c in range(20)}
    quiet = plan_parallelism(work, 16, (1, 2, 4, 8, 16), comm_s=0.1, time_limit_s=0.1)
    with cpu_hog():
        loaded = plan_parallelism(work, 16, (1, 2, 4, 8, 16), comm_s=0.1, time_limit_s=0.1)
    assert quiet[3] == "FEASIBLE"  # not proven: its deterministic budget ended the solve
    assert loaded == quiet


def test_a_solve_cut_short_by_its_wall_clock_safety_stop_says_so(monkeypatch):
    # a safety stop of 10 ms against budgets of 100 and 10 reference seconds (5 and 0.8 units of deterministic
    # time, seconds on any machine): the stop fires first, and every solver reports it
    monkeypatch.setattr(cpsat_module, "WALL_STOP_FACTOR", 0.0)
    monkeypatch.setattr(cpsat_module, "WALL_STOP_MARGIN_S", 0.01)
    problem = shop_problem(heterogeneous(30, 8, seed=1))
    assert SOLVERS["cpsat"](time_limit_s=100).solve(problem).info["wall_stop"] is True
    small, _ = _unproven("milp")
    assert SOLVERS["milp"](time_limit_s=100).solve(small).info["wall_stop"] is True
    rng = np.random.default_rng(1)
    work = {c: (int(rng.integers(2, 30)), tuple(sorted(rng.uniform(0.5, 3.0, size=16)))) for c in range(20)}
    assert plan_parallelism(work, 16, (1, 2, 4, 8, 16), comm_s=0.1, time_limit_s=10)[3].endswith(WALL_STOP)


def test_a_solve_within_its_budget_reports_no_wall_stop():
    planner = ParallelismPlanner(seed=7)
    simulate(heterogeneous(6, 3, seed=3), planner)
    assert planner.wall_stops == 0 and not planner.solver_status.endswith(WALL_STOP)
    assert SOLVERS["cpsat"](time_limit_s=0.1).solve(_unproven("cpsat")[0]).info["wall_stop"] is False


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_pickles_after_a_round(name):
    s = _make(name)
    simulate(heterogeneous(4, 2, seed=0), s)
    clone = pickle.loads(pickle.dumps(s))
    assert type(clone) is type(s) and clone.name == s.name


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_select_returns_eligible_distinct(name):
    units = [Unit(c, 0, q) for c in range(4) for q in range(3)]
    state = DispatchState(units, {q: [q] for q in range(3)})
    s = _make(name)
    s.start_round(state)
    chosen = s.select(state)
    assert chosen and all(state.is_eligible(a.unit, a.worker) for a in chosen)
    assert len({a.worker for a in chosen}) == len(chosen) == len({a.unit.config_id for a in chosen})


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_solver_schedule_is_valid_and_above_bound(solver):
    rng = np.random.default_rng(0)
    p = ShopProblem.from_matrix(rng.integers(1, 20, size=(5, 4)))
    s = SOLVERS[solver](seed=0, **({"time_limit_s": 2.0} if solver in ("cpsat", "milp") else {}))
    sched = s.solve(p)
    assert validate_schedule(sched, {q: [q] for q in range(4)}).ok
    assert sched.makespan >= sched.bound - 1e-9 >= p.lower_bound() - 1e-9


def test_make_scheduler_unknown_name_lists_valid():
    with pytest.raises(ValueError, match="randomized"):
        make_scheduler("nope")


def test_make_scheduler_rejects_unknown_option():
    with pytest.raises(TypeError):
        make_scheduler("cpsat", bogus=1)


def test_replay_dense_policies_match_between_replay_and_simulator():
    w = heterogeneous(8, 4, seed=5)
    from simulators import shop_problem

    assert replay(shop_problem(w), _make("mwr")).makespan == pytest.approx(simulate(w, "mwr").makespan)


def test_informed_policies_give_the_same_schedule_whatever_the_hash_seed():
    """Work sums over sets of units must not depend on set order (Python randomizes str hashes per process)."""
    import os
    import subprocess
    import sys

    code = ("from simulators import heterogeneous, simulate, Noise\n"
            "from framework.scheduling import SeededOrderScheduler\n"
            "w = heterogeneous(16, 8, seed=1)\n"
            "print(simulate(w, SeededOrderScheduler(1), epochs=2, seed=1, noise=Noise(sigma=0.2)).makespan,"
            " simulate(w, 'mwr', epochs=2, seed=1, noise=Noise(sigma=0.2)).makespan)")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2, 3)}
    assert len(outs) == 1, outs


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_with_a_queue_per_worker_is_feasible_and_complete(name):
    w = heterogeneous(6, 3, seed=4)
    r = simulate(w, _make(name), epochs=2, queue_depth=2)  # a worker holds its next unit while it runs one
    rep = validate_schedule(r.schedule, w.availability)
    assert rep.ok, rep.violations
    assert len(r.schedule) == 2 * 6 * 3


def test_a_worker_with_a_free_slot_is_idle_and_a_reserved_config_is_busy():
    units = [Unit(c, 0, q) for c in range(3) for q in range(2)]
    state = DispatchState(units, {0: [0], 1: [1]})
    state.set_capacity(2)
    state.start(Assignment(Unit(0, 0, 0), (0,)))
    assert state.load(0) == 1 and 0 in state.idle_workers()  # it may queue one more
    assert not state.is_eligible(Unit(0, 0, 1), 1)  # config 0 is held by worker 0: it runs nowhere else
    state.start(Assignment(Unit(1, 0, 0), (0,)))
    assert state.load(0) == 2 and 0 not in state.idle_workers() and not state.is_eligible(Unit(2, 0, 0), 0)
    state.set_capacity(1)
    assert state.idle_workers() == [1]  # the first pass of a dispatch serves workers with nothing to run
    with pytest.raises(ValueError, match="capacity"):
        state.set_capacity(0)
    state.complete(Unit(0, 0, 0))
    state.set_capacity(2)
    assert state.load(0) == 1 and 0 in state.idle_workers() and state.is_eligible(Unit(0, 0, 1), 1)


def test_a_pack_frees_its_worker_when_its_last_member_leaves_even_after_a_member_ran_alone():
    # pack (1, 0) on worker 0; member 1 is re-queued and runs alone on worker 0; then member 0 completes
    units = [Unit(c, 0, p) for c in (0, 1) for p in (0, 1)]
    state = DispatchState(units, {0: [0], 1: [0]})
    state.set_capacity(3)
    state.start(Assignment(Unit(1, 0, 0), (0,), (1, 0)))
    state.requeue(Unit(1, 0, 0))
    state.start(Assignment(Unit(1, 0, 0), (0,)))
    state.complete(Unit(0, 0, 0))
    assert state.load(0) == 1  # the alone run only: the pack's slot is free
    state.complete(Unit(1, 0, 0))
    assert state.load(0) == 0 and state.idle_workers() == [0]


def test_a_config_s_next_epoch_opened_early_waits_behind_its_unit_on_the_same_partition():
    state = DispatchState([Unit(0, 0, 0)], {0: [0]})
    state.add_units([Unit(0, 1, 0)])
    state.start(Assignment(Unit(0, 0, 0), (0,)))
    state.complete(Unit(0, 0, 0))
    assert state.eligible(0) == [Unit(0, 1, 0)] and state.candidate_workers() == [0]
