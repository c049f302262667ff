"""An epoch-wise cosine LR schedule with GradScaler state on MOP, against the sequential executor, over seeds.

Each config's schedule, scaler and weights hop with it (`framework.Trainable`); the engine steps the schedule once
per epoch of the config. MOP visits the partitions in a different order than one process reading all data, so the
two do not train the same weights; they should reach the same accuracy within seed-to-seed noise. Prints, per seed
and executor, the best final validation accuracy, and the mean and spread of the MOP - sequential difference; with
`--replay` it also replays the first MOP run and checks that the weights and the schedulers' states are
bit-identical.

    python experiments/lr_schedule.py --quick
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, record_run  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.examples import classifier_eval_fn, digits_arrays, scheduled_model_fn, scheduled_train_fn  # noqa: E402


@dataclass
class Defaults:
    seeds: int = 3  # seeds run; each trains both executors
    partitions: int = 2  # partitions of the data (MOP's workers)
    epochs: int = 6  # epochs per config (the cosine schedule's length)
    replay: bool = True  # replay the first MOP run and compare weights and scheduler states bit for bit


QUICK = dict(seeds=2, epochs=3)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    ensure_ray(min_cpus=cfg.partitions)
    x, y = digits_arrays()
    space = {"hidden": [64], "lr": [0.05, 0.2], "batch_size": [32], "epochs": cfg.epochs, "amp": [True]}
    rows, first = [], None
    for seed in range(cfg.seeds):
        ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.partitions, seed=seed)
        for executor in ("mop", "sequential"):
            t0 = time.time()
            result = framework.ModelSelection(
                scheduled_model_fn, scheduled_train_fn, classifier_eval_fn, ds,
                automl.GridSearch(space, epochs=cfg.epochs), executor=executor, seed=seed, metric="valid_accuracy",
                mode="max", progress=False, storage_path=os.path.join(out, f"{executor}-s{seed}-{int(t0)}"),
            ).run()
            last = result.metrics[result.metrics.epoch == cfg.epochs - 1]
            rows.append({"seed": seed, "executor": executor, "best_valid_accuracy": last.valid_accuracy.max(),
                         "wall_s": time.time() - t0})
            if executor == "mop" and first is None:
                first = result
    df = pd.DataFrame(rows)
    wide = df.pivot(index="seed", columns="executor", values="best_valid_accuracy")
    diff = wide["mop"] - wide["sequential"]
    pd.set_option("display.width", 160)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"\nMOP - sequential, best final valid accuracy: mean {diff.mean():+.4f}, "
          f"std {diff.std(ddof=1) if len(diff) > 1 else float('nan'):.4f} over {len(diff)} seeds; "
          f"seed-to-seed std of sequential {wide['sequential'].std(ddof=1) if len(wide) > 1 else float('nan'):.4f}")
    if cfg.replay and first is not None:
        again = framework.replay(first.storage_path)
        same = all(
            torch.equal(first.load_state(c)["model"][k], again.load_state(c)["model"][k])
            and first.load_state(c)["lr_scheduler"] == again.load_state(c)["lr_scheduler"]
            and first.load_state(c)["grad_scaler"] == again.load_state(c)["grad_scaler"]
            for c in first.configs for k in first.load_state(c)["model"])
        print(f"replay of {first.storage_path}: weights, LR scheduler and GradScaler states bit-identical: {same}")
    df.to_csv(os.path.join(out, "summary.csv"), index=False)
    record_run(out, cfg)
    return df


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
