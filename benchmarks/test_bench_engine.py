"""Engine benchmarks (pytest-benchmark): one small MOP selection vs the sequential baseline, on a local Ray.

Run with `make bench`. Each benchmark records the makespan, the engine overhead and MOP's ratio to the ideal in
`extra_info`; nothing here asserts a time.
"""

from __future__ import annotations

import os

import pytest

import automl  # noqa: E402
import framework  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_train_fn,
    mlp_model_fn,
    synthetic_classification,
)

SPACE = {"hidden": [128, 256], "lr": [0.01, 0.05, 0.1, 0.2], "batch_size": [64], "in_features": 64}


@pytest.fixture(scope="module")
def dataset():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    x, y = synthetic_classification(20_000, 64, seed=0)
    return framework.PartitionedDataset.from_arrays(x, y, num_partitions=2, seed=0)


def _select(dataset, tmp_path, executor, workers):
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, dataset, automl.GridSearch(SPACE, epochs=2),
        num_workers=workers, executor=executor, progress=False, storage_path=str(tmp_path / f"{executor}-{os.getpid()}"),
    ).run()
    s = result.schedule
    makespan = s.end.max() - s.start.min()
    busy = (s.end - s.start).sum()
    return makespan, busy


@pytest.mark.parametrize("executor,workers", [("sequential", 1), ("mop", 2), ("task_parallel", 2)])
def test_bench_engine_makespan(benchmark, dataset, tmp_path_factory, executor, workers):
    tmp = tmp_path_factory.mktemp(executor)
    makespan, busy = benchmark.pedantic(_select, args=(dataset, tmp, executor, workers), rounds=1, iterations=1)
    benchmark.extra_info.update(
        makespan_s=makespan, unit_compute_s=busy, overhead_frac=(makespan - busy / workers) / makespan
    )


@pytest.mark.parametrize("queue_depth", [1, 2])
@pytest.mark.parametrize("state_mb", [1.0, 20.0])
def test_bench_engine_overhead(benchmark, dataset, tmp_path_factory, queue_depth, state_mb):
    """experiments/engine_overhead.py's cell at p=8 with 0.2 s emulated units: utilisation next to the
    simulator's, the gap between a worker's units and the driver's CPU per unit (in `extra_info`)."""
    import dataclasses

    from experiments import engine_overhead

    cfg = dataclasses.replace(engine_overhead.Defaults(), epochs=2, queue_depth=queue_depth)
    root = str(tmp_path_factory.mktemp(f"overhead-q{queue_depth}-s{state_mb}"))
    row = benchmark.pedantic(engine_overhead.run_cell, args=(8, 0.2, state_mb, cfg, root), rounds=1, iterations=1)
    benchmark.extra_info.update(row)
