"""MOP vs sequential vs task-parallel vs Ray Tune on the same workload, measured side by side in one run.

Cerebro (VLDB 2020) Figure 7 at laptop scale: MLP configs on a synthetic tabular dataset, p workers. Prints the
makespans and end-to-end wall times, each arm's ratio to the ideal (sequential / p, both end to end and on the
schedule's span), model-state bytes moved per epoch vs the theoretical m * p * |S| (Cerebro Table 2), data held per
worker, and the engine's own costs (the columns of `engine_overhead.py`):

    utilisation   busy time / (span x p)
    sim           the simulator's utilisation for the measured unit times (same policy, barrier and queue depth)
    gap_ms        mean idle time between two consecutive units of a worker
    cpu_ms_first, cpu_ms_last   the driver's CPU time per unit in the first and the last epoch
    startup_s     from the call to the first unit's start (Ray, actors, imports, data)

    python experiments/mop_vs_baselines.py --quick
    ray job submit --working-dir . -- python experiments/mop_vs_baselines.py
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import ray  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import engine_columns, parse_config, record_run, utilisation  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_train_fn,
    mlp_model_fn,
    synthetic_classification,
)
from simulators import from_schedule_log, simulate  # noqa: E402


@dataclass
class Defaults:
    rows: int = 80_000  # with d=64, hidden 256-512, batch 64: one epoch of one config takes a few seconds on 1 core
    features: int = 64  # features of the synthetic data set (the MLP's in_features)
    workers: int = 2  # p: workers of MOP and task parallelism, and partitions of the data
    epochs: int = 4  # epochs per config
    hidden: tuple = (256, 512)  # the grid's hidden widths
    lrs: tuple = (0.003, 0.01, 0.03, 0.1)  # the grid's learning rates
    batch_size: int = 64  # mini-batch size of every config
    seed: int = 0  # seeds the data and the runs
    scheduler: str = "mwr"  # randomized (the engine default) is also reported in the README
    tune: bool = True  # also time Ray Tune itself
    repeats: int = 3  # interleaved repetitions of every arm; the table shows medians
    queue_depth: int = 2  # units queued per worker (ModelSelection's queue_depth)


QUICK = dict(rows=8_000, epochs=1, hidden=(64, 128), lrs=(0.01, 0.1), repeats=1)


def _space(cfg: Defaults) -> dict:
    return {"hidden": list(cfg.hidden), "lr": list(cfg.lrs), "batch_size": [cfg.batch_size],
            "in_features": [cfg.features], "classes": [10]}


def _run_engine(ds, cfg: Defaults, executor: str, workers: int, out: str) -> dict:
    t0 = time.time()
    result = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(_space(cfg), epochs=cfg.epochs),
        num_workers=workers, executor=executor, scheduler=cfg.scheduler, seed=cfg.seed, progress=False,
        storage_path=os.path.join(out, f"run-{executor}-{int(t0)}"), queue_depth=cfg.queue_depth,
    ).run()
    t1 = time.time()
    s = result.schedule
    makespan = s.end.max() - s.start.min()
    train = s[s.kind == "train"]
    epochs_run = result.metrics.groupby("config_id").epoch.max().add(1).sum() / len(result.configs)
    data_bytes = result.meta.get("data_bytes_per_worker", [])
    return {
        "executor": executor, "workers": workers, "wall_s": t1 - t0, "makespan_s": makespan,
        **engine_columns(result, workers, t0, t1), "sim": _predicted(s, cfg, workers),
        "state_bytes_per_epoch": train.state_bytes.sum() / epochs_run,
        "moved_bytes_theory": float(train.groupby("config_id").state_bytes.max().sum() * workers),  # m * p * |S|
        "data_bytes_per_worker": max(data_bytes) if data_bytes else 0,
        "best_valid_accuracy": float(result.metrics.valid_accuracy.max()), "configs": len(result.configs),
    }


def _predicted(schedule: pd.DataFrame, cfg: Defaults, workers: int) -> float:
    """The simulator's utilisation for the run's measured unit times (mean per config and worker), with the same
    policy, barrier and queue depth: what the run would reach if the engine cost nothing."""
    d = schedule.end - schedule.start
    workload = from_schedule_log(schedule)
    eval_fraction = float(d[schedule.kind != "train"].mean() / d[schedule.kind == "train"].mean())
    workload = dataclasses.replace(workload, eval_fraction=eval_fraction)
    sim = simulate(workload, cfg.scheduler, epochs=cfg.epochs, seed=cfg.seed, queue_depth=cfg.queue_depth)
    return utilisation(sim.schedule, workers)[0]


def _run_tune(x, y, cfg: Defaults, out: str) -> dict:
    """Ray Tune: one trial per config on the full data, `max_concurrent_trials = p` (what users would otherwise do)."""
    import torch
    from ray import tune

    n_valid = int(len(x) * 0.2)
    perm = np.random.default_rng(cfg.seed).permutation(len(x))
    tr, va = perm[n_valid:], perm[:n_valid]
    data = {"train": (torch.from_numpy(x[tr]), torch.from_numpy(y[tr])),
            "valid": (torch.from_numpy(x[va]), torch.from_numpy(y[va]))}

    def trainable(config, data=None):
        torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        model, opt = mlp_model_fn(config)
        for _ in range(cfg.epochs):
            model.train()
            classifier_train_fn(model, opt, data["train"], config)
            model.eval()
            with torch.no_grad():
                m = classifier_eval_fn(model, data["valid"], config)
            tune.report({"valid_accuracy": m["accuracy"], "valid_loss": m["loss"]})

    space = {k: tune.grid_search(v) for k, v in _space(cfg).items()}
    t0 = time.time()
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, data=data), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.workers, metric="valid_accuracy", mode="max"),
        run_config=tune.RunConfig(storage_path=os.path.join(out, "tune"), verbose=0),
    )
    grid = tuner.fit()
    wall = time.time() - t0
    best = grid.get_best_result()
    return {"executor": "ray_tune", "workers": cfg.workers, "wall_s": wall, "makespan_s": wall,
            "startup_s": float("nan"),
            "best_valid_accuracy": float(best.metrics["valid_accuracy"]), "configs": len(grid)}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    ensure_ray(min_cpus=cfg.workers)

    x, y = synthetic_classification(cfg.rows, cfg.features, seed=cfg.seed)
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=cfg.seed)
    arms = [("sequential", 1), ("mop", cfg.workers), ("task_parallel", cfg.workers)]
    rows = []
    for rep in range(cfg.repeats):  # interleaved repetitions: a slow spell of a shared machine hits every arm
        for executor, workers in arms[rep % len(arms):] + arms[: rep % len(arms)]:
            rows.append({**_run_engine(ds, cfg, executor, workers, out), "repeat": rep})
        if cfg.tune:
            try:
                rows.append({**_run_tune(x, y, cfg, out), "repeat": rep})
            except ImportError as e:
                print(f"Ray Tune not installed ({e}); install the 'bench' extra to include it")
    runs = pd.DataFrame(rows)
    runs.to_csv(os.path.join(out, "runs.csv"), index=False)
    df = runs.drop(columns="repeat").groupby("executor", sort=False).median().reset_index()  # median per arm
    by = df.set_index("executor")
    ideal_span, ideal_wall = by.makespan_s["sequential"] / cfg.workers, by.wall_s["sequential"] / cfg.workers
    df["span_vs_ideal"] = df.makespan_s / ideal_span
    df["wall_vs_ideal"] = df.wall_s / ideal_wall
    mop = df.set_index("executor").loc["mop"]
    pd.set_option("display.width", 200)
    print(f"\n{int(mop.configs)} configs x {cfg.epochs} epochs, {cfg.rows} rows, p={cfg.workers} workers, "
          f"scheduler={cfg.scheduler}, queue_depth={cfg.queue_depth}, median of {cfg.repeats} interleaved repeats")
    cols = ["executor", "workers", "wall_s", "makespan_s", "wall_vs_ideal", "span_vs_ideal", "utilisation", "sim",
            "gap_ms", "cpu_ms_first", "cpu_ms_last", "startup_s", "data_bytes_per_worker", "best_valid_accuracy"]
    print(df[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\nideal = sequential / p: {ideal_wall:.2f} s end to end, {ideal_span:.2f} s of schedule span")
    print(f"MOP / ideal end to end = {mop.wall_s / ideal_wall:.3f} (target <= 1.10); on the span = "
          f"{mop.makespan_s / ideal_span:.3f}")
    if "ray_tune" in by.index:
        print(f"Ray Tune / MOP end to end = {by.wall_s['ray_tune'] / mop.wall_s:.2f} (target >= 2)")
    print(f"model state moved per epoch: {mop.state_bytes_per_epoch / 1e6:.2f} MB vs m*p*|S| = "
          f"{mop.moved_bytes_theory / 1e6:.2f} MB")
    df.to_csv(os.path.join(out, "results.csv"), index=False)
    record_run(out, cfg, ray=ray.__version__)
    return df


if __name__ == "__main__":
    main()
