"""What the step-level contract costs: the engine's loop around a `step_fn` against a hand-written `train_fn`.

The same MLP (`framework.examples.mlp_model_fn`, SGD with momentum) trains the same partition of synthetic data
(`synthetic_classification`) two ways, on two in-process `framework.engine.worker.Worker`s (no Ray):

    step   `Worker(UserFunctions(mlp_model_fn, step_fn=classifier_step_fn))`: the engine's `StepLoop` shuffles,
           batches, moves, steps the optimizer and keeps the metrics' sums on the device (one host sync per pass)
    hand   `Worker(UserFunctions(mlp_model_fn, train_fn=classifier_train_fn))`: the escape hatch, the loop written
           by hand (two `.item()` syncs per step)

Each way trains one config for `--warmup + --units` training units in a chain (unit e starts from the state unit
e - 1 left, as a config's units do in a run), with the same run seed. Units of the two ways alternate, and which way
goes first alternates pair by pair (A B, B A, A B, ...), so drift in the machine's speed (turbo, other load) falls on
both alike; the warm-up units are not timed. A unit's seconds are its report's `end - start`: what the engine
records in the schedule log (state unpacked, model built, the pass, state packed). On a shared machine, other
processes' load lands in wall seconds unevenly; `--clock cpu` compares the process's CPU seconds over the same span
(`time.process_time`: this process's threads only; on a GPU it counts the host's side, waits included) instead.

For every cell (hidden width x batch size) it prints a markdown table:

    step_s, hand_s   median seconds of one unit, each way (by `--clock`: wall or cpu)
    ratio            step_s / hand_s: above 1, the engine's loop costs more than the hand-written one
    pair_lo/hi       the 25th and 75th percentiles of the per-pair ratios (the noise around `ratio`)
    ok               ratio <= --target (1.05: the loop may cost at most 5 % more than a hand-written one)
    cpu_ratio        the same ratio by the other clock (`wall_ratio` with `--clock cpu`)
    same_weights     whether both ways end with bit-identical states (weights and SGD momentum): expected on CPU, where
                     both draw the same batches from the unit's seed and run the same arithmetic
    max_diff         the largest absolute difference between the two final models' weights

A last line gives the geometric mean of the ratios over all cells. A cell's ratio moves by several percent from
one run of the script to the next, also on an idle machine (wall and CPU seconds alike), so read a single cell's
`ok` against that spread, and the mean over cells as the loop's cost.

Where the data lives on a GPU (`--device cuda`) follows `--data-on-device` (auto: on the GPU when it fits, as
`ModelSelection(data_on_device=None)` does). Writes `step_overhead.csv` (one row per cell) and `units.csv` (every
timed unit) to the results' folder, and `step_overhead.png` with `--plot`.

    python experiments/step_overhead.py --quick                 # a few seconds
    python experiments/step_overhead.py                         # under a minute on 2 CPU cores
    python experiments/step_overhead.py --device cuda --rows 8192  # about a minute on an H100
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

from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.engine.state import unpack_state  # noqa: E402
from framework.engine.worker import Worker  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_step_fn,
    classifier_train_fn,
    mlp_model_fn,
    synthetic_classification,
)
from framework.functions import UserFunctions  # noqa: E402
from framework.scheduling.units import TRAIN, Unit, UnitTask  # noqa: E402

PLACEMENTS = {"auto": None, "true": True, "false": False}


@dataclass
class Defaults:
    hidden: tuple = (64, 512, 2048)  # MLP hidden widths, one cell each (with every batch size)
    batch_size: tuple = (32, 256)  # rows per step, one cell each (with every hidden width)
    rows: int = 4096  # training rows in the partition: one unit is one pass over them
    features: int = 64  # input features of the synthetic data
    layers: int = 1  # hidden layers of the MLP
    units: int = 20  # timed units per way and cell, after the warm-up
    warmup: int = 2  # untimed units per way and cell, first
    device: str = "cpu"  # where the workers train: cpu, cuda, cuda:1, ...
    data_on_device: str = "auto"  # on a GPU: auto (on the GPU when it fits), true (on it) or false (host memory)
    threads: int = 1  # torch threads (a run's CPU worker uses as many as it has CPUs: 1 by default)
    target: float = 1.05  # the ratio step/hand the step loop must stay within
    clock: str = "wall"  # what a unit's seconds are: wall (the report's end - start) or cpu (process CPU seconds)
    seed: int = 0  # run seed: the data, the model's initial weights and every unit's batches
    plot: bool = False  # also write step_overhead.png (ratio per cell)


QUICK = dict(hidden=(16, 64), batch_size=(32,), rows=256, units=4, warmup=1)


def check(cfg: Defaults) -> None:
    if cfg.clock not in ("wall", "cpu"):
        raise ValueError(f"`--clock` is {cfg.clock!r}, but must be wall or cpu")
    if cfg.data_on_device not in PLACEMENTS:
        raise ValueError(f"`--data-on-device` is {cfg.data_on_device!r}, but must be one of {sorted(PLACEMENTS)}")
    try:
        device = torch.device(cfg.device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"`--device` is {cfg.device!r}, but must be a torch device such as cpu or cuda") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`--device` is {cfg.device!r}, but this machine has no CUDA device")
    for name in ("units", "rows", "features", "layers", "threads"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"`--{name}` is {getattr(cfg, name)}, but must be >= 1")
    if cfg.warmup < 0:
        raise ValueError(f"`--warmup` is {cfg.warmup}, but must be >= 0")
    if max(cfg.batch_size) > cfg.rows or min(cfg.batch_size) < 1:
        raise ValueError(f"`--batch-size` is {cfg.batch_size}, but each must be in 1..--rows ({cfg.rows})")
    if min(cfg.hidden) < 1:
        raise ValueError(f"`--hidden` is {cfg.hidden}, but each must be >= 1")


def geomean(values: pd.Series) -> float:
    return float(np.exp(np.log(values.to_numpy(dtype=float)).mean()))


def _same(a: object, b: object) -> bool:
    """Whether two unpacked states are equal leaf by leaf (tensors bit for bit). (Not their packed buffers: the
    alignment padding between tensors there is left uninitialized.)"""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    return bool(a == b)


def _weights(state: object) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in unpack_state(state)["model"].items()}


def run_cell(cfg: Defaults, hidden: int, batch: int, data: tuple, valid: tuple) -> tuple[dict, list[dict]]:
    """Both ways on one (hidden, batch) cell: the cell's row of the table, and one row per timed unit."""
    config = {"hidden": hidden, "batch_size": batch, "in_features": cfg.features, "layers": cfg.layers,
              "classes": 10, "lr": 0.01}
    common = dict(device=cfg.device, num_threads=cfg.threads, data_on_device=PLACEMENTS[cfg.data_on_device])
    workers = {"step": Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn), **common),
               "hand": Worker(1, UserFunctions(mlp_model_fn, classifier_train_fn, classifier_eval_fn), **common)}
    for w in workers.values():
        w.load({0: ([data], [valid])})
    placed = {way: w.data_placed[("train", 0)] for way, w in workers.items()}
    states: dict[str, object] = {"step": None, "hand": None}
    units = []
    for e in range(cfg.warmup + cfg.units):
        order = ("step", "hand") if e % 2 == 0 else ("hand", "step")
        for way in order:
            task = UnitTask(Unit(0, e, 0, TRAIN), config, cfg.seed)
            cpu = time.process_time()
            states[way], report = workers[way].run(task, states[way])
            cpu = time.process_time() - cpu
            if report.error is not None:
                raise RuntimeError(f"the {way} way failed on hidden={hidden} batch={batch}:\n{report.error}")
            if e >= cfg.warmup:
                units.append({"hidden": hidden, "batch_size": batch, "unit": e - cfg.warmup, "way": way,
                              "first": way == order[0], "wall": report.end - report.start,
                              "cpu": cpu, "loss": report.metrics["loss"]})
    a, b = _weights(states["step"]), _weights(states["hand"])
    same = _same(unpack_state(states["step"]), unpack_state(states["hand"]))
    max_diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    timed = pd.DataFrame(units)
    secs = timed.pivot(index="unit", columns="way", values=cfg.clock)
    other = "cpu" if cfg.clock == "wall" else "wall"
    others = timed.pivot(index="unit", columns="way", values=other).median()
    pair = secs["step"] / secs["hand"]
    step_s, hand_s = float(secs["step"].median()), float(secs["hand"].median())
    row = {"hidden": hidden, "batch_size": batch, "steps_per_unit": -(-cfg.rows // batch),
           "step_s": step_s, "hand_s": hand_s, "ratio": step_s / hand_s,
           "pair_lo": float(pair.quantile(0.25)), "pair_hi": float(pair.quantile(0.75)),
           "ok": step_s / hand_s <= cfg.target, f"{other}_ratio": float(others["step"] / others["hand"]),
           "same_weights": same, "max_diff": max_diff,
           "data": placed["step"] if placed["step"] == placed["hand"] else f"{placed['step']}/{placed['hand']}"}
    return row, units


def plot(table: pd.DataFrame, target: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"h{h}\nb{b}" for h, b in zip(table.hidden, table.batch_size)]
    x = np.arange(len(table))
    ax.errorbar(x, table.ratio, yerr=[table.ratio - table.pair_lo, table.pair_hi - table.ratio], fmt="o", capsize=3)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(target, color="red", lw=0.8, ls="--", label=f"target {target:g}")
    ax.set_xticks(x, labels)
    ax.set_ylabel("unit seconds, step_fn / train_fn")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    threads = torch.get_num_threads()
    x, y = synthetic_classification(cfg.rows + cfg.rows // 4, cfg.features, seed=cfg.seed)
    data = (torch.from_numpy(x[:cfg.rows]), torch.from_numpy(y[:cfg.rows]))
    valid = (torch.from_numpy(x[cfg.rows:]), torch.from_numpy(y[cfg.rows:]))
    rows, units = [], []
    t0, load = time.perf_counter(), os.getloadavg()
    try:
        for hidden in cfg.hidden:
            for batch in cfg.batch_size:
                row, timed = run_cell(cfg, hidden, batch, data, valid)
                rows.append(row)
                units += timed
                print(f"hidden={hidden} batch={batch}: step {row['step_s']:.4f} s, hand {row['hand_s']:.4f} s "
                      f"({cfg.clock}), ratio {row['ratio']:.3f}", flush=True)
    finally:
        torch.set_num_threads(threads)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "step_overhead.csv"), index=False)
    pd.DataFrame(units).to_csv(os.path.join(out, "units.csv"), index=False)
    if cfg.plot:
        plot(table, cfg.target, os.path.join(out, "step_overhead.png"))
    name = torch.cuda.get_device_name(torch.device(cfg.device)) if cfg.device.startswith("cuda") else \
        f"{os.cpu_count()} CPU cores, {cfg.threads} torch thread(s)"
    print(f"\nstep_fn (engine loop) vs train_fn (hand loop) on {cfg.device} ({name}), torch {torch.__version__}; "
          f"{cfg.rows} rows per unit, {cfg.clock} seconds, median of {cfg.units} interleaved units per way after "
          f"{cfg.warmup} warm-up ({time.perf_counter() - t0:.0f} s in all; load average before "
          f"{load[0]:.1f}, after {os.getloadavg()[0]:.1f}):\n")
    print(markdown(table))
    missed = table[~table.ok]
    print(f"\nwithin {100 * (cfg.target - 1):.0f} % in {len(table) - len(missed)} of {len(table)} cells"
          + (f"; missed: {', '.join(f'h{h}/b{b}' for h, b in zip(missed.hidden, missed.batch_size))}"
             if len(missed) else "")
          + f"; identical states in {int(table.same_weights.sum())} of {len(table)}")
    other = "cpu_ratio" if cfg.clock == "wall" else "wall_ratio"
    print(f"all cells: geometric mean ratio {geomean(table.ratio):.3f} ({other.replace('_', ' ')} "
          f"{geomean(table[other]):.3f})")
    record_run(out, cfg, device_name=name, torch=torch.__version__)
    return table


if __name__ == "__main__":
    main()
