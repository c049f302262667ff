"""A packed MOP run against an unpacked one: a 16-config grid trained with `ModelSelection(pack=...)` for each arm,
side by side in one process (arms interleaved over `--repeats`), on the embedded Ray. The mechanism alone, per model
and pack size, is `experiments/fused_packs.py`; this is the whole engine around it (hops, evaluation, the driver).

For each arm it prints the median over repeats of:

    wall_s               `run()`'s wall time, start-up included
    train_s              the training units' summed time on the workers (what packing divides)
    speedup              pack=1's wall_s / this arm's
    best_valid_accuracy  the grid's best validation accuracy at the end (packing must not change what is learnt)
    mean_pack            training units per pack (1: every unit alone)
    largest_pack         the largest pack
    lower_bound          True where the arm hit its time limit (Ray Tune at `--tune-limit-s`) or a trial stopped
                         short: wall_s is then a lower bound on its time (its speedup an upper bound), and
                         best_valid_accuracy is over what the trials reported

    python experiments/packed_grid.py --quick
    python experiments/packed_grid.py --arms 1 auto 8 --workers 2
    ray job submit --working-dir . -- python experiments/packed_grid.py

On a GPU (`--gpus-per-worker 0.5`) the workers put models and data on the device; `--tune` then also times Ray Tune
with its trials sharing the GPU the same way (needs the `bench` extra), stopped at `--tune-limit-s` seconds.

Each run's row is printed, and runs.csv rewritten, as soon as it finishes, so a run that is killed keeps the runs
done so far; the table of medians comes at the end.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.examples import classifier_step_fn, mlp_model_fn, synthetic_classification  # noqa: E402


@dataclass(frozen=True)
class Defaults:
    arms: tuple[str, ...] = ("1", "auto", "8")  # pack settings to compare (1: one config at a time)
    rows: int = 65_536  # rows of the synthetic data set
    features: int = 64  # its features (the MLPs' in_features)
    widths: tuple[int, ...] = (32, 128)  # the grid's hidden widths: two architectures, 8 configs of each
    lrs: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)  # the grid's learning rates
    decays: tuple[float, ...] = (0.0, 1e-4)  # the grid's weight decays (2 x 4 x 2: 16 configs)
    batch_size: int = 32  # rows per step
    epochs: int = 3  # epochs per config
    workers: int = 2  # workers and partitions
    gpus_per_worker: float = 0.0  # GPU share of each worker (0: CPU workers, one thread each)
    repeats: int = 2  # interleaved repetitions of every arm; the table shows medians
    tune: bool = False  # also time Ray Tune (one trial per config, sharing the workers' resources)
    tune_limit_s: float = 600.0  # Ray Tune's time limit per repeat (all trials stopped then; its wall_s a lower bound)
    seed: int = 0  # seeds the data and the runs


QUICK = {"rows": 4096, "epochs": 1, "repeats": 1, "arms": ("1", "4")}


def check(cfg: Defaults) -> None:
    for arm in cfg.arms:
        if arm != "auto" and not (arm.isdigit() and 1 <= int(arm) <= 16):
            raise ValueError(f"`--arms` holds {arm!r}, but each must be an int in 1..16 or 'auto'")
    if cfg.rows < 10 * cfg.workers * cfg.batch_size:
        raise ValueError(f"`--rows` is {cfg.rows}, but must be >= 10 x workers x batch size")
    if not cfg.tune_limit_s > 0:
        raise ValueError(f"`--tune-limit-s` is {cfg.tune_limit_s}, but must be > 0")


def _resources(cfg: Defaults) -> dict:
    return {"CPU": 1, "GPU": cfg.gpus_per_worker} if cfg.gpus_per_worker else {"CPU": 1}


def _space(cfg: Defaults, features: int) -> dict:
    return {"in_features": [features], "hidden": list(cfg.widths), "lr": list(cfg.lrs),
            "weight_decay": list(cfg.decays), "batch_size": [cfg.batch_size]}


def run_arm(cfg: Defaults, arm: str, ds, features: int, out: str) -> dict:
    pack = arm if arm == "auto" else int(arm)
    t0 = time.time()
    result = framework.ModelSelection(
        mlp_model_fn, step_fn=classifier_step_fn, dataset=ds,
        procedure=automl.GridSearch(_space(cfg, features), epochs=cfg.epochs), num_workers=cfg.workers,
        worker_resources=_resources(cfg), seed=cfg.seed, pack=pack, metric="valid_accuracy", mode="max",
        progress=False, storage_path=os.path.join(out, f"run-pack-{arm}-{int(t0 * 1000)}"),
    ).run()
    wall = time.time() - t0
    train = result.schedule[result.schedule.kind == "train"]
    packs = train.groupby(train.group.fillna(-1 - train.index.to_series())).config_id.count()  # alone: a pack of 1
    busy = train.groupby(train.group.fillna(-1 - train.index.to_series()))[["start", "end"]].first()
    return {"arm": f"pack={arm}", "wall_s": wall, "train_s": float((busy.end - busy.start).sum()),
            "best_valid_accuracy": float(result.metrics.valid_accuracy.max()), "mean_pack": float(packs.mean()),
            "largest_pack": int(packs.max()), "lower_bound": False}


def run_tune(cfg: Defaults, x, y, out: str) -> dict:
    """Ray Tune: one trial per config on all the data (as users would run it), trials sharing the workers'
    resources (`max_concurrent_trials` = workers, each with the workers' resources). Stopped after `tune_limit_s`
    (`TuneConfig(time_budget_s=...)`: running trials stopped, pending ones never started): then `lower_bound`, as
    when a trial did not report its every epoch."""
    import torch
    from ray import tune

    n = int(len(x) * 0.8)
    device = "cuda" if cfg.gpus_per_worker else "cpu"
    data = (torch.from_numpy(x[:n]), torch.from_numpy(y[:n]), torch.from_numpy(x[n:]), torch.from_numpy(y[n:]))

    def trainable(config, data=None):
        from framework.engine.steps import StepLoop

        torch.set_num_threads(1)
        torch.manual_seed(cfg.seed)
        model, opt = mlp_model_fn(config)
        model.to(device)
        tx, ty, vx, vy = (t.to(device) for t in data)
        loop = StepLoop(classifier_step_fn)
        for _ in range(cfg.epochs):
            model.train()
            loop.train(model, opt, (tx, ty), config)
            model.eval()
            with torch.no_grad():
                m = loop.evaluate(model, (vx, vy), config)
            tune.report({"valid_accuracy": m["accuracy"]})

    space = {k: tune.grid_search(v) for k, v in _space(cfg, x.shape[1]).items()}
    resources = {"cpu": 1, "gpu": cfg.gpus_per_worker} if cfg.gpus_per_worker else {"cpu": 1}
    t0 = time.time()
    grid = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, data=data), resources), param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.workers, metric="valid_accuracy", mode="max",
                                    time_budget_s=cfg.tune_limit_s),
        run_config=tune.RunConfig(storage_path=os.path.join(out, "tune"), verbose=0),
    ).fit()
    wall = time.time() - t0
    results = [r.metrics or {} for r in grid]  # (a trial stopped before it reported: no metrics)
    finished = sum(m.get("training_iteration", 0) >= cfg.epochs for m in results)
    return {"arm": "ray_tune", "wall_s": wall, "train_s": float("nan"),
            "best_valid_accuracy": max((m["valid_accuracy"] for m in results if "valid_accuracy" in m),
                                       default=float("nan")), "mean_pack": 1.0, "largest_pack": 1,
            "lower_bound": wall >= cfg.tune_limit_s or finished < len(cfg.widths) * len(cfg.lrs) * len(cfg.decays)}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    ensure_ray(min_cpus=cfg.workers)
    x, y = synthetic_classification(cfg.rows, cfg.features, seed=cfg.seed)
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=cfg.seed)
    rows = []

    def done(row: dict) -> None:  # each run's row printed and on disk as it finishes: a killed run keeps them
        rows.append(row)
        runs = pd.DataFrame(rows)
        runs.to_csv(os.path.join(out, "runs.csv"), index=False)
        lines = markdown(runs).splitlines()
        print("\n".join(lines[:2] + lines[-1:]) if len(rows) == 1 else lines[-1], flush=True)

    print("\nEach run as it finishes:\n")
    for rep in range(cfg.repeats):  # interleaved: a slow spell of a shared machine hits every arm
        arms = list(cfg.arms[rep % len(cfg.arms):] + cfg.arms[:rep % len(cfg.arms)])
        for arm in arms:
            done({**run_arm(cfg, arm, ds, x.shape[1], out), "repeat": rep})
        if cfg.tune:
            done({**run_tune(cfg, x, y, out), "repeat": rep})
    runs = pd.DataFrame(rows)
    table = runs.drop(columns="repeat").groupby("arm", sort=False).agg(
        {**{c: "median" for c in runs.columns if c not in ("arm", "repeat", "lower_bound")}, "lower_bound": "any"},
    ).reset_index()
    base = table.loc[table.arm == "pack=1", "wall_s"]
    table.insert(3, "speedup", float(base.iloc[0]) / table.wall_s if len(base) else float("nan"))
    table.to_csv(os.path.join(out, "packed_grid.csv"), index=False)
    where = f"{cfg.workers} workers x {cfg.gpus_per_worker} GPU" if cfg.gpus_per_worker else \
        f"{cfg.workers} CPU workers, one thread each"
    print(f"\nA {len(cfg.widths) * len(cfg.lrs) * len(cfg.decays)}-config grid, {cfg.epochs} epochs, {cfg.rows} rows, batch "
          f"{cfg.batch_size}, {where}; median of {cfg.repeats} interleaved repeat(s):\n")
    print(markdown(table))
    record_run(out, cfg)
    return table


if __name__ == "__main__":
    main()
