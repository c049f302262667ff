"""Most-work-remaining dispatching on workloads where the priority rule decides the outcome."""

from __future__ import annotations

import numpy as np
import pytest

from framework.scheduling import Assignment, DispatchState, LPTScheduler, MWRScheduler, Unit
from simulators import Workload, lower_bound, simulate, validate_schedule

# config 0: four short units (2 s each, 8 s of work); config 1: one long unit (5 s); one worker holds everything
_COST = {0: 2.0, 1: 5.0}


def _lopsided_state() -> DispatchState:
    units = [Unit(0, 0, q) for q in range(4)] + [Unit(1, 0, 0)]
    return DispatchState(units, {q: [0] for q in range(4)}, lambda u, w: _COST[u.config_id])


def test_mwr_idle_worker_takes_config_with_most_work_left_not_longest_unit():
    state = _lopsided_state()
    assert (state.work_left(0), state.work_left(1)) == (8.0, 5.0)
    assert MWRScheduler().select(state) == [Assignment(Unit(0, 0, 0), (0,))]
    assert LPTScheduler().select(state) == [Assignment(Unit(1, 0, 0), (0,))]  # the longest unit is the other one


def test_mwr_priority_follows_remaining_not_initial_work():
    state, mwr = _lopsided_state(), MWRScheduler()
    order = []
    for _ in range(3):  # config 0 keeps priority while its work left (8, 6) exceeds config 1's 5 s, then loses it (4)
        (a,) = mwr.select(state)
        state.start(a)
        state.complete(a.unit)
        order.append(a.unit)
    assert order == [Unit(0, 0, 0), Unit(0, 0, 1), Unit(1, 0, 0)]


def test_mwr_ties_on_work_left_go_to_longest_unit_on_this_worker_then_lowest_config():
    # both configs have 2 s of work left (config 0 counts its 1 s on worker 1); on worker 0 config 0 takes 2 s
    times = np.array([[2.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    units = [Unit(c, 0, q) for c in range(3) for q in range(2)]
    state = DispatchState(units, {0: [0, 1], 1: [1]}, lambda u, w: float(times[u.config_id, w]))
    assert state.work_left(0) == state.work_left(1) == state.work_left(2) == 2.0
    assert MWRScheduler().select(state) == [Assignment(Unit(0, 0, 0), (0,)), Assignment(Unit(1, 0, 0), (1,))]


def test_mwr_work_left_counts_each_unit_at_its_fastest_holder():
    # partition 0 on both workers; config 0 is slow on worker 0 (10 s) and fast on worker 1 (1 s): 1 + 1 = 2 s left,
    # config 1 takes 3 s anywhere: 6 s left, so worker 0 gives config 1 priority although config 0 is longer there
    times = np.array([[10.0, 1.0], [3.0, 3.0]])
    units = [Unit(c, 0, q) for c in range(2) for q in range(2)]
    state = DispatchState(units, {0: [0, 1], 1: [1]}, lambda u, w: float(times[u.config_id, w]))
    assert MWRScheduler().select(state)[0] == Assignment(Unit(1, 0, 0), (0,))


def test_mwr_round_reaches_lower_bound_where_least_work_first_does_not():
    # Config 0 takes 3 s per unit, configs 1 and 2 take 1 s; partition q on worker q. LB = config 0's 6 s.
    # MWR starts config 0 at once (w0: c0 [0,3) c1 [3,4) c2 [4,5); w1: c1 [0,1) c2 [1,2) c0 [3,6)): makespan 6.
    # Least work first runs both short configs first and config 0 last, serially (w0: c1 c2 c0 [2,5); w1: c2 c1,
    # then c0 [5,8)): makespan 8.
    w = Workload(np.array([[3.0, 3.0], [1.0, 1.0], [1.0, 1.0]]), {0: (0,), 1: (1,)})
    r = simulate(w, MWRScheduler())
    assert validate_schedule(r.schedule, w.availability).ok
    assert r.makespan == lower_bound(w) == 6.0
    c0 = r.schedule[r.schedule["config_id"] == 0].sort_values("start")
    assert c0[["worker", "start", "end"]].values.tolist() == [[0, 0.0, 3.0], [1, 3.0, 6.0]]


@pytest.mark.parametrize("epochs", [1, 3])
def test_mwr_round_makespan_on_heterogeneous_configs_is_exact(epochs):
    # 4 configs of work 8, 2, 2, 2 on 2 workers (one partition each, every worker equally fast): the long config
    # must start at once on one worker and hop at t=4; the three short ones fill the other worker. LB = 8 per epoch.
    w = Workload(np.array([[4.0, 4.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]), {0: (0,), 1: (1,)})
    r = simulate(w, "mwr", epochs=epochs)
    assert validate_schedule(r.schedule, w.availability).ok
    assert r.makespan == lower_bound(w, epochs=epochs) == 8.0 * epochs
