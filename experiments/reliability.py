"""Reliability under a chaos mix, over several seeds: does a run lose or repeat work when everything goes wrong?

Per seed, one grid selection on scikit-learn digits runs with, all at once:
    worker kills   every training unit's dispatch kills its worker with probability `kill_rate`
    a hung unit    one training unit of epoch 0 never returns (found by `unit_timeout_s`, its worker restarted)
    a failing config   one config's user code raises in epoch 1 (the config fails, the run goes on)
    a driver crash     the driver process is SIGKILLed right after a commit drawn from the seed
    a corrupt checkpoint   after the crash, 16 bytes of one active config's newest checkpoint are flipped
then the run is resumed to the end, and a fault-free run with the same seed gives the reference wall time.

It prints, per seed: kills, hung units, units re-run (attempts that did not count: interrupted, lost, unstarted),
units lost (a committed epoch of a config that did not fail, missing a partition: must be 0), units trained twice
(two `done` rows for one unit: must be 0), checkpoints rebuilt from the log on resume, configs failed by the
injected error and by the corrupt checkpoint (when it could not be rebuilt), and the wall time (crashed run +
resume) against the fault-free run.

    python experiments/reliability.py --quick
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import parse_config, record_run  # noqa: E402
from framework.engine.faults import Fault, FaultPlan  # noqa: E402
from framework.examples import classifier_eval_fn, classifier_train_fn, digits_arrays, mlp_model_fn  # noqa: E402
from framework.store.catalog import SQLiteCatalog  # noqa: E402

SPACE = {"hidden": [16, 32], "lr": [0.05, 0.1, 0.2], "batch_size": [64]}  # 6 configs


@dataclass
class Defaults:
    seeds: int = 5  # seeds run and reported
    workers: int = 3  # workers (and partitions)
    epochs: int = 4  # epochs per config
    kill_rate: float = 0.04  # probability that a training unit's dispatch kills its worker
    hang_timeout_s: float = 8.0  # unit_timeout_s: how long the hung unit runs before its worker is restarted


QUICK = dict(seeds=1, epochs=3)


def _faults(seed: int, cfg: Defaults, crash: bool) -> list[Fault]:
    rng = np.random.default_rng(seed)
    n = len(automl.GridSearch(SPACE, epochs=1).configs())
    failing, hung = (int(c) for c in rng.choice(n, size=2, replace=False))
    # the hang is in epoch 0, before any crash can come, on a config that does not fail, and on a unit no kill
    # takes first: it always happens
    hang = (hung, 0, int(rng.integers(cfg.workers)))
    faults = [Fault("kill_worker", config_id=c, epoch=e, partition=p, kind="train")
              for c in range(n) for e in range(cfg.epochs) for p in range(cfg.workers)
              if rng.random() < cfg.kill_rate and (c, e, p) != hang]
    faults.append(Fault("hang", config_id=hang[0], epoch=hang[1], partition=hang[2], kind="train"))
    faults.append(Fault("raise", config_id=failing, epoch=1))
    if crash:
        faults.append(Fault("crash_driver", after_commit=int(rng.integers(0, cfg.epochs - 1))))
    return faults


def _selection(storage: str, seed: int, cfg: Defaults, faults: list[Fault]) -> framework.ModelSelection:
    x, y = digits_arrays()
    ds = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, seed=seed)
    return framework.ModelSelection(
        mlp_model_fn, classifier_train_fn, classifier_eval_fn, ds, automl.GridSearch(SPACE, epochs=cfg.epochs),
        num_workers=cfg.workers, seed=seed, storage_path=storage, progress=False, faults=FaultPlan(faults),
        unit_timeout_s=cfg.hang_timeout_s, max_worker_restarts=100, checkpoint="unit")


def _corrupt_newest_checkpoint(storage: str) -> int | None:
    """Flip 16 bytes of the newest checkpoint of an active config; returns the config, or None."""
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    try:
        active = catalog.configs().query("status == 'active'").config_id.tolist()
        newest = [(catalog.checkpoints(int(c))[0], int(c)) for c in active if catalog.checkpoints(int(c))]
    finally:
        catalog.close()
    if not newest:
        return None
    (_, _, path, _), cid = max(newest, key=lambda t: t[0][1])
    with open(path, "r+b") as f:
        f.seek(64)
        f.write(b"\xff" * 16)
    return cid


def _audit(storage: str, cfg: Defaults) -> dict:
    catalog = SQLiteCatalog(os.path.join(storage, "run.db"), readonly=True)
    try:
        units, events, configs = catalog.units(status=None), catalog.events(), catalog.configs()
    finally:
        catalog.close()
    done = units[units.status == "done"]
    twice = int(done.duplicated(["config_id", "epoch", "partition", "kind"]).sum())
    lost = 0
    for row in configs.itertuples():
        if row.status == "failed":
            continue
        for e in range(int(row.epochs)):
            trained = set(done[(done.config_id == row.config_id) & (done.epoch == e) & (done.kind == "train")].partition)
            lost += cfg.workers - len(trained)
    failed = events[events.kind == "worker_failed"].detail.map(json.loads)
    errors = configs[configs.status == "failed"].error.fillna("")
    return {"kills": int(sum(not d["why"].startswith("hung") for d in failed)),
            "hung": int(sum(d["why"].startswith("hung") for d in failed)),
            "units_rerun": int(units.status.isin(["interrupted", "lost", "unstarted"]).sum()),
            "units_lost": lost, "units_twice": twice,
            "failed_injected": int(errors.str.contains("InjectedFault").sum()),
            "rebuilt": int((events.kind == "checkpoint_rebuilt").sum()),
            "failed_corrupt": int(errors.str.contains("cannot resume").sum())}


def run_seed(seed: int, cfg: Defaults, out: str) -> dict:
    root = os.path.join(out, f"seed{seed}")
    clean, chaos = os.path.join(root, "clean"), os.path.join(root, "chaos")
    for d in (clean, chaos):
        if os.path.exists(os.path.join(d, "run.db")):
            raise FileExistsError(f"{d} holds a run already: choose another --out or --tag")
    t0 = time.time()
    _selection(clean, seed, cfg, []).run()
    clean_s = time.time() - t0
    t0 = time.time()  # the chaos run's driver is a child process that SIGKILLs itself after a commit
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", chaos, str(seed),
                           json.dumps(dataclasses.asdict(cfg))],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != -9:
        raise RuntimeError(f"the chaos driver was not killed by its fault ({proc.returncode}):\n{proc.stderr[-3000:]}")
    corrupted = _corrupt_newest_checkpoint(chaos)
    framework.ModelSelection.resume(chaos, mlp_model_fn, classifier_train_fn, classifier_eval_fn, progress=False,
                                    faults=FaultPlan(_faults(seed, cfg, crash=False))).run()
    chaos_s = time.time() - t0
    return {"seed": seed, **_audit(chaos, cfg), "corrupted_config": corrupted, "wall_s": chaos_s,
            "fault_free_s": clean_s, "wall_vs_fault_free": chaos_s / clean_s}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    rows = []
    for seed in range(cfg.seeds):
        rows.append(run_seed(seed, cfg, out))
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(out, "reliability.csv"), index=False)
    print(f"\n{cfg.seeds} seeds, {cfg.workers} workers, {cfg.epochs} epochs, kill rate {cfg.kill_rate}")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"\nunits lost: {df.units_lost.sum()} (must be 0); units trained twice: {df.units_twice.sum()} (must be 0)")
    record_run(out, cfg)
    return df


def _child(storage: str, seed: str, cfg_json: str) -> None:
    cfg = Defaults(**json.loads(cfg_json))
    _selection(storage, int(seed), cfg, _faults(int(seed), cfg, crash=True)).run()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:5])
    else:
        main()
