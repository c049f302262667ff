"""The driver loop's rate on the simulated backend (pytest-benchmark): unit events handled per second of wall time,
the figure `experiments/driver_scale.py` prints at full size (HyperBand over 980 configs and 256 workers). Here a
smaller HyperBand with failures (196 configs, 256 workers), one epoch of `heterogeneous(64, 32)`, and a completion's
cost at queue depth 2 over depth 1 (`driver_scale.py --depth-cost`); the rate, the makespan / lower bound and the
ratio go to `extra_info`, nothing is asserted about time."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import automl
from simulators import FAIL, RETURN, WorkerEvent, heterogeneous, simulate, simulate_selection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import driver_scale  # noqa: E402


def test_bench_driver_hyperband_256_workers_with_failures(benchmark):
    def run():
        procedure = automl.HyperBand(driver_scale.SPACE, max_epochs=27, eta=3, seed=0, iterations=4)
        return simulate_selection(procedure, wl, driver_scale.objective, events=events, seed=0)

    n = sum(b.rungs[0].n for b in automl.HyperBand(driver_scale.SPACE, max_epochs=27, eta=3, iterations=4).brackets)
    wl = driver_scale.workload(256, n, 4, 0)
    rng = np.random.default_rng(0)
    events = [e for w, t in zip(rng.choice(256, size=16, replace=False), rng.uniform(5, 200, size=16))
              for e in (WorkerEvent(float(t), int(w), FAIL), WorkerEvent(float(t) + 30, int(w), RETURN))]
    r = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["events_per_s"] = r.events_per_s
    benchmark.extra_info["makespan_over_lower_bound"] = r.makespan / driver_scale.lower_bound(r, wl)
    assert len(r.configs) == n and set(r.configs.status) == {"stopped"}


def test_bench_driver_heterogeneous_64x32(benchmark):
    w = heterogeneous(64, 32, seed=0)
    r = benchmark.pedantic(lambda: simulate(w, "randomized", seed=0), rounds=3, iterations=1)
    benchmark.extra_info["events_per_s"] = r.events_per_s
    assert len(r.schedule) == 64 * 32


def test_bench_driver_depth2_over_depth1_1024_workers(benchmark):
    """A completion's driver cost at queue depth 2 over depth 1 (3,000 configs on 1,024 workers, both depths in the
    one measurement, `driver_scale.depth_cost`): the idle workers are indexed per capacity, so the ratio stays near
    1 however many workers there are (target <= 1.3)."""
    ratio = benchmark.pedantic(lambda: driver_scale.depth_cost(repeats=1), rounds=1, iterations=1)
    benchmark.extra_info["depth2_over_depth1"] = ratio
    assert ratio > 0
