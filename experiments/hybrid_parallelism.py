"""Hop, gang, switch or plan, live: the four parallelism policies on real Ray workers, |S| configs at a time.

Each setting trains the same configs on the same partitions (one per worker) with `scheduler` = "randomized" (MOP:
configs hop), "data_parallel" (every config as one gang of all workers, in turn), "cerebro" (MOP while |S| > p/2,
else data parallel) and "planner" (a gang size per config from one CP-SAT plan). For each |S| it prints the run's
wall time per policy, each policy's ratio to the better of MOP and data parallel, and the best validation accuracy
per policy. A HyperBand run (its rungs shrink |S|) is repeated over several seeds for "randomized" and "planner".

    python experiments/hybrid_parallelism.py --quick
    python experiments/hybrid_parallelism.py --sizes 1,2,3,4,8 --seeds 0,1,2

Mind the machine: four single-threaded workers on two cores contend for them, so a gang's all-reduce and the
hops' state transfers both compete with training. Report what this machine shows, not what a cluster would.
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
from framework.examples import classifier_eval_fn, classifier_train_fn, digits_arrays, mlp_model_fn  # noqa: E402

POLICIES = ("randomized", "data_parallel", "cerebro", "planner")


@dataclass
class Defaults:
    sizes: str = "1,2,3,4,8"  # |S|: configs trained at once (comma-separated)
    workers: int = 4  # workers, one partition each
    epochs: int = 3  # epochs per config in the |S| sweep
    hidden: int = 512  # MLP width (2 hidden layers): big enough that a gang's step is worth an all-reduce
    batch_size: int = 64  # examples per batch (a gang of k takes k batches per step)
    seeds: str = "0,1,2"  # HyperBand seeds (the run seed and HyperBand's)
    hb_epochs: int = 9  # HyperBand's max_epochs (eta 3)
    skip_hyperband: bool = False  # only the |S| sweep


QUICK = dict(sizes="1,4", epochs=2, seeds="0", hb_epochs=3)


def _run(ds, procedure, scheduler: str, workers: int, seed: int, out: str, tag: str) -> dict:
    sel = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, procedure, num_workers=workers,
        scheduler=scheduler, seed=seed, storage_path=os.path.join(out, "runs", tag), progress=False, metric="valid_accuracy",
        mode="max")
    t0 = time.perf_counter()
    result = sel.run()
    seconds = time.perf_counter() - t0
    gangs = result.schedule.group.nunique()
    return {"seconds": seconds, "best_acc": float(result.metrics.valid_accuracy.max()), "gang_steps": int(gangs),
            "units": int((result.schedule.group.isna()).sum() + gangs)}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=0)
    base = {"hidden": cfg.hidden, "layers": 2, "batch_size": cfg.batch_size}
    rows = []
    for s in [int(v) for v in str(cfg.sizes).split(",")]:
        space = {**base, "lr": [round(0.01 * (i + 1), 4) for i in range(s)]}
        for policy in POLICIES:
            r = _run(ds, automl.GridSearch({k: v if isinstance(v, list) else [v] for k, v in space.items()},
                                           epochs=cfg.epochs), policy, cfg.workers, 0, out, f"S{s}-{policy}")
            rows.append({"S": s, "policy": policy, **r})
            print(f"|S|={s} {policy:>13}: {r['seconds']:.1f} s, best valid_acc {r['best_acc']:.3f}, "
                  f"{r['gang_steps']} gang steps", flush=True)
    table = pd.DataFrame(rows)
    wide = table.pivot(index="S", columns="policy", values="seconds")[list(POLICIES)]
    better = wide[["randomized", "data_parallel"]].min(axis=1)
    ratios = wide.div(better, axis=0).add_suffix(" / best(MOP,DP)")
    acc = table.pivot(index="S", columns="policy", values="best_acc")[list(POLICIES)].add_suffix(" acc")
    summary = pd.concat([wide.add_suffix(" s"), ratios, acc], axis=1)
    table.to_csv(os.path.join(out, "sweep.csv"), index=False)
    summary.to_csv(os.path.join(out, "summary.csv"))
    print(f"\nwall seconds per run, {cfg.workers} workers on {os.cpu_count()} cores, {cfg.epochs} epochs per config:")
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    if not cfg.skip_hyperband:
        hb = []
        space = {**{k: [v] for k, v in base.items()}, "lr": [0.003, 0.01, 0.03, 0.1, 0.3]}
        for seed in [int(v) for v in str(cfg.seeds).split(",")]:
            for policy in ("randomized", "planner"):
                proc = automl.HyperBand(space, max_epochs=cfg.hb_epochs, eta=3, seed=seed)
                r = _run(ds, proc, policy, cfg.workers, seed, out, f"hb{seed}-{policy}")
                hb.append({"seed": seed, "policy": policy, **r})
                print(f"HyperBand seed {seed} {policy:>10}: {r['seconds']:.1f} s, best valid_acc "
                      f"{r['best_acc']:.3f}", flush=True)
        hb = pd.DataFrame(hb)
        hb.to_csv(os.path.join(out, "hyperband.csv"), index=False)
        by = hb.pivot(index="seed", columns="policy", values=["seconds", "best_acc"])
        print("\nHyperBand (eta 3):")
        print(by.to_string(float_format=lambda v: f"{v:.3g}"))
        ratio = hb[hb.policy == "planner"].seconds.to_numpy() / hb[hb.policy == "randomized"].seconds.to_numpy()
        print(f"planner / MOP wall time: mean {ratio.mean():.3f} over {len(ratio)} seed(s) "
              f"(per seed {', '.join(f'{v:.3f}' for v in ratio)})")
    record_run(out, cfg)
    return table


if __name__ == "__main__":
    main()
