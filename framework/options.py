"""`RunOptions`: every option of a run, with one set of defaults, validated in one place.

`ModelSelection` builds one from its arguments, the driver loop acts on it (`RunState.options`), the simulators,
replay and offline runs build their own, and a run records it in its catalog (`to_meta`) so that
`ModelSelection.resume` reads it back (`from_meta`). Pure Python: no torch, no Ray.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from framework.stoppers import _finite, _show, make_stopper, stopper_from_spec, stopper_spec

EXECUTORS = ("mop", "task_parallel", "sequential")
MODES = ("min", "max")
#: `checkpoint=` policies besides a number of seconds
CHECKPOINT_POLICIES = ("epoch", "unit", "off")
#: Ray's built-in resources; Ray's names are case-sensitive, so "cpu" would be an unknown custom resource
RAY_RESOURCES = ("CPU", "GPU")

#: the options a run records in its catalog's meta (`to_meta`) and `from_meta` reads back
RECORDED = (
    "seed", "metric", "mode", "scheduler", "executor", "num_workers", "worker_resources", "unit_timeout_s",
    "max_unit_retries", "max_worker_restarts", "max_workers", "freezing", "deterministic", "queue_depth",
    "checkpoint", "data_on_device", "pack", "stop", "time_budget_s",
)
#: the recorded options a resumed run may change (`from_meta(meta, **overrides)`); the rest define the run
RESUMABLE = frozenset({
    "unit_timeout_s", "max_unit_retries", "max_worker_restarts", "scheduler", "queue_depth", "checkpoint",
    "worker_resources", "pack", "stop", "time_budget_s",
})
#: the `queue_depth` of simulations, offline runs and replays (not `RunOptions.queue_depth`, the engine's): Cerebro's
#: model, a worker gets its next unit only when it has finished the last, which the simulators' recorded schedules and
#: a replay's recorded order (one unit at a time on one worker) assume; a simulation of the engine's default passes
#: `queue_depth=RunOptions.queue_depth`
SERIAL_QUEUE_DEPTH = 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_resources(worker_resources: Any) -> dict[str, float]:
    """`worker_resources` as a dict (None or empty: one CPU), or the error that names what is wrong with it. Whether
    the cluster has a custom resource only Ray can tell (`framework.engine.ray_backend.check_resources`)."""
    if worker_resources is None:
        return {"CPU": 1}
    if not isinstance(worker_resources, Mapping):
        raise TypeError(f"`worker_resources` is {worker_resources!r}, but must be a dict of Ray resource names to "
                        "amounts per worker, e.g. {'CPU': 1, 'GPU': 0}")
    for k, v in worker_resources.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"`worker_resources` has the key {k!r}, but Ray resource names are non-empty strings")
        if k not in RAY_RESOURCES and k.upper() in RAY_RESOURCES:
            raise ValueError(f"`worker_resources` has the key {k!r}, but Ray resource names are case-sensitive: "
                             f"did you mean {k.upper()!r}?")
        if not (_is_number(v) and 0 <= v < math.inf):
            raise ValueError(f"`worker_resources[{k!r}]` is {v!r}, but must be a finite number >= 0")
    return dict(worker_resources) or {"CPU": 1}


@dataclass(frozen=True)
class RunOptions:
    """The options of one run: what `ModelSelection` takes besides its functions, data and procedure, and the
    driver's own knobs. Every field is validated at construction (`ValueError`/`TypeError` naming the option, its
    value and the rule); `replace` validates again.

    Attributes:
        seed: run seed; every unit is seeded from (seed, config, epoch, partition).
        metric, mode: what ranks configs (`valid_<name>` or `train_<name>`; `"min"` or `"max"`).
        scheduler: a name from `framework.scheduling.SCHEDULERS` or a `Scheduler` instance. A named scheduler is
            re-seeded every round from (seed, round), so a resumed run dispatches as the original would.
        executor: `"mop"` (partitions stay, models hop), `"task_parallel"` (every worker holds all data and trains
            whole epochs of one config, the Ray Tune / Celery pattern) or `"sequential"` (one worker, all data).
        num_workers: worker actors. None: one per partition (the `sequential` executor uses one; see
            `resolve_workers`); for a driver built directly, None is the placement's workers and 0 tells the
            procedure nothing (a simulation whose workers all join later).
        worker_resources: Ray resources per worker, e.g. `{"CPU": 1, "GPU": 0}`; a GPU worker puts models on its GPU.
        unit_timeout_s: health check of a running unit: a unit running longer is declared hung, its worker is
            killed and restarted, and the unit re-runs. None: 20x the longest unit measured so far (at least 60 s),
            no limit before the first measurement.
        max_unit_retries: how often a unit whose user code raised is retried before its config is marked failed.
        max_worker_restarts: restarts per worker id after a crash or hang; beyond it, the partitions it held are
            re-loaded on live workers.
        max_workers: elastic scale-out: at every epoch barrier, while the cluster has free resources for another
            worker (new Ray nodes, or CPUs/GPUs freed by other jobs) and fewer than `max_workers` workers live, a
            worker is added; it loads the least-replicated partitions. None: the pool only grows by
            `ModelSelection.add_workers()`.
        freezing: turn on Egeria layer freezing: `train_fn` is then called with `freezing=controller` (a
            `framework.freezing.FreezingController` whose state travels with the config). Options: `modules`
            ("children", an int for size-based groups, or a regex), `cache` (activation cache on the worker) and
            any `FreezingController` keyword (`eval_interval`, `policy`, ...). Hops then leave frozen weights
            behind on workers that already hold them.
        deterministic: reproducible by seed: every config visits its partitions in an order fixed by `seed`
            (`framework.scheduling.SeededOrderScheduler`, which then replaces `scheduler`) and every procedure
            keeps the epoch barrier, so two runs with one seed report the same metrics. It costs throughput: a
            config waits for the holder of its next partition. Procedures driven by a wall clock (a time budget)
            stay timing-dependent.
        queue_depth: units a worker holds at once: the one it runs and the next ones, queued behind it, so it starts
            the next without waiting for the driver and fetches the next config's state while the current unit
            runs. A queued config is reserved (it runs nowhere else meanwhile). 1: a worker gets its next unit only
            when it has finished the last one (Cerebro's model).
        checkpoint: when config states are written to disk (by the worker that holds them, off the driver):
            `"epoch"` (the state at each epoch end; after a driver crash, resume re-runs the units of each
            config's unfinished epoch), `"unit"` (after every training unit; resume re-runs only units in flight),
            a number N (each epoch end, and within an epoch whenever N seconds passed since the config's last
            checkpoint), or `"off"` (only each config's final state, when it stops; the run cannot be resumed).
        data_on_device: where a GPU worker keeps the partitions it loads. None (default): on its GPU when they fit
            in a quarter of the memory of its share of the GPU (`framework.engine.worker.DEVICE_DATA_SHARE`), else
            in host memory with each batch copied over as it is used; True: on the GPU; False: in host memory. On
            the GPU, batches need no host-to-device copy (a `train_fn`'s `.to(device)` is a no-op). No effect on
            CPU workers.
        pack: configs a worker trains at once as one fused model (`framework.engine.packs`): 1 (default) one at a
            time; k (2-16) packs of up to k configs of one architecture and batch size; `"auto"` sized per
            architecture by measuring the run's own units (`framework.scheduling.packing`). Needs a `step_fn`.
        stop: when a config, or the run, stops early (Ray Tune's `stop`): a `framework.stoppers.Stopper`, a dict of
            thresholds (`{"epochs": 10, "valid_acc": 0.98}`), a function `fn(config_id, result) -> bool` or a list of
            these; held as one `Stopper` (`framework.stoppers.make_stopper`), None: none. A config a stopper stops
            ends with the outcome "stopped" and its reason logged (a `config_stopped` event).
        time_budget_s: the run's time budget: seconds of its driver loop (on the backend's clock), summed over the
            sessions of the run that ran under a budget (a `TimeoutStopper` in `stop` sets one too; the smaller
            counts). When it is spent nothing new starts, the units in flight finish, every config's latest state is
            written, and the run ends, not finished (`time_budget_spent` event): resume it with a larger budget
            (`framework.driver.stopping`). None: no budget.
        storage_path: the run's local directory, handed to the procedure's `bind` (`ModelSelection` sets it).
        holder_wait_s: how long units of a partition nobody holds wait for a worker before the run stops.
        barrier: keep the epoch barrier (None: as the procedure's `synchronous` says).
        reassign_partitions: re-load the partitions of a worker out of restarts onto live workers.
        check_metric: the first report of the metric's kind must hold the metric, or the run stops at once
            (`ModelSelection` checks; simulations and replays do not).
    """

    seed: int = 0
    metric: str = "valid_loss"
    mode: str = "min"
    scheduler: Any = "randomized"  # a name from framework.scheduling.SCHEDULERS or a Scheduler instance
    executor: str = "mop"
    num_workers: int | None = None
    worker_resources: Mapping[str, float] = field(default_factory=lambda: {"CPU": 1})
    unit_timeout_s: float | None = None
    max_unit_retries: int = 0
    max_worker_restarts: int = 3
    max_workers: int | None = None
    freezing: Mapping[str, Any] | None = None
    deterministic: bool = False
    queue_depth: int = 2
    checkpoint: str | float = "epoch"
    data_on_device: bool | None = None
    pack: int | str = 1
    stop: Any = None  # a framework.stoppers.Stopper once validated
    time_budget_s: float | None = None
    # the driver's own knobs (not recorded: a run directory, or what a simulation or replay needs)
    storage_path: str | None = None
    holder_wait_s: float = 300.0
    barrier: bool | None = None
    reassign_partitions: bool = True
    check_metric: bool = False

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"`executor` is {self.executor!r}, but must be one of {list(EXECUTORS)}")
        if self.mode not in MODES:
            raise ValueError(f"`mode` is {self.mode!r}, but must be one of {list(MODES)}")
        if not isinstance(self.metric, str) or not self.metric.startswith(("valid_", "train_")):
            raise ValueError(f"`metric` is {self.metric!r}, but must name a reported metric as 'valid_<name>' or "
                             "'train_<name>'")
        if not _is_int(self.seed):
            raise TypeError(f"`seed` is {self.seed!r}, but must be an int >= 0")
        if self.seed < 0:  # numpy's SeedSequence, which seeds every unit, takes no negative seed
            raise ValueError(f"`seed` is {self.seed!r}, but must be an int >= 0")
        t = self.unit_timeout_s
        if t is not None and not (_is_number(t) and 0 < t and _finite(t) is not None):  # (10**400: no float)
            raise ValueError(f"`unit_timeout_s` is {_show(t)}, but must be a finite number > 0 or None")
        for arg in ("max_unit_retries", "max_worker_restarts"):
            v = getattr(self, arg)
            if not _is_int(v) or v < 0:
                raise ValueError(f"`{arg}` is {v!r}, but must be an int >= 0")
        n = self.num_workers
        if n is not None and (not _is_int(n) or n < 0):
            raise ValueError(f"`num_workers` is {n!r}, but must be an int >= 1 (or None; 0: a driver whose "
                             "procedure gets no concurrency hint)")
        if self.executor == "sequential" and n is not None and n != 1:
            raise ValueError(f"`num_workers` is {n}, but executor='sequential' uses exactly 1")
        object.__setattr__(self, "worker_resources", check_resources(self.worker_resources))
        from framework.scheduling import make_scheduler

        make_scheduler(self.scheduler, seed=self.seed)  # raises for an unknown name, listing the known ones
        m = self.max_workers
        if m is not None and (not _is_int(m) or m < (n or 1)):
            rule = f"an int >= `num_workers` ({n})" if n else "an int >= 1 or None"
            raise ValueError(f"`max_workers` is {m!r}, but must be {rule}")
        if m is not None and self.executor == "sequential":
            raise ValueError("`max_workers` is set, but executor='sequential' uses exactly 1 worker")
        if self.freezing is not None:
            if not isinstance(self.freezing, Mapping):
                raise TypeError(f"`freezing` is {self.freezing!r}, but must be a dict of options or None")
            object.__setattr__(self, "freezing", dict(self.freezing))
        for arg in ("deterministic", "reassign_partitions", "check_metric"):
            if not isinstance(getattr(self, arg), bool):
                raise TypeError(f"`{arg}` is {getattr(self, arg)!r}, but must be True or False")
        if self.data_on_device is not None and not isinstance(self.data_on_device, bool):
            raise TypeError(f"`data_on_device` is {self.data_on_device!r}, but must be None (on a GPU when it fits), "
                            "True or False")
        if self.barrier is not None and not isinstance(self.barrier, bool):
            raise TypeError(f"`barrier` is {self.barrier!r}, but must be True, False or None")
        if not _is_int(self.queue_depth) or self.queue_depth < 1:
            raise ValueError(f"`queue_depth` is {self.queue_depth!r}, but must be an int >= 1")
        from framework.scheduling.packing import check_pack

        check_pack(self.pack)
        if self.pack != 1 and self.freezing is not None:
            raise ValueError(f"`pack` is {self.pack!r} and `freezing` is set: a pack cannot freeze its members' "
                             "layers apart yet; use pack=1 with freezing, or no freezing")
        c = self.checkpoint
        if not (c in CHECKPOINT_POLICIES or (_is_number(c) and c > 0 and _finite(c) is not None)):
            raise ValueError(f"`checkpoint` is {_show(c)}, but must be one of {list(CHECKPOINT_POLICIES)} or a "
                             "number of seconds > 0")
        object.__setattr__(self, "stop", make_stopper(self.stop, self.metric, self.mode))
        b = self.time_budget_s
        if b is not None and not (_is_number(b) and 0 < b and _finite(b) is not None):  # (10**400: no float)
            raise ValueError(f"`time_budget_s` is {_show(b)}, but must be a finite number of seconds > 0 or None")
        if not (_is_number(self.holder_wait_s) and self.holder_wait_s > 0):
            raise ValueError(f"`holder_wait_s` is {self.holder_wait_s!r}, but must be a number of seconds > 0")
        if self.storage_path is not None and not isinstance(self.storage_path, (str, os.PathLike)):
            raise TypeError(f"`storage_path` is {self.storage_path!r}, but must be a local path or None")

    def replace(self, **changes: Any) -> RunOptions:
        """A copy with `changes`, validated again."""
        return dataclasses.replace(self, **changes)

    def resolve_workers(self, num_partitions: int) -> RunOptions:
        """A copy whose `num_workers` is set for a dataset of `num_partitions` (None: one per partition; one for
        `executor="sequential"`), checked against it: a `mop` worker holds at least one partition."""
        n = self.num_workers
        if n is None:
            n = 1 if self.executor == "sequential" else num_partitions
        if not _is_int(n) or n < 1:
            raise ValueError(f"`num_workers` is {n!r}, but must be an int >= 1")
        if self.executor == "mop" and n > num_partitions:
            raise ValueError(f"`num_workers` is {n}, but must be <= the number of partitions ({num_partitions}) "
                             "for executor='mop'")
        return self.replace(num_workers=n)

    def for_live_run(self) -> RunOptions:
        """These options, checked for a run on live workers: a policy that forms data-parallel gangs is refused
        with `freezing` (a gang's members would freeze layers apart)."""
        from framework.scheduling import GANG_POLICIES

        gangs = self.scheduler in GANG_POLICIES if isinstance(self.scheduler, str) \
            else getattr(self.scheduler, "name", None) in GANG_POLICIES
        if gangs and self.freezing is not None:
            raise ValueError(f"`scheduler` is {self.scheduler!r}, which forms data-parallel gangs, and `freezing` is "
                             f"set: a gang's workers cannot freeze layers together yet; use a hop policy such as "
                             "'randomized' with freezing, or no freezing")
        return self

    @property
    def scheduler_name(self) -> str:
        """The scheduler's name, or its class name when it is an instance (what the catalog records)."""
        return self.scheduler if isinstance(self.scheduler, str) else type(self.scheduler).__name__

    @property
    def num_threads(self) -> int:
        """Torch threads per worker: its CPUs (at least one)."""
        return max(1, int(self.worker_resources.get("CPU", 1)))

    def to_meta(self) -> dict[str, Any]:
        """The recorded options as the catalog stores them (JSON-able; the scheduler as its name)."""
        meta = {k: getattr(self, k) for k in RECORDED}
        meta.update(scheduler=self.scheduler_name, worker_resources=dict(self.worker_resources),
                    freezing=dict(self.freezing) if self.freezing is not None else None, stop=stopper_spec(self.stop))
        return meta

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], **overrides: Any) -> RunOptions:
        """The options a run recorded (`to_meta`; other meta keys are ignored), changed by `overrides` (only the
        `RESUMABLE` ones) and validated. An option the run did not record (a run from before it existed) takes
        `RunOptions`' default, e.g. `queue_depth=2` and `checkpoint="epoch"`."""
        unknown = set(overrides) - RESUMABLE
        if unknown:
            raise TypeError(f"unknown options {sorted(unknown)} for resume(); allowed: {sorted(RESUMABLE)}")
        recorded = {k: meta[k] for k in RECORDED if k in meta}
        if "scheduler" not in overrides and "scheduler" in recorded:
            from framework.scheduling import SCHEDULERS

            if recorded["scheduler"] not in SCHEDULERS:
                raise ValueError(f"the run used the scheduler instance {recorded['scheduler']!r}, which resume() "
                                 "cannot rebuild; pass `scheduler=` (the same instance or a name from "
                                 "framework.scheduling.SCHEDULERS)")
        if "stop" not in overrides and recorded.get("stop") is not None:
            recorded["stop"] = stopper_from_spec(recorded["stop"])
        return cls(**{**recorded, **overrides})
