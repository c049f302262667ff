"""HyperBand and ASHA on MOP vs on the task-parallel baseline: same workload, seed and time budget (Cerebro 6.3).

Prints, per procedure and executor: configs explored per rung (epochs reached), best validation accuracy and wall
time. ASHA runs under a time budget, so the executor that trains faster explores more configs.

    python experiments/automl_on_mop.py --quick
    ray job submit --working-dir . -- python experiments/automl_on_mop.py --procedures asha
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
from experiments._common import parse_config, record_run  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_train_fn,
    mlp_model_fn,
    synthetic_classification,
)


@dataclass
class Defaults:
    rows: int = 30_000
    features: int = 64
    workers: int = 2
    max_epochs: int = 9
    eta: int = 3
    time_budget_s: float = 90.0  # ASHA's budget (per executor)
    procedures: tuple = ("hyperband", "asha")  # or a "module:Class" of your own
    executors: tuple = ("mop", "task_parallel")
    seed: int = 0
    out: str = "results/automl_on_mop"


QUICK = dict(rows=6_000, max_epochs=3, time_budget_s=20.0)

SPACE = {
    "hidden": [64, 128, 256],
    "layers": [1, 2],
    "lr": automl.loguniform(1e-3, 0.3),
    "batch_size": [64, 128],
    "in_features": 64,
    "classes": 10,
}


def _procedure(name: str, cfg: Defaults) -> automl.Procedure:
    if name == "hyperband":
        return automl.HyperBand(SPACE, max_epochs=cfg.max_epochs, eta=cfg.eta, seed=cfg.seed)
    if name == "asha":
        return automl.ASHA(SPACE, max_epochs=cfg.max_epochs, eta=cfg.eta, time_budget_s=cfg.time_budget_s, seed=cfg.seed)
    return automl.load_procedure(name)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg = parse_config(Defaults, argv, __doc__, QUICK)
    os.makedirs(cfg.out, exist_ok=True)
    ensure_ray(min_cpus=cfg.workers)
    x, y = synthetic_classification(cfg.rows, cfg.features, seed=cfg.seed)
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=cfg.seed)
    rows, rungs = [], []
    for proc in cfg.procedures:
        for executor in cfg.executors:
            t0 = time.time()
            result = framework.ModelSelection(
                mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, _procedure(proc, cfg),
                num_workers=cfg.workers, executor=executor, seed=cfg.seed, metric="valid_accuracy", mode="max",
                storage_path=os.path.join(cfg.out, f"{proc}-{executor}-{int(t0)}"), progress=False,
            ).run()
            wall = time.time() - t0
            reached = result.metrics.groupby("config_id").epoch.max() + 1  # epochs each config trained
            for e in sorted(reached.unique()):
                rungs.append({"procedure": proc, "executor": executor, "epochs_reached": int(e),
                              "configs": int((reached >= e).sum())})
            rows.append({"procedure": proc, "executor": executor, "configs_explored": len(result.configs),
                         "epochs_trained": int(reached.sum()), "best_valid_accuracy": result.metrics.valid_accuracy.max(),
                         "wall_s": wall, "storage_path": result.storage_path})
    df, rung_df = pd.DataFrame(rows), pd.DataFrame(rungs)
    pd.set_option("display.width", 160)
    print("\nConfigs that trained at least N epochs (per rung):")
    print(rung_df.pivot_table(index=["procedure", "epochs_reached"], columns="executor", values="configs",
                              fill_value=0).to_string())
    print("\nSummary:")
    print(df.drop(columns="storage_path").to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    df.to_csv(os.path.join(cfg.out, "summary.csv"), index=False)
    rung_df.to_csv(os.path.join(cfg.out, "rungs.csv"), index=False)
    record_run(cfg.out, cfg)
    return df


if __name__ == "__main__":
    main()
