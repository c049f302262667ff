"""The README's first program on GPU workers: does it run, where do the partitions live, what does a unit cost, and
does `framework.replay` give back the run's metrics?

The first program (4 configs: hidden 32/128 x lr 0.01/0.1, batch 32, for 3 epochs on 2 workers, digits split into
2 partitions) runs with `worker_resources={"CPU": 1, "GPU": --gpu-share}` (`--device cpu`: `{"CPU": 1}`, no GPU),
once per way of writing it and per `data_on_device`:

    step_fn    `ModelSelection(mlp_model_fn, step_fn=classifier_step_fn)`: the engine's loop (the recommended way)
    train_fn   `classifier_train_fn` / `classifier_eval_fn` (`framework.examples`): a loop of one's own that moves
               each batch to the model's device
    readme     the README's own `model_fn` / `train_fn` / `eval_fn`, copied verbatim below: they never move data,
               so they run only where the partitions already live on the model's device

    data_on_device   auto (None: on the GPU when all of a worker's partitions fit in a quarter of its share of the
                     GPU's memory), true (on the GPU), false (in host memory, each batch copied to the GPU)

For every run it prints one row of a markdown table:

    runs          configs that completed, of those the grid has ("error: ..." when the run itself raised); a
                  config whose user code raised is failed and named in `error`
    data          where the workers' partitions lived: what each worker reported when it joined (the
                  `worker_joined` event's `data_device`); where the run's events do not say, an in-process `Worker`
                  with the run's device, share and `data_on_device`, loaded with the same partitions, answers
                  (`data_from` says which)
    run_s         the call to `run()`, Ray workers' start-up included
    train_unit_s  median seconds of a training unit (`result.schedule`, end - start); eval_unit_s likewise
    valid_acc     the best config's last `valid_accuracy`
    replay_<dev>  `framework.replay(run, device=dev)` against the run's metrics (every metric of every config and
                  epoch): "identical" (bit for bit), else the largest absolute difference; `--replay-devices run`
                  is the run's own device

Runs go to `runs/` in the results' folder; the table to `gpu_first_program.csv`. About 2.5 minutes on an H100
(Ray's start included).

    python experiments/gpu_first_program.py                            # on a machine with a GPU
    python experiments/gpu_first_program.py --device cpu --quick       # anywhere: the same questions, CPU workers
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import automl  # noqa: E402
import framework  # noqa: E402
from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.engine.worker import Worker  # noqa: E402
from framework.examples import (  # noqa: E402
    classifier_eval_fn,
    classifier_step_fn,
    classifier_train_fn,
    digits_arrays,
    mlp_model_fn,
)
from framework.functions import UserFunctions  # noqa: E402

PLACEMENTS = {"auto": None, "true": True, "false": False}
WAYS = ("step_fn", "train_fn", "readme")


# ---- the README's first program, verbatim ---------------------------------------------------------------------
def model_fn(config):
    """A config's model and optimizer, built on whichever worker trains it first."""
    hidden = config["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)


def train_fn(model, optimizer, data, config):
    """One pass over the training rows of the partition this worker holds; its metrics become train_<name>."""
    x, y = data
    total, bs = 0.0, config["batch_size"]
    for i in range(0, len(x), bs):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[i:i + bs]), y[i:i + bs])
        loss.backward()
        optimizer.step()
        total += loss.item() * len(x[i:i + bs])
    return {"loss": total / len(x)}


def eval_fn(model, data, config):
    """The partition's validation rows, under torch.no_grad(); its metrics become valid_<name>."""
    x, y = data
    logits = model(x)
    return {"loss": F.cross_entropy(logits, y).item(), "accuracy": (logits.argmax(1) == y).float().mean().item()}


# -----------------------------------------------------------------------------------------------------------------
@dataclass
class Defaults:
    device: str = "cuda"  # cuda: each worker asks Ray for --gpu-share of a GPU; cpu: CPU workers (no GPU asked)
    gpu_share: float = 0.5  # the GPU each worker asks for (worker_resources={"GPU": ...}) with --device cuda
    workers: int = 2  # workers, and partitions of the data (one each)
    epochs: int = 3  # epochs per config
    hidden: tuple = (32, 128)  # hidden widths of the grid
    lr: tuple = (0.01, 0.1)  # learning rates of the grid
    batch_size: int = 32  # rows per step
    rows: int = 0  # rows of digits to use (0: all 1797)
    ways: tuple = WAYS  # how the program is written: step_fn, train_fn (framework.examples), readme (verbatim)
    placements: tuple = ("auto", "true", "false")  # data_on_device values: auto (None), true, false
    replay_devices: tuple = ("run", "cpu")  # devices to replay each run on ("run": the run's own device)
    seed: int = 0  # run seed


QUICK = dict(epochs=1, hidden=(32,), lr=(0.1,), rows=400, placements=("auto",), replay_devices=("run",))


def check(cfg: Defaults) -> None:
    if cfg.device not in ("cpu", "cuda"):
        raise ValueError(f"`--device` is {cfg.device!r}, but must be cuda (GPU workers) or cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("`--device` is 'cuda', but this machine has no CUDA device: use --device cpu")
    if not 0 < cfg.gpu_share <= 1:
        raise ValueError(f"`--gpu-share` is {cfg.gpu_share}, but must be in (0, 1]")
    for name, allowed in (("ways", WAYS), ("placements", tuple(PLACEMENTS))):
        bad = [v for v in getattr(cfg, name) if v not in allowed]
        if bad:
            raise ValueError(f"`--{name}` has {bad}, but each must be one of {list(allowed)}")
    bad = [d for d in cfg.replay_devices if d != "run" and d not in ("cpu", "cuda")]
    if bad or ("cuda" in cfg.replay_devices and not torch.cuda.is_available()):
        raise ValueError(f"`--replay-devices` is {cfg.replay_devices}, but each must be run, cpu or cuda (on a "
                         "machine with a GPU)")
    if cfg.workers < 1 or cfg.epochs < 1 or cfg.batch_size < 1 or cfg.rows < 0:
        raise ValueError("`--workers`, `--epochs` and `--batch-size` must be >= 1 and `--rows` >= 0")


def functions(way: str) -> dict:
    """The user functions of `way`, as ModelSelection and replay take them."""
    if way == "step_fn":
        return {"model_fn": mlp_model_fn, "step_fn": classifier_step_fn}
    if way == "train_fn":
        return {"model_fn": mlp_model_fn, "train_fn": classifier_train_fn, "eval_fn": classifier_eval_fn}
    return {"model_fn": model_fn, "train_fn": train_fn, "eval_fn": eval_fn}


def last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:120] if lines else ""


def placed_by_events(result: framework.Result) -> str | None:
    """Where the run's workers said their partitions live (`worker_joined` events), e.g. "cuda:0"; None when the
    events do not say."""
    joined = result.events[result.events.kind == "worker_joined"]
    places = [json.loads(d).get("data_device") for d in joined.detail]
    if not places or any(p is None for p in places):
        return None
    return "+".join(sorted(set(places)))


def placed_in_process(cfg: Defaults, dataset: framework.PartitionedDataset, data_on_device: bool | None) -> str:
    """Where an in-process `Worker` like the run's (device, GPU share, data_on_device) puts the partitions a run's
    worker holds: the first worker's, and every worker's when they differ."""
    entries = dataset.worker_entries()
    places = set()
    for w in range(cfg.workers):
        worker = Worker(w, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn), device=cfg.device,
                        data_on_device=data_on_device, device_fraction=cfg.gpu_share if cfg.device == "cuda" else 1.0)
        worker.load({p: entries[p] for p, ws in dataset.placement(cfg.workers).items() if w in ws})
        places |= set(worker.data_placed.values())
        del worker
    return "+".join(sorted(places))


def compare(run: pd.DataFrame, replayed: pd.DataFrame) -> str:
    """The replay's metrics against the run's: "identical", or the largest absolute difference."""
    key = ["config_id", "epoch"]
    cols = sorted(c for c in run.columns if c.startswith(("train_", "valid_")) and c in replayed.columns)
    a, b = run.set_index(key)[cols].sort_index(), replayed.set_index(key)[cols].sort_index()
    if not a.index.equals(b.index):
        return f"other epochs ({len(b)} rows, run {len(a)})"
    x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
    if np.array_equal(x, y, equal_nan=True):
        return "identical"
    return f"max diff {np.nanmax(np.abs(x - y)):.2g}"


def run_one(cfg: Defaults, way: str, placement: str, dataset: framework.PartitionedDataset, root: str) -> dict:
    fns = functions(way)
    resources = {"CPU": 1, "GPU": cfg.gpu_share} if cfg.device == "cuda" else {"CPU": 1}
    path = os.path.join(root, f"{way}-{placement}")
    space = {"hidden": list(cfg.hidden), "lr": list(cfg.lr), "batch_size": cfg.batch_size}
    row: dict = {"way": way, "data_on_device": placement}
    t0 = time.perf_counter()
    try:
        result = framework.ModelSelection(
            dataset=dataset, procedure=automl.GridSearch(space, epochs=cfg.epochs), num_workers=cfg.workers,
            worker_resources=resources, data_on_device=PLACEMENTS[placement], metric="valid_accuracy", mode="max",
            seed=cfg.seed, storage_path=path, progress=False, **fns).run()
    except Exception as e:  # noqa: BLE001 - the question is whether it runs: the answer goes in the table
        traceback.print_exc()
        return {**row, "runs": f"error: {type(e).__name__}: {last_line(str(e))}"}
    row["run_s"] = time.perf_counter() - t0
    status = result.status
    done = int((status.status == "completed").sum())
    row["runs"] = f"{done} of {len(status)}"
    failed = status[status.status == "failed"]
    row["error"] = last_line(failed.error.iloc[0]) if len(failed) else ""
    data = placed_by_events(result)
    row["data"], row["data_from"] = (data, "events") if data is not None else (
        placed_in_process(cfg, dataset, PLACEMENTS[placement]), "in-process")
    spans = result.schedule.end - result.schedule.start
    for kind in ("train", "eval"):
        row[f"{kind}_unit_s"] = float(spans[result.schedule.kind == kind].median())
    row["valid_acc"] = float(result.get_best_result().metrics["valid_accuracy"]) if done else float("nan")
    for dev in cfg.replay_devices:
        name = f"replay_{dev}"
        if done == 0:
            row[name] = "n/a"
            continue
        t1 = time.perf_counter()
        try:
            replayed = framework.replay(path, device=None if dev == "run" else dev, **fns,
                                        out_path=f"{path}-replay-{dev}")
            row[name] = compare(result.metrics, replayed.metrics)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row[name] = f"error: {type(e).__name__}: {last_line(str(e))}"
        row[f"{name}_s"] = time.perf_counter() - t1
    return row


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    import ray

    from framework.engine.ray_backend import ensure_ray

    ensure_ray(min_cpus=cfg.workers)
    x, y = digits_arrays()
    if cfg.rows:
        x, y = x[:cfg.rows], y[:cfg.rows]
    dataset = framework.PartitionedDataset.from_arrays(x, y, num_partitions=cfg.workers, valid_fraction=0.2, seed=0)
    root = os.path.join(out, "runs")
    os.makedirs(root, exist_ok=True)
    rows = []
    t0 = time.perf_counter()
    for way in cfg.ways:
        for placement in cfg.placements:
            row = run_one(cfg, way, placement, dataset, root)
            rows.append(row)
            print(f"{way} data_on_device={placement}: " + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                if k not in ("way", "data_on_device")), flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "gpu_first_program.csv"), index=False)
    device = (f"{torch.cuda.get_device_name(0)}, {cfg.gpu_share:g} GPU per worker" if cfg.device == "cuda"
              else f"CPU workers ({os.cpu_count()} cores)")
    print(f"\nThe README's first program ({len(cfg.hidden) * len(cfg.lr)} configs x {cfg.epochs} epochs on "
          f"{cfg.workers} workers, {len(x)} digits) on {device}; torch {torch.__version__}, ray {ray.__version__}; "
          f"{time.perf_counter() - t0:.0f} s in all:\n")
    shown = [c for c in table.columns if not c.endswith("_s") or c in ("run_s", "train_unit_s", "eval_unit_s")]
    print(markdown(table[shown]))
    record_run(out, cfg, device_name=device, torch=torch.__version__, ray=ray.__version__)
    return table


if __name__ == "__main__":
    main()
