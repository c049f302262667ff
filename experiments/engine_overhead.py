"""The engine's own overhead: emulated units, so the engine (not the CPU) is what is measured.

Every unit of a config sleeps `unit_s` (an eval unit `eval_fraction` of it) and its model carries a parameter of
`state_mb` MB, so 16-32 workers fit on 2 cores and a hop moves a state of a known size. There are 2p configs
(a grid) for `epochs` epochs on p workers, one partition each. For every cell (p, unit time, state size) it prints:

    utilisation   busy time / (span x p), span from the first unit's start to the last unit's end
    sim           the simulator's utilisation for the same workload (same policy, same barrier, no overhead)
    gap_ms        mean idle time between two consecutive units of a worker
    hop_GBps      state bytes moved per second of gap (the rate a hop would need to explain the gap alone)
    cpu_ms/unit   the driver process's CPU time per completed unit, first and last epoch
    startup_s     from the call to the first unit's start (Ray, actors, imports, data), next to the time this machine
                  takes to start p Python processes that import torch, side by side in the same run
    teardown_s    from the last unit's end to the call's return (the last checkpoints, results, workers stopped)

    python experiments/engine_overhead.py --quick
    python experiments/engine_overhead.py --workers 16 --unit-s 0.5 --state-mb 1 100
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import engine_columns, parse_config, record_run, utilisation  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from simulators import Workload, simulate  # noqa: E402


@dataclass
class Defaults:
    workers: tuple = (2, 8, 16, 32)  # p values: workers (and partitions), one cell each
    unit_s: tuple = (0.05, 0.5, 2.0)  # seconds each training unit sleeps, one cell each
    state_mb: tuple = (1.0, 100.0)  # MB of model state a hop moves, one cell each
    epochs: int = 3  # epochs per config
    eval_fraction: float = 0.1  # an eval unit's time as a fraction of a training unit's
    queue_depth: int = 2  # units queued per worker (ModelSelection's queue_depth)
    checkpoint: str = "epoch"  # when configs are checkpointed (ModelSelection's checkpoint)
    scheduler: str = "mwr"  # dense for equal unit times: the simulator loses nothing to the barrier
    max_state_gb: float = 4.0  # skip cells whose live states (2p configs x state) exceed this
    startup_baseline: bool = True  # also time p bare `python -c "import torch"` processes
    seed: int = 0  # seeds the policy and the runs
    keep_runs: bool = False  # keep every cell's run directory under the output folder's runs/ (else a temporary one)


QUICK = dict(workers=(2, 8), unit_s=(0.05, 0.5), state_mb=(1.0,), epochs=2)


# ---- emulated compute: picklable by reference, so Ray workers import them from this module --------------------
class Blob(torch.nn.Module):
    """A model that is nothing but a parameter of a given size (the state a hop moves)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(numel))


def model_fn(config: dict):
    model = Blob(int(config["state_mb"] * 2**20 / 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.0)


def train_fn(model, optimizer, data, config):
    time.sleep(config["unit_s"])
    return {"loss": 1.0}


def eval_fn(model, data, config):
    time.sleep(config["unit_s"] * config["eval_fraction"])
    return {"loss": 1.0}


def _dataset(p: int) -> framework.PartitionedDataset:
    x, y = torch.zeros(p * 10, 2), torch.zeros(p * 10, dtype=torch.long)
    return framework.PartitionedDataset.from_arrays(x, y, num_partitions=p)


def startup_baseline(p: int) -> float:
    """Seconds until p concurrent `python -c "import torch"` processes have all exited."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import torch"]) for _ in range(p)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - t0


def predicted(p: int, cfg: Defaults, unit_s: float) -> float:
    """The simulator's utilisation for the cell: the same policy and barrier, units of exactly their time."""
    workload = Workload(np.full((2 * p, p), unit_s), {**{q: (q,) for q in range(p)}, **{p + q: (q,) for q in range(p)}},
                        eval_partitions=tuple(range(p, 2 * p)), eval_fraction=cfg.eval_fraction)
    sim = simulate(workload, cfg.scheduler, epochs=cfg.epochs, seed=cfg.seed, queue_depth=cfg.queue_depth)
    u, _, _ = utilisation(sim.schedule, p)
    return u


def run_cell(p: int, unit_s: float, state_mb: float, cfg: Defaults, root: str) -> dict:
    space = {"i": list(range(2 * p)), "unit_s": [unit_s], "state_mb": [state_mb], "eval_fraction": [cfg.eval_fraction]}
    path = os.path.join(root, f"p{p}-u{unit_s}-s{state_mb}-q{cfg.queue_depth}")
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.time()
    ms = framework.ModelSelection(
        model_fn, train_fn, eval_fn, _dataset(p), automl.GridSearch(space, epochs=cfg.epochs), num_workers=p,
        scheduler=cfg.scheduler, seed=cfg.seed, storage_path=path, progress=False, metric="valid_loss",
        queue_depth=cfg.queue_depth, checkpoint=cfg.checkpoint)
    result = ms.run()
    t1 = time.time()
    cols = engine_columns(result, p, t0, t1)
    gap = cols["gap_ms"] / 1000
    return {"p": p, "unit_s": unit_s, "state_mb": state_mb, "utilisation": cols.pop("utilisation"),
            "sim": predicted(p, cfg, unit_s), "gap_ms": cols.pop("gap_ms"),
            "hop_GBps": state_mb / 1024 / gap if gap > 0 else float("inf"), **cols, "units": len(result.schedule)}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK)
    ensure_ray(min_cpus=max(cfg.workers))
    rows = []
    if cfg.keep_runs:
        os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    with (contextlib.nullcontext(os.path.join(out, "runs")) if cfg.keep_runs
          else tempfile.TemporaryDirectory(prefix="engine-overhead-")) as root:
        for p in cfg.workers:
            base = startup_baseline(p) if cfg.startup_baseline else float("nan")
            for unit_s in cfg.unit_s:
                for state_mb in cfg.state_mb:
                    if 2 * p * state_mb / 1024 > cfg.max_state_gb:
                        print(f"skip p={p} state={state_mb} MB: {2 * p * state_mb / 1024:.1f} GB of live states "
                              f"> --max-state-gb {cfg.max_state_gb}")
                        continue
                    row = run_cell(p, unit_s, state_mb, cfg, root)
                    row["torch_procs_s"] = base
                    rows.append(row)
                    print(pd.DataFrame([row]).to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(os.path.join(out, "engine_overhead.csv"), index=False)
    print("\n" + df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    record_run(out, cfg)
    return df


if __name__ == "__main__":
    main()
