"""What loading a partitioned dataset costs each worker: model hopper parallelism, where each worker reads only the
partitions it holds, against task parallelism, where every worker reads all the data.

Generates `--gb` of synthetic classification data (`--features` float32 columns and an int64 `label`; 95 % train,
5 % valid) as `--partitions` Parquet files, and in the other `--formats`: `arrow` (the same rows as a Hugging Face
dataset saved with `save_to_disk`, one Arrow file per partition), `torch` (a `torch.utils.data.Dataset` over a
memory-mapped .npy, indexed row by row, each partition a contiguous range: `from_torch_dataset(seed=None)`) and
`torch-shuffled` (the same, rows shuffled across partitions: the default `seed=0`, whose rows touch every page of
the file). The torch ones are slow (a Python call per row), so not in the defaults. For each format and each of
`--replicas`, it starts `--workers` fresh Ray actors, each holding an in-process `framework.engine.worker.Worker`,
and has them load at the same time what a run's workers would:

    mop    the partitions the placement gives the worker (`PartitionedDataset.placement`: partition j on workers
           j, ..., j + replicas - 1), each read by its source on the worker (`Worker.load`)
    task   every partition (what the full-data executors load: `worker_entries(per_partition=False)`); replicas
           do not apply, so it runs once per format

Columns (per way; worker figures are the largest over the workers, measured inside each worker around its load):

    load_s        from the load calls to the last worker loaded: the seconds before the first unit could start
    peak_rss_mb   the worker's peak resident memory during the load (VmHWM, reset by /proc/self/clear_refs before)
    held_mb       bytes of the tensors the worker keeps (`Worker.data_nbytes`)
    read_mb       bytes the worker read: read(2) calls (/proc/self/io rchar) plus the pages of memory-mapped files
                  it touched (the rises of its RssFile, sampled every 2 ms: Parquet and Arrow are memory-mapped,
                  which rchar does not count; the readers' own libraries are loaded before, not counted)
    read_vs_task  read_mb over task parallelism's read_mb (about replicas / partitions is what MOP promises)
    fingerprint_s the seconds the worker's sources took to fingerprint what they read (`Source.fingerprint`, part
                  of the load: measured again after it, on the same files)
    fingerprint_pct  fingerprint_s over load_s, in percent (what recording the data costs a run's start)

The files sit in the page cache once written, so the seconds are memory speed, not disk speed: they compare the ways,
not storage. Writes data_loading.csv; the generated data goes to a temporary folder, removed at the end (--keep-data
keeps it in the results' folder).

    python experiments/data_loading.py --quick        # 50 MB, seconds
    python experiments/data_loading.py --gb 0.25      # about a minute on 2 CPU cores (4 with both torch formats)
    python experiments/data_loading.py                # 1 GB
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from experiments._common import markdown, parse_config, record_run  # noqa: E402
from framework.data import PartitionedDataset  # noqa: E402
from framework.engine.ray_backend import ensure_ray  # noqa: E402
from framework.sources import Source  # noqa: E402

FORMATS = ("parquet", "arrow", "torch", "torch-shuffled")


@dataclass
class Defaults:
    gb: float = 1.0  # size of the generated dataset, in GB (10^9 bytes) of tensors
    features: int = 64  # float32 feature columns per row
    workers: int = 4  # Ray actors loading at once
    partitions: int = 4  # partitions of the data (one Parquet file each)
    replicas: tuple = (1, 2)  # workers holding each partition, one MOP row each
    formats: tuple = ("parquet", "arrow")  # of parquet, arrow (saved Hugging Face), torch, torch-shuffled (row by row)
    seed: int = 0  # the generated data
    keep_data: bool = False  # keep the generated data in the results' folder


QUICK = dict(gb=0.05)


def check(cfg: Defaults) -> None:
    if not cfg.gb > 0:
        raise ValueError(f"`--gb` is {cfg.gb}, but must be > 0")
    for name in ("features", "workers", "partitions"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"`--{name}` is {getattr(cfg, name)}, but must be >= 1")
    if not all(1 <= r <= cfg.workers for r in cfg.replicas):
        raise ValueError(f"`--replicas` is {cfg.replicas}, but each must be in 1..--workers ({cfg.workers})")
    bad = [f for f in cfg.formats if f not in FORMATS]
    if bad:
        raise ValueError(f"`--formats` names {bad}, but each must be one of {list(FORMATS)}")
    if "arrow" in cfg.formats:
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            raise ValueError("`--formats` names arrow, which needs the `datasets` package: pip install modelhopper[hf]")


# ---- data ---------------------------------------------------------------------------------------------------------
def generate(cfg: Defaults, folder: str) -> dict[str, tuple[str, str]]:
    """The data as each format's (train, valid) locations; every partition's file written in chunks (memory stays
    near one chunk)."""
    rows = int(cfg.gb * 1e9 / (4 * cfg.features + 8))
    n_valid = max(cfg.partitions, rows // 20)
    rng = np.random.default_rng(cfg.seed)
    centres = rng.normal(size=(10, cfg.features)).astype(np.float32)
    out = {}
    names = [f"f{k}" for k in range(cfg.features)]
    for split, count, files in (("train", rows - n_valid, cfg.partitions), ("valid", n_valid, 1)):
        os.makedirs(os.path.join(folder, "parquet", split))
        for i, part in enumerate(np.array_split(np.arange(count), files)):
            path = os.path.join(folder, "parquet", split, f"part-{i:03d}.parquet")
            writer = None
            for chunk in np.array_split(part, max(1, len(part) // 200_000)):
                y = rng.integers(0, 10, len(chunk))
                x = centres[y] + rng.normal(size=(len(chunk), cfg.features)).astype(np.float32)
                table = pa.table({**{n: x[:, k] for k, n in enumerate(names)}, "label": y.astype(np.int64)})
                writer = writer or pq.ParquetWriter(path, table.schema, use_dictionary=False)
                writer.write_table(table, row_group_size=65_536)
            writer.close()
    out["parquet"] = tuple(os.path.join(folder, "parquet", s) for s in ("train", "valid"))
    if "arrow" in cfg.formats:
        import datasets

        datasets.disable_progress_bars()
        for split, shards in (("train", cfg.partitions), ("valid", 1)):
            files = sorted(os.path.join(out["parquet"][split == "valid"], f)
                           for f in os.listdir(out["parquet"][split == "valid"]))
            d = datasets.Dataset.from_parquet(files, cache_dir=os.path.join(folder, "hf_cache"))
            d.save_to_disk(os.path.join(folder, "arrow", split), num_shards=shards)
        shutil.rmtree(os.path.join(folder, "hf_cache"), ignore_errors=True)
        out["arrow"] = tuple(os.path.join(folder, "arrow", s) for s in ("train", "valid"))
    if {"torch", "torch-shuffled"} & set(cfg.formats):
        for split, where in (("train", 0), ("valid", 1)):
            table = pq.read_table(out["parquet"][where])
            np.save(os.path.join(folder, f"{split}_x.npy"),
                    np.stack([table.column(n).to_numpy() for n in names], axis=1))
            np.save(os.path.join(folder, f"{split}_y.npy"), table.column("label").to_numpy())
            del table
        out["torch"] = out["torch-shuffled"] = tuple(os.path.join(folder, s) for s in ("train", "valid"))
    return out


class MemmapRows(torch.utils.data.Dataset):
    """Rows of `<prefix>_x.npy` and `<prefix>_y.npy`, memory-mapped when first indexed (in the worker)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.n = int(np.load(f"{prefix}_y.npy", mmap_mode="r").shape[0])
        self._x = self._y = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._x is None:
            self._x = np.load(f"{self.prefix}_x.npy", mmap_mode="r")
            self._y = np.load(f"{self.prefix}_y.npy", mmap_mode="r")
        return torch.from_numpy(np.array(self._x[i])), int(self._y[i])

    def __getstate__(self) -> dict:
        return {"prefix": self.prefix, "n": self.n, "_x": None, "_y": None}


def dataset(fmt: str, where: tuple[str, str], cfg: Defaults, replicas: int) -> PartitionedDataset:
    """The format's `PartitionedDataset`: `--partitions` partitions of train and valid."""
    train, valid = where
    if fmt == "parquet":
        return PartitionedDataset.from_parquet(train, valid, num_partitions=cfg.partitions, replicas=replicas)
    if fmt == "arrow":
        return PartitionedDataset.from_hf_dataset(train, valid, num_partitions=cfg.partitions, replicas=replicas)
    return PartitionedDataset.from_torch_dataset(MemmapRows(train), cfg.partitions, valid=MemmapRows(valid),
                                                 replicas=replicas, seed=None if fmt == "torch" else cfg.seed)


# ---- workers ------------------------------------------------------------------------------------------------------
def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


@ray.remote(num_cpus=1)
class Probe:
    """A fresh worker process holding an in-process `Worker`; `load` measures itself."""

    def __init__(self) -> None:
        # the readers' modules and libraries now, so that their files are not counted as data read in `load`
        import pyarrow.compute  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
        from torch.utils.data import default_collate  # noqa: F401

        from framework.engine.worker import Worker
        from framework.examples import classifier_step_fn, mlp_model_fn
        from framework.functions import UserFunctions
        from framework.sources import table_to_tensors

        self.worker = Worker(0, UserFunctions(mlp_model_fn, step_fn=classifier_step_fn))
        table_to_tensors(pa.table({"x": [1.0], "label": [0]}), None, "label")  # (pyarrow.compute's first call)

    def ready(self) -> int:
        return os.getpid()

    def load(self, partitions: dict) -> dict[str, float]:
        """`Worker.load(partitions)` with its peak memory and the bytes it read."""
        mapped, stop = [0, _status("RssFile")], threading.Event()

        def sample() -> None:  # the rises of file-backed memory: pages of mapped files touched (a file unmapped
            while not stop.is_set():  # after its read makes room for the next file's, which count again)
                now = _status("RssFile")
                mapped[0] += max(0, now - mapped[1])
                mapped[1] = now
                time.sleep(0.002)

        with open("/proc/self/clear_refs", "w") as f:  # VmHWM from now on
            f.write("5")
        sampler = threading.Thread(target=sample, daemon=True)
        rchar = _rchar()
        sampler.start()
        self.worker.load(partitions)
        stop.set()
        sampler.join()
        figures = {"peak_rss_mb": _status("VmHWM") / 1e6, "held_mb": self.worker.data_nbytes() / 1e6,
                   "read_mb": (_rchar() - rchar + mapped[0]) / 1e6}
        t0 = time.perf_counter()  # the fingerprints `load` computed once, again: what recording the data costs
        for source in (e for pair in partitions.values() for split in pair for e in split if isinstance(e, Source)):
            source.fingerprint()
        return {**figures, "fingerprint_s": time.perf_counter() - t0}


def measure(ds: PartitionedDataset, cfg: Defaults, way: str) -> dict[str, float]:
    """Start `--workers` probes, have them load what `way` gives each at once, and gather the figures."""
    if way == "mop":
        entries = ds.worker_entries()
        placement = ds.placement(cfg.workers)
        loads = [{p: entries[p] for p, ws in placement.items() if w in ws} for w in range(cfg.workers)]
    else:
        loads = [ds.worker_entries(per_partition=False)] * cfg.workers
    probes = [Probe.remote() for _ in range(cfg.workers)]
    try:
        ray.get([p.ready.remote() for p in probes])
        t0 = time.perf_counter()
        figures = ray.get([p.load.remote(parts) for p, parts in zip(probes, loads)])
        seconds = time.perf_counter() - t0
    finally:
        for p in probes:
            ray.kill(p)
    worst = pd.DataFrame(figures).max()
    return {"load_s": seconds, **{k: float(v) for k, v in worst.items()}}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    cfg, out = parse_config(Defaults, argv, __doc__, QUICK, check)
    ensure_ray(min_cpus=cfg.workers)
    folder = os.path.join(out, "data") if cfg.keep_data else tempfile.mkdtemp(prefix="modelhopper-data-loading-")
    rows = []
    try:
        t0 = time.perf_counter()
        where = generate(cfg, folder)
        print(f"generated {cfg.gb} GB in {time.perf_counter() - t0:.0f} s", flush=True)
        for fmt in cfg.formats:
            task = measure(dataset(fmt, where[fmt], cfg, 1), cfg, "task")
            rows.append({"format": fmt, "way": "task", "replicas": "-", **task, "read_vs_task": 1.0,
                         "fingerprint_pct": 100 * task["fingerprint_s"] / task["load_s"]})
            for r in cfg.replicas:
                mop = measure(dataset(fmt, where[fmt], cfg, r), cfg, "mop")
                rows.append({"format": fmt, "way": "mop", "replicas": r, **mop,
                             "read_vs_task": mop["read_mb"] / task["read_mb"],
                             "fingerprint_pct": 100 * mop["fingerprint_s"] / mop["load_s"]})
                print(f"{fmt} mop r={r}: {mop['load_s']:.1f} s, read {mop['read_mb']:.0f} MB (task: "
                      f"{task['read_mb']:.0f} MB)", flush=True)
    finally:
        if not cfg.keep_data:
            shutil.rmtree(folder, ignore_errors=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out, "data_loading.csv"), index=False)
    print(f"\nLoading {cfg.gb} GB in {cfg.partitions} partitions on {cfg.workers} workers ({os.cpu_count()} CPU "
          "cores); worker figures are the largest over the workers:\n")
    print(markdown(table))
    record_run(out, cfg)
    return table


if __name__ == "__main__":
    main()
    sys.exit(0)
