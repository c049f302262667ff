"""Hop, gang, switch or plan, live: the four parallelism policies on real Ray workers, |S| configs at a time.

Each setting trains the same configs on the same partitions (one per worker) with `scheduler` = "randomized" (MOP:
configs hop), "data_parallel" (every config as one gang of all workers, in turn), "cerebro" (MOP while |S| > p/2,
else data parallel) and "planner" (a gang size per config from one CP-SAT plan). For each |S| it prints the run's
wall time per policy, each policy's ratio to the better of MOP and data parallel, and the best validation accuracy
per policy. A HyperBand run (its rungs shrink |S|) is repeated over several seeds for "randomized" and "planner".
Beside a run's wall time (Ray's start-up and the workers' included) it reports its training span (first unit's
start to last unit's end, from the schedule log) and, for the planner, the seconds spent making plans (workers wait
meanwhile).

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
from framework.scheduling.parallelism import ParallelismPlanner  # noqa: E402

POLICIES = ("randomized", "data_parallel", "cerebro", "planner")


@dataclass
class Defaults:
    sizes: str = "1,2,3,4,8"  # |S|: configs trained at once (comma-separated)
    workers: int = 4  # workers, one partition each
    epochs: int = 4  # epochs per config in the |S| sweep
    hidden: int = 1024  # MLP width (2 hidden layers): big enough that a gang's step is worth an all-reduce
    batch_size: int = 128  # examples per batch (a gang's global batch: each of its k workers takes 1/k of it)
    seeds: str = "0,1,2"  # HyperBand seeds (the run seed and HyperBand's)
    hb_epochs: int = 9  # HyperBand's max_epochs
    hb_eta: int = 3  # HyperBand's eta (its last rungs hold about 2 log_eta(max_epochs) + 1 configs)
    skip_hyperband: bool = False  # only the |S| sweep


QUICK = dict(sizes="1,4", epochs=2, seeds="0", hb_epochs=3)


def _run(ds, procedure, policy: str, workers: int, seed: int, out: str, tag: str) -> dict:
    scheduler = ParallelismPlanner(seed=seed) if policy == "planner" else policy
    sel = framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, procedure, num_workers=workers,
        scheduler=scheduler, seed=seed, storage_path=os.path.join(out, "runs", tag), progress=False,
        metric="valid_accuracy", mode="max")
    t0 = time.perf_counter()
    result = sel.run()
    seconds = time.perf_counter() - t0
    sched = result.schedule
    gangs = sched.group.nunique()
    return {"seconds": seconds, "train_s": float(sched.end.max() - sched.start.min()),
            "plan_s": scheduler.plan_seconds if policy == "planner" else 0.0,
            "best_acc": float(result.metrics.valid_accuracy.max()), "gang_steps": int(gangs),
            "units": int((sched.group.isna()).sum() + gangs)}


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
            print(f"|S|={s} {policy:>13}: {r['seconds']:.1f} s (training {r['train_s']:.2f} s, planning "
                  f"{r['plan_s']:.2f} s), best valid_acc {r['best_acc']:.3f}, {r['gang_steps']} gang steps", flush=True)
    table = pd.DataFrame(rows)
    wide = table.pivot(index="S", columns="policy", values="seconds")[list(POLICIES)]
    train = table.pivot(index="S", columns="policy", values="train_s")[list(POLICIES)]
    better = train[["randomized", "data_parallel"]].min(axis=1)
    ratios = train.div(better, axis=0).add_suffix(" / best(MOP,DP)")
    acc = table.pivot(index="S", columns="policy", values="best_acc")[list(POLICIES)].add_suffix(" acc")
    plan = table[table.policy == "planner"].set_index("S").plan_s.rename("planner planning s")
    summary = pd.concat([wide.add_suffix(" s"), train.add_suffix(" train s"), ratios, plan, acc], axis=1)
    table.to_csv(os.path.join(out, "sweep.csv"), index=False)
    summary.to_csv(os.path.join(out, "summary.csv"))
    print(f"\nper run, {cfg.workers} workers on {os.cpu_count()} cores, {cfg.epochs} epochs per config: wall seconds "
          "(s), training span (train s), its ratio to the better of MOP's and data parallel's, best accuracy:")
    print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
    if not cfg.skip_hyperband:
        hb = []
        space = {**{k: [v] for k, v in base.items()}, "lr": [0.003, 0.01, 0.03, 0.1, 0.3]}
        for seed in [int(v) for v in str(cfg.seeds).split(",")]:
            for policy in ("randomized", "planner"):
                proc = automl.HyperBand(space, max_epochs=cfg.hb_epochs, eta=cfg.hb_eta, seed=seed)
                r = _run(ds, proc, policy, cfg.workers, seed, out, f"hb{seed}-{policy}")
                hb.append({"seed": seed, "policy": policy, **r})
                print(f"HyperBand seed {seed} {policy:>10}: {r['seconds']:.1f} s (training {r['train_s']:.2f} s, "
                      f"planning {r['plan_s']:.2f} s), best valid_acc {r['best_acc']:.3f}", flush=True)
        hb = pd.DataFrame(hb)
        hb.to_csv(os.path.join(out, "hyperband.csv"), index=False)
        by = hb.pivot(index="seed", columns="policy", values=["seconds", "train_s", "plan_s", "best_acc"])
        print(f"\nHyperBand (max_epochs {cfg.hb_epochs}, eta {cfg.hb_eta}):")
        print(by.to_string(float_format=lambda v: f"{v:.3g}"))
        for col, what in (("seconds", "wall time"), ("train_s", "training span")):
            ratio = hb[hb.policy == "planner"][col].to_numpy() / hb[hb.policy == "randomized"][col].to_numpy()
            print(f"planner / MOP {what}: mean {ratio.mean():.3f} over {len(ratio)} seed(s) "
                  f"(per seed {', '.join(f'{v:.3f}' for v in ratio)})")
    record_run(out, cfg)
    return table


if __name__ == "__main__":
    main()
