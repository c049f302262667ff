"""HyperBand and ASHA on MOP vs on the task-parallel baseline: same workload, seed and time budget (Cerebro 6.3).

Prints, per procedure and executor: configs explored per rung (epochs reached), best validation accuracy and wall
time. ASHA runs under a time budget, so the executor that trains faster explores more configs.

`--procedure` runs a procedure of your own instead (a registered name or "module:Class"), constructed with the
keyword arguments of `--procedure-args` (a JSON object); its configs train `framework.examples.mlp_model_fn`
(keys hidden, layers, lr, batch_size, optimizer, weight_decay; in_features and classes fit `--features`).

    python experiments/automl_on_mop.py --quick
    ray job submit --working-dir . -- python experiments/automl_on_mop.py --procedures asha
    python experiments/automl_on_mop.py --procedure my_pkg.search:MySearch \\
        --procedure-args '{"space": {"lr": [0.01, 0.1], "hidden": [64]}, "epochs": 3}'
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, record_run  # noqa: E402
from framework.arguments import resolve_procedure  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_train_fn,
    mlp_model_fn,
    synthetic_classification,
)

BUILTIN = ("hyperband", "asha")


@dataclass
class Defaults:
    rows: int = 30_000  # rows of the synthetic classification data set
    features: int = 64  # its features (the MLP's in_features)
    workers: int = 2  # workers, and partitions of the data
    max_epochs: int = 9  # HyperBand's and ASHA's max_epochs (R)
    eta: int = 3  # HyperBand's and ASHA's reduction factor
    time_budget_s: float = 90.0  # ASHA's budget (per executor)
    procedures: tuple = BUILTIN  # procedures compared, set up with this script's space and the options above
    procedure: str = ""  # run this procedure instead of --procedures: a registered name or "module:Class"
    procedure_args: str = ""  # keyword arguments of --procedure as a JSON object, e.g. '{"epochs": 3}'
    executors: tuple = ("mop", "task_parallel")  # executors each procedure runs on (framework.EXECUTORS)
    seed: int = 0  # seeds the data, the procedures and the runs


QUICK = dict(rows=6_000, max_epochs=3, time_budget_s=20.0)

SPACE = {
    "hidden": [64, 128, 256],
    "layers": [1, 2],
    "lr": automl.loguniform(1e-3, 0.3),
    "batch_size": [64, 128],
    "in_features": 64,
    "classes": 10,
}


def _builtin(name: str, cfg: Defaults) -> automl.Procedure:
    if name == "hyperband":
        return automl.HyperBand(SPACE, max_epochs=cfg.max_epochs, eta=cfg.eta, seed=cfg.seed)
    return automl.ASHA(SPACE, max_epochs=cfg.max_epochs, eta=cfg.eta, time_budget_s=cfg.time_budget_s, seed=cfg.seed)


def procedures(cfg: Defaults) -> dict[str, Callable[[], automl.Procedure]]:
    """Name -> a maker of a fresh procedure (one per executor): `--procedure` with `--procedure-args`, else the
    built-in `--procedures`. Raises ValueError/TypeError naming the option and its value for a bad one."""
    if not cfg.procedure:
        if cfg.procedure_args:
            raise ValueError(f"`--procedure-args` is {cfg.procedure_args!r}, but is for `--procedure`, which is unset")
        unknown = sorted(set(cfg.procedures) - set(BUILTIN))
        if unknown:
            raise ValueError(f"`--procedures` has {unknown}, but must be among {list(BUILTIN)}; run a procedure of "
                             "your own with --procedure NAME_OR_module:Class --procedure-args JSON")
        return {name: functools.partial(_builtin, name, cfg) for name in cfg.procedures}
    try:
        args = json.loads(cfg.procedure_args or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"`--procedure-args` is {cfg.procedure_args!r}, but must be a JSON object: {e}") from None
    if not isinstance(args, dict):
        raise ValueError(f"`--procedure-args` is {cfg.procedure_args!r}, but must be a JSON object, e.g. "
                         "'{\"epochs\": 3}'")
    return {cfg.procedure: functools.partial(resolve_procedure, cfg.procedure, args)}


def _check(cfg: Defaults) -> None:
    """Every executor exists and every procedure can be made (before Ray starts or anything is written)."""
    unknown = sorted(set(cfg.executors) - set(framework.EXECUTORS))
    if unknown:
        raise ValueError(f"`--executors` has {unknown}, but must be among {list(framework.EXECUTORS)}")
    for make in procedures(cfg).values():
        make()


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check=_check)
    ensure_ray(min_cpus=cfg.workers)
    x, y = synthetic_classification(cfg.rows, cfg.features, seed=cfg.seed)
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=cfg.seed)
    rows, rungs = [], []
    for proc, make in procedures(cfg).items():
        for executor in cfg.executors:
            t0 = time.time()
            folder = f"{proc.rsplit(':', 1)[-1].lower()}-{executor}-{int(t0)}"  # "module:Class" -> "class-..."
            result = framework.ModelSelection(
                mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, make(),
                num_workers=cfg.workers, executor=executor, seed=cfg.seed, metric="valid_accuracy", mode="max",
                storage_path=os.path.join(out, folder), progress=False,
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
    df.to_csv(os.path.join(out, "summary.csv"), index=False)
    rung_df.to_csv(os.path.join(out, "rungs.csv"), index=False)
    record_run(out, cfg)
    return df


if __name__ == "__main__":
    main()
