"""Workloads: unit times T (configs x workers) plus an availability map (partition -> workers that hold it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from framework.scheduling import TRAIN, Unit

#: Cerebro (VLDB 2020) appendix B, Table 7: the 35 CNN compute costs (MFLOPs, as printed: values >= 1 GFLOP are
#: rounded to whole GFLOPs there, so their mean is 5901, not the 5939 quoted in section 5.4).
CNN_MFLOPS: dict[str, float] = {
    "AlexNet": 727, "CaffeNet": 724, "SqueezeNet1-0": 837, "SqueezeNet1-1": 360, "VGG-f": 727, "VGG-m": 2000,
    "VGG-s": 3000, "VGG-m-2048": 2000, "VGG-m-1024": 2000, "VGG-m-128": 2000, "VGG-vd-16-atrous": 16000,
    "VGG-vd-16": 16000, "VGG-vd-19": 20000, "GoogleNet": 2000, "ResNet18": 2000, "ResNet34": 4000, "ResNet50": 4000,
    "ResNet101": 8000, "ResNet152": 11000, "ResNext-50-32x4d": 4000, "ResNext-101-32x4d": 8000,
    "ResNext-101-64x4d": 16000, "Inception-V3": 6000, "SE-ResNet-50": 4000, "SE-ResNet-101": 8000,
    "SE-ResNet-152": 11000, "SE-ResNeXt-50-32x4d": 4000, "SE-ResNeXt-101-32x4d": 8000, "SENet": 21000,
    "SE-BN-Inception": 2000, "DenseNet121": 3000, "DenseNet161": 8000, "DenseNet169": 3000, "DenseNet201": 4000,
    "MobileNet": 579,
}  # fmt: skip

#: Cerebro section 5.4: worker compute capacities (TFLOPS)
GPU_TFLOPS: dict[str, float] = {"Titan Xp": 12.1, "K80": 5.6, "GTX 1080": 11.3, "P100": 18.7}


@dataclass(frozen=True)
class Workload:
    """`times[i, w]`: seconds of one unit of config i on worker w (any partition); `availability[q]`: holders of q.

    Attributes:
        times: `(|S|, n_workers)` array of positive unit times.
        availability: partition -> tuple of workers that hold it (replicas: several).
        eval_partitions: validation partitions (ids after the training ones) each config evaluates on per epoch.
        eval_fraction: an eval unit takes this fraction of a training unit's time.
        name: free-form label.
    """

    times: np.ndarray
    availability: Mapping[int, tuple[int, ...]]
    eval_partitions: tuple[int, ...] = ()
    eval_fraction: float = 0.25
    name: str = ""
    meta: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = np.asarray(self.times, dtype=float)
        if t.ndim != 2 or t.size == 0:
            raise ValueError(f"`times` has shape {t.shape}, but must be a non-empty (configs, workers) matrix")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise ValueError("`times` must be finite and > 0")
        object.__setattr__(self, "times", t)
        av = {int(q): tuple(sorted(int(w) for w in ws)) for q, ws in self.availability.items()}
        for q, ws in av.items():
            if not ws:
                raise ValueError(f"`availability[{q}]` is empty, but every partition needs a holder")
            bad = [w for w in ws if not 0 <= w < t.shape[1]]
            if bad:
                raise ValueError(f"`availability[{q}]` has workers {bad}, but workers are 0..{t.shape[1] - 1}")
        for q in self.eval_partitions:
            if q not in av:
                raise ValueError(f"eval partition {q} has no entry in `availability`")
        object.__setattr__(self, "availability", av)

    @property
    def n_configs(self) -> int:
        """Configs in the workload (`|S|`, the rows of `times`)."""
        return self.times.shape[0]

    @property
    def n_workers(self) -> int:
        """Workers in the workload (the columns of `times`)."""
        return self.times.shape[1]

    @property
    def train_partitions(self) -> list[int]:
        """The partitions in `availability` that are not `eval_partitions`, sorted."""
        return sorted(q for q in self.availability if q not in set(self.eval_partitions))

    def units(self, epoch: int = 0, configs: list[int] | None = None) -> list[Unit]:
        """The units of one epoch: a train unit per config x train partition, then an eval unit per config x eval
        partition.

        Args:
            epoch: the epoch the units belong to.
            configs: the config ids to make units for; None for all of them (`0 .. n_configs - 1`).
        """
        cs = range(self.n_configs) if configs is None else configs
        out = [Unit(c, epoch, q, TRAIN) for c in cs for q in self.train_partitions]
        out += [Unit(c, epoch, q, "eval") for c in cs for q in self.eval_partitions]
        return out

    def duration(self, unit: Unit, worker: int) -> float:
        """Seconds `unit` takes on `worker`: `times[config, worker]`, times `eval_fraction` for an eval unit."""
        t = float(self.times[unit.config_id, worker])
        return t if unit.kind == TRAIN else t * self.eval_fraction

    @property
    def replicated(self) -> bool:
        """Whether some partition is held by more than one worker."""
        return any(len(ws) > 1 for ws in self.availability.values())


def _one_per_worker(p: int) -> dict[int, tuple[int, ...]]:
    return {q: (q,) for q in range(p)}


def homogeneous(n_configs: int, n_workers: int, unit_time: float = 1.0) -> Workload:
    """Cerebro's homogeneous setting: identical configs and workers; partition q on worker q."""
    _check_sizes(n_configs, n_workers)
    return Workload(np.full((n_configs, n_workers), float(unit_time)), _one_per_worker(n_workers), name="homogeneous")


def heterogeneous(n_configs: int, n_workers: int, seed: int = 0, scale: float = 1.0) -> Workload:
    """Cerebro's heterogeneous setting: config costs drawn from Table 7, worker GPUs from four models (with
    replacement); unit time = `scale` * cost (GFLOPs) / capacity (TFLOPS)."""
    _check_sizes(n_configs, n_workers)
    rng = np.random.default_rng(seed)
    names = list(CNN_MFLOPS)
    gpus = list(GPU_TFLOPS)
    cfg = rng.choice(len(names), size=n_configs)
    gpu = rng.choice(len(gpus), size=n_workers)
    cost = np.array([CNN_MFLOPS[names[i]] for i in cfg]) / 1000.0
    cap = np.array([GPU_TFLOPS[gpus[j]] for j in gpu])
    return Workload(
        scale * np.outer(cost, 1.0 / cap),
        _one_per_worker(n_workers),
        name="heterogeneous",
        meta={"configs": [names[i] for i in cfg], "gpus": [gpus[j] for j in gpu], "seed": seed},
    )


def replicate(workload: Workload, factor: int, seed: int = 0) -> Workload:
    """Each training partition q on worker q plus `factor - 1` other workers drawn at random (HDFS-style replicas)."""
    if not 1 <= factor <= workload.n_workers:
        raise ValueError(f"`factor` is {factor}, but must be in [1, {workload.n_workers}]")
    rng = np.random.default_rng(seed)
    av = dict(workload.availability)
    for q in workload.train_partitions:
        home = av[q][0]
        others = [w for w in range(workload.n_workers) if w != home]
        extra = rng.choice(others, size=factor - 1, replace=False).tolist() if factor > 1 else []
        av[q] = tuple(sorted({home, *extra}))
    return Workload(workload.times, av, workload.eval_partitions, workload.eval_fraction, workload.name + f"-r{factor}",
                    workload.meta)  # fmt: skip


def from_schedule_log(log, name: str = "live") -> Workload:
    """A workload from a live run's schedule log (DataFrame or CSV path with config_id, epoch, partition, worker,
    kind, start, end): T[config, worker] = mean measured train-unit time; missing pairs get the config's mean scaled
    by the worker's mean speed ratio; availability = the workers seen on each partition."""
    import pandas as pd

    df = pd.read_csv(log) if not isinstance(log, pd.DataFrame) else log
    need = {"config_id", "epoch", "partition", "worker", "kind", "start", "end"}
    if need - set(df.columns):
        raise ValueError(f"schedule log lacks columns {sorted(need - set(df.columns))}")
    tr = df[df["kind"] == TRAIN].assign(d=lambda x: x["end"] - x["start"])
    configs = sorted(tr["config_id"].unique())
    workers = sorted(set(df["worker"].unique()))
    cidx = {c: i for i, c in enumerate(configs)}
    widx = {w: j for j, w in enumerate(workers)}
    m = tr.groupby(["config_id", "worker"])["d"].mean()
    times = np.full((len(configs), len(workers)), np.nan)
    for (c, w), v in m.items():
        times[cidx[c], widx[w]] = max(float(v), 1e-9)
    row = np.nanmean(times, axis=1, keepdims=True)
    speed = np.nanmean(times / row, axis=0, keepdims=True)
    times = np.where(np.isnan(times), row * np.where(np.isnan(speed), 1.0, speed), times)
    parts = sorted(df["partition"].unique())
    pidx = {q: k for k, q in enumerate(parts)}
    av: dict[int, set[int]] = {}
    for q, w in df[["partition", "worker"]].drop_duplicates().itertuples(index=False):
        av.setdefault(pidx[q], set()).add(widx[w])
    ev = sorted({pidx[q] for q in df.loc[df["kind"] != TRAIN, "partition"]} - {pidx[q] for q in tr["partition"]})
    return Workload(times, {q: tuple(ws) for q, ws in av.items()}, tuple(ev), name=name,
                    meta={"config_ids": configs, "workers": workers, "partitions": parts})  # fmt: skip


def _check_sizes(n_configs: int, n_workers: int) -> None:
    if n_configs < 1:
        raise ValueError(f"`n_configs` is {n_configs}, but must be >= 1")
    if n_workers < 1:
        raise ValueError(f"`n_workers` is {n_workers}, but must be >= 1")
