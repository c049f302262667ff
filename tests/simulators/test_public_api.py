"""The simulators' public API at the magnitudes and seeds users give it: textbook open-shop instances, every
scheduler name, seeds 0-9, unit times from milliseconds to a day.

Two regressions passed every other test: the exact scheduler raised for common seeds (a 63-bit per-wave seed handed
to CP-SAT's int32 parameter), and units longer than the driver's 300 s health check made every worker "hung".
"""

from __future__ import annotations

import numpy as np
import pytest

import automl
from framework.scheduling import SCHEDULERS
from simulators import Workload, lower_bound, simulate, simulate_selection, validate_schedule

# Taillard 1993 ta4x4_1os (T[config][worker]); proven optimum 193
TA4X4_1 = np.array([[34, 2, 54, 61], [15, 89, 70, 9], [38, 19, 28, 87], [95, 7, 34, 29]], dtype=float)


def _shop(times: np.ndarray) -> Workload:
    return Workload(times, {q: (q,) for q in range(times.shape[1])})


@pytest.mark.parametrize("seed", range(10))
def test_the_exact_scheduler_runs_for_every_seed(seed):
    r = simulate(_shop(TA4X4_1), "cpsat", seed=seed)
    assert validate_schedule(r.schedule, _shop(TA4X4_1).availability, raise_on_error=True).ok
    assert r.makespan == 193  # CP-SAT proves the optimum of this instance


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3, 1e5])
def test_units_of_any_length_are_not_hung_on_the_simulated_clock(scale):
    # one unit far longer than every other (the health check's 20x the longest unit seen so far): it is no hang
    times = np.ones((4, 4))
    times[3, 3] = 638
    w = _shop(times * scale)
    r = simulate(w, "randomized", seed=0)
    assert validate_schedule(r.schedule, w.availability, raise_on_error=True).ok
    assert len(r.failed) == 0
    assert r.makespan >= lower_bound(w, epochs=1) * (1 - 1e-9)


def test_a_spent_procedure_is_refused():
    procedure = automl.GridSearch({"lr": [0.1, 0.2]}, epochs=1)
    w = _shop(np.ones((2, 2)))
    simulate_selection(procedure, w)
    with pytest.raises(ValueError, match="`procedure` .* has already run"):
        simulate_selection(procedure, w)
    assert sorted(SCHEDULERS)  # every name is exercised by the property tests


def test_a_simulated_hang_is_an_injected_fault_its_backend_reports():
    # day-long units are healthy; the one hang injected is reported when it should have ended, and runs again
    from framework.driver import Driver, MemoryRunLog
    from framework.engine.faults import Fault, FaultPlan
    from framework.options import RunOptions
    from framework.scheduling import TRAIN
    from simulators.backend import SimulatedBackend

    w = _shop(np.full((2, 2), 86_400.0))
    plan = FaultPlan([Fault("hang", config_id=0, epoch=0, kind=TRAIN)])
    log = MemoryRunLog()
    options = RunOptions(max_worker_restarts=1, queue_depth=1)
    driver = Driver(SimulatedBackend(w), automl.GridSearch({"x": [0, 1]}, epochs=1), log, {0: [0], 1: [1]}, [0, 1],
                    options, plan, eval_partitions=[])
    driver.run()
    failed = [d for k, d in log.events if k == "worker_failed"]
    assert len(failed) == 1 and failed[0]["why"].startswith("hung: Unit(config_id=0") and failed[0]["requeued"]
    assert validate_schedule(log.schedule(), w.availability, raise_on_error=True).ok
    assert len(log.schedule()) == 4


def test_a_simulated_slow_unit_stretches_by_its_seconds_and_the_makespan_with_it():
    from framework.driver import Driver, MemoryRunLog
    from framework.engine.faults import Fault, FaultPlan
    from framework.options import RunOptions
    from framework.scheduling import TRAIN
    from simulators.backend import SimulatedBackend

    def run(faults):
        w = _shop(np.full((1, 2), 3_600.0))  # one config, two workers, hour-long units
        log = MemoryRunLog()
        Driver(SimulatedBackend(w), automl.GridSearch({"x": [0]}, epochs=1), log, {0: [0], 1: [1]}, [0, 1],
               RunOptions(queue_depth=1), FaultPlan(faults), eval_partitions=[]).run()
        done = log.schedule()
        assert len(done) == 2 and not [d for k, d in log.events if k in ("worker_failed", "unit_retry")]
        return done, done.end.max()

    _, makespan = run([])
    done, stretched = run([Fault("slow", config_id=0, partition=1, kind=TRAIN, seconds=1_800.0)])
    slow = done[done.partition == 1].iloc[0]
    assert slow.end - slow.start == 5_400.0
    assert (makespan, stretched) == (7_200.0, 9_000.0)
