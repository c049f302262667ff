"""The live engine and the simulator run the same policy object type and produce schedules with the same invariants;
a live run's measured unit times re-simulate offline."""

from __future__ import annotations

import pytest

import automl
import framework
from framework.examples import classifier_eval_fn, classifier_train_fn, mlp_model_fn
from framework.scheduling import RandomizedScheduler
from simulators import from_schedule_log, lower_bound, simulate, validate_schedule

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("scheduler", ["randomized", "lookahead"])
def test_live_and_simulated_schedules_obey_the_same_invariants(scheduler, ray_cluster, digits, tmp_path):
    x, y = digits
    ds = framework.PartitionedDataset.from_arrays(x[:900], y[:900], num_partitions=3, seed=0)
    space = {"hidden": [16, 32], "lr": [0.05, 0.1], "batch_size": [64]}
    live = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(space, epochs=2),
        scheduler=scheduler, storage_path=str(tmp_path / "live"), progress=False,
    ).run()
    live_report = validate_schedule(live.schedule, availability={0: [0], 1: [1], 2: [2]}, partitions=[0, 1, 2])
    assert live_report.ok, live_report.violations

    workload = from_schedule_log(live.schedule)  # measured unit times of the live run
    assert workload.n_configs == 4 and workload.n_workers == 3
    sim = simulate(workload, RandomizedScheduler(seed=0) if scheduler == "randomized" else scheduler, epochs=2)
    sim_report = validate_schedule(sim.schedule, availability=workload.availability, partitions=[0, 1, 2])
    assert sim_report.ok, sim_report.violations
    assert sim.makespan >= lower_bound(workload, epochs=2) - 1e-9
