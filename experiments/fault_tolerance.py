"""Cerebro Figure 8(B) at laptop scale: per-epoch time with replication 3 while two workers fail and come back.

Two worker processes are SIGKILLed at given epochs (a real crash). The replica-aware randomized scheduler keeps
training on the replicas; the lost units re-run; later the two workers come back (`add_workers`), each loading
replicas of the partitions, and take units from the next dispatch on. Prints the time of every epoch and the
failure / recovery events; every config still absorbs every partition exactly once per epoch.

    python experiments/fault_tolerance.py --quick
    ray job submit --working-dir . -- python experiments/fault_tolerance.py
"""

from __future__ import annotations

import json
import os
import sys
import threading
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
    rows: int = 8_000  # rows of the synthetic classification data set
    features: int = 64  # its features
    workers: int = 4  # workers, and partitions of the data
    replicas: int = 3  # workers that hold each partition
    epochs: int = 10  # epochs per config
    fail_at: tuple = (2, 3)  # epochs (rounds) at whose start a worker is killed
    return_at: int = 5  # epoch at whose start the failed workers come back
    # With 4 workers on a 2-core laptop, CPU-bound units cannot run 4 at a time, so without an emulated accelerator
    # losing workers would not show in the epoch times the way it does on a cluster of GPU nodes.
    device_s: float = 0.4  # seconds on an emulated accelerator (a sleep) each training unit adds; 0: CPU only
    seed: int = 0  # seeds the data and the run


QUICK = dict(rows=4_000, epochs=7, fail_at=(1, 2), return_at=3, device_s=0.25)


def train_on_emulated_device(model, optimizer, data, config):
    """Real training on the CPU plus `device_s` seconds of emulated accelerator time."""
    time.sleep(config["device_s"])
    return classifier_train_fn(model, optimizer, data, config)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    ensure_ray(min_cpus=cfg.workers + 2)
    x, y = synthetic_classification(cfg.rows, cfg.features, seed=cfg.seed)
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=cfg.seed,
                                                  replicas=cfg.replicas)
    space = {"hidden": [128, 256], "lr": [0.01, 0.05], "batch_size": [64], "in_features": cfg.features,
             "device_s": cfg.device_s}
    sel = framework.ModelSelection(
        mlp_model_fn, train_on_emulated_device, classifier_eval_fn, ds, automl.GridSearch(space, epochs=cfg.epochs),
        num_workers=cfg.workers, seed=cfg.seed, progress=False, max_worker_restarts=0,
        storage_path=os.path.join(out, f"run-{int(time.time())}"),
    )
    killed: list[int] = []
    stop = threading.Event()

    def rounds_done() -> int:
        return sel.rounds_completed

    def chaos() -> None:
        for epoch in cfg.fail_at:
            while rounds_done() < epoch and not stop.is_set():
                time.sleep(0.05)
            time.sleep(0.3)  # into the epoch, so units are in flight
            victim = next(w for w in sel.live_workers() if w not in killed)
            sel.kill_worker_process(victim)
            killed.append(victim)
        while rounds_done() < cfg.return_at and not stop.is_set():
            time.sleep(0.05)
        sel.add_workers(len(killed))

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    result = sel.run()
    stop.set()
    thread.join(timeout=5)

    per_round = result.schedule.groupby("round").agg(start=("start", "min"), end=("end", "max"))
    per_round["epoch_time_s"] = per_round.end - per_round.start  # start/end: seconds since the run started
    workers = result.schedule.groupby("round").worker.nunique().rename("workers_used")
    table = per_round.join(workers).reset_index()
    ev = result.events[result.events.kind.isin(["worker_failed", "worker_added", "worker_joined",
                                                "partition_reload"])].copy()
    print(f"\nPer-epoch time (replication {cfg.replicas}, {cfg.workers} workers; workers {killed} killed, "
          f"{len(killed)} added back at epoch {cfg.return_at}):")
    print(table[["round", "epoch_time_s", "workers_used"]].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print("\nFailure and recovery events (t in seconds since the run started):")
    for row in ev.itertuples():
        detail = json.loads(row.detail)
        detail.pop("requeued", None)
        print(f"  t={row.t:7.2f}s  {row.kind:<16} {detail}")
    complete = all(
        sorted(ps) == list(range(cfg.workers))
        for cid in result.configs for ps in result.load_state(cid)["visited"].values()
    )
    print(f"\nevery config absorbed every partition exactly once per epoch: {complete}")
    table.to_csv(os.path.join(out, "epochs.csv"), index=False)
    ev.to_csv(os.path.join(out, "events.csv"), index=False)
    record_run(out, cfg, killed=killed)
    return table


if __name__ == "__main__":
    main()
