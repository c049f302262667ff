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
    ShopProblem,
    Unit,
    make_scheduler,
    replay,
)
from simulators import heterogeneous, replicate, simulate, validate_schedule

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
