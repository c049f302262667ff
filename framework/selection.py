"""`ModelSelection`: what a user calls. It validates the arguments, records the run, and wires the driver.

The work itself is done by the driver loop (`framework.driver`) over a `RayBackend` (`framework.engine`): workers
hold partitions, units hop between them, the procedure decides at every barrier (or at every epoch end when it
needs no barrier), and every decision is committed to the run directory (the point a resume restarts from).
Failures (Cerebro 5.6) are the driver's event handlers: a unit whose worker dies or hangs re-runs from the
config's last state, a failure in user code counts against its config only.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from automl import Procedure
from framework.callbacks import Callback, CallbackList, RunInfo, check_callbacks
from framework.data import PartitionedDataset, encode_entry
from framework.driver import Driver, DriverOptions, SQLiteRunLog
from framework.engine.catalog import SQLiteCatalog, check_verified, confine
from framework.engine.checkpoint import CheckpointStore, remove_partial
from framework.engine.faults import FaultPlan
from framework.engine.ray_backend import RayBackend, check_resources, ensure_ray
from framework.engine.rebuild import rebuild_checkpoints
from framework.engine.signing import loads_signed
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.scheduling import Scheduler, make_scheduler
from framework.storage import RunStorage, git_revision, run_name, unusable_dir
from framework.trainable import function_ref

EXECUTORS = ("mop", "task_parallel", "sequential")
MODES = ("min", "max")


def _extract_ref(extract: Callable | None) -> str | None:
    """What the run log records about `extract`: a function's `module:qualname`, or an object's class."""
    if extract is None:
        return None
    if hasattr(extract, "__qualname__"):
        return function_ref(extract)
    return function_ref(type(extract))


def _code_digest() -> str:
    """sha256 over this package's source files (framework, automl, simulators): names the code that ran even
    where no git revision is known."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for pkg in ("framework", "automl", "simulators"):
        for dirpath, dirs, files in sorted(os.walk(os.path.join(root, pkg))):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()


def _resolve_procedure(procedure: Any) -> Procedure:
    if isinstance(procedure, Procedure):
        return procedure
    if isinstance(procedure, str):
        from automl import load_procedure

        try:
            return load_procedure(procedure)
        except (TypeError, ValueError) as e:  # its words name `spec`: say which argument that was
            raise type(e)(f"`procedure` is {procedure!r}: {e}") from e
    raise TypeError(f"`procedure` is {procedure!r}, but must be an automl.Procedure (or a 'module:Class' string)")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: Ray's built-in resources; Ray's names are case-sensitive, so "cpu" would be an unknown custom resource
RAY_RESOURCES = ("CPU", "GPU")


def _check_resources(worker_resources: Any) -> dict[str, float]:
    """`worker_resources` as a dict (None or empty: one CPU), or the error that names what is wrong with it. Whether
    the cluster has a custom resource only Ray can tell (`check_resources`, once it started)."""
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


#: `checkpoint=` policies besides a number of seconds
CHECKPOINT_POLICIES = ("epoch", "unit", "off")


class ModelSelection:
    """Train many configs on a partitioned dataset with model hopper parallelism, and pick the best.

    Args:
        model_fn: `model_fn(config) -> (torch.nn.Module, torch.optim.Optimizer)`.
        train_fn: `train_fn(model, optimizer, data, config) -> dict` (one pass over the worker's partition `data`;
            may return `num_examples`, a positive int; a metric that is NaN or infinite fails the config).
        eval_fn: `eval_fn(model, data, config) -> dict`, called under `torch.no_grad()`.
        dataset: a `PartitionedDataset` (its `replicas` / `availability` say which workers hold which partition).
        procedure: an `automl.Procedure` (GridSearch, RandomSearch, HyperBand, ...), or a `"module:Class"` string.
        input_fn: `input_fn(entry) -> data`, run on the worker to load a partition (default: the entry itself).
        num_workers: worker actors (default: one per partition; the full-data `sequential` executor uses one).
        worker_resources: Ray resources per worker, e.g. `{"CPU": 1, "GPU": 0}`; a GPU worker puts models on its GPU.
        scheduler: a name from `framework.scheduling.SCHEDULERS` or a `Scheduler` instance. A named scheduler is
            re-seeded every round from (seed, round), so a resumed run dispatches as the original would.
        executor: `"mop"` (partitions stay, models hop), `"task_parallel"` (every worker holds all data and trains
            whole epochs of one config, the Ray Tune / Celery pattern) or `"sequential"` (one worker, all data).
        seed: run seed; every unit is seeded from (seed, config, epoch, partition).
        storage_path: where the run's directory goes: a local path, a URI that `pyarrow.fs` opens (`s3://...`,
            `gs://...`, `file:///...`; the run works in a local copy that is mirrored there, see
            `framework.storage`), or None: a new folder `<name>` under `$MODELHOPPER_STORAGE`, else
            `~/modelhopper_runs` (never the working directory, which `ray job submit` replaces).
        name: the run folder's name when `storage_path` is None (default: `<procedure>-<timestamp>`).
        metric, mode: what ranks configs (`valid_<name>` or `train_<name>`; `"min"` or `"max"`).
        progress: show a progress bar over units and a leaderboard line per round.
        unit_timeout_s: health check of a running unit: a unit running longer is declared hung, its worker is
            killed and restarted, and the unit re-runs. None: 20x the longest unit measured so far (at least 60 s),
            no limit before the first measurement.
        max_unit_retries: how often a unit whose user code raised is retried before its config is marked failed.
        max_worker_restarts: restarts per worker id after a crash or hang; beyond it, the partitions it held are
            re-loaded on live workers.
        freezing: turn on Egeria layer freezing: `train_fn` is then called with `freezing=controller` (a
            `framework.freezing.FreezingController` whose state travels with the config). Options: `modules`
            ("children", an int for size-based groups, or a regex), `cache` (activation cache on the worker) and
            any `FreezingController` keyword (`eval_interval`, `policy`, ...). Hops then leave frozen weights
            behind on workers that already hold them.
        extract: a picklable callable (e.g. a frozen `torch.nn.Module`; it is put in eval mode) that every worker
            applies once to the inputs of each partition it loads (train and valid), under `torch.no_grad()` in
            batches of 1024 rows: the partition's data `(x, y)` becomes `(extract(x), y)` for every config's units
            on that worker (Vista/Nautilus: frozen-prefix features materialized near the data). It returns a tensor
            or a dict of tensors, batch first. Time and bytes per worker go to the events
            (`features_materialized`). `framework.planner.transfer_on_engine` builds it, with the matching
            `model_fn`, from a family of models that share a frozen prefix; hops then carry only trainable state.
        max_workers: elastic scale-out: at every epoch barrier, while the cluster has free resources for another
            worker (new Ray nodes, or CPUs/GPUs freed by other jobs) and fewer than `max_workers` workers live, a
            worker is added; it loads the least-replicated partitions. None: the pool only grows by
            `add_workers()`.
        faults: a `framework.engine.faults.FaultPlan`: faults injected at exact points (a worker killed, a unit
            hung, a state object lost, the driver crashed after a given commit) and an observer of the run's
            events, so tests and chaos experiments reach each recovery path on purpose. A `crash_driver` fault
            SIGKILLs the process that calls `run()`.
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
        data_on_device: each worker moves the tensors of the partitions it loads to its device once (a GPU worker
            then trains without a host-to-device copy per batch; `train_fn`'s `.to(device)` becomes a no-op). Costs
            device memory: a partition's size per worker. No effect on CPU workers.
        callbacks: `framework.Callback` instances called as the run goes on (`on_run_start`, `on_unit_end`,
            `on_epoch_end`, `on_decision`, `on_run_end`), e.g. `framework.TensorBoardCallback()` or
            `framework.MLflowCallback()`.
    """

    def __init__(
        self,
        model_fn: Callable,
        train_fn: Callable,
        eval_fn: Callable,
        dataset: PartitionedDataset,
        procedure: Procedure | str,
        input_fn: Callable | None = None,
        num_workers: int | None = None,
        worker_resources: Mapping[str, float] | None = None,
        scheduler: str | Scheduler = "randomized",
        executor: str = "mop",
        seed: int = 0,
        storage_path: str | None = None,
        metric: str = "valid_loss",
        mode: str = "min",
        progress: bool = True,
        unit_timeout_s: float | None = None,
        max_unit_retries: int = 0,
        max_worker_restarts: int = 3,
        freezing: Mapping[str, Any] | None = None,
        extract: Callable | None = None,
        max_workers: int | None = None,
        faults: FaultPlan | None = None,
        deterministic: bool = False,
        queue_depth: int = 2,
        checkpoint: str | float = "epoch",
        data_on_device: bool = False,
        callbacks: list[Callback] | None = None,
        name: str | None = None,
    ) -> None:
        for arg, fn in (("model_fn", model_fn), ("train_fn", train_fn), ("eval_fn", eval_fn)):
            if not callable(fn):
                raise TypeError(f"`{arg}` is {fn!r}, but must be callable")
        if input_fn is not None and not callable(input_fn):
            raise TypeError(f"`input_fn` is {input_fn!r}, but must be callable or None")
        if extract is not None and not callable(extract):
            raise TypeError(f"`extract` is {extract!r}, but must be callable (e.g. a torch.nn.Module) or None")
        if not isinstance(dataset, PartitionedDataset):
            raise TypeError(f"`dataset` is a {type(dataset).__name__}, but must be a framework.PartitionedDataset")
        if not dataset.in_memory:  # file entries are stored in run.db for replay and resume: JSON must hold them
            for entry in (*dataset.train, *dataset.valid):
                encode_entry(entry)
        if executor not in EXECUTORS:
            raise ValueError(f"`executor` is {executor!r}, but must be one of {list(EXECUTORS)}")
        if mode not in MODES:
            raise ValueError(f"`mode` is {mode!r}, but must be one of {list(MODES)}")
        if not isinstance(metric, str) or not metric.startswith(("valid_", "train_")):
            raise ValueError(f"`metric` is {metric!r}, but must name a reported metric as 'valid_<name>' or 'train_<name>'")
        if not _is_int(seed):
            raise TypeError(f"`seed` is {seed!r}, but must be an int >= 0")
        if seed < 0:  # numpy's SeedSequence, which seeds every unit, takes no negative seed
            raise ValueError(f"`seed` is {seed!r}, but must be an int >= 0")
        if unit_timeout_s is not None and not (_is_number(unit_timeout_s) and 0 < unit_timeout_s < math.inf):
            raise ValueError(f"`unit_timeout_s` is {unit_timeout_s!r}, but must be a finite number > 0 or None")
        for arg, v in (("max_unit_retries", max_unit_retries), ("max_worker_restarts", max_worker_restarts)):
            if not _is_int(v) or v < 0:
                raise ValueError(f"`{arg}` is {v!r}, but must be an int >= 0")
        p = dataset.num_partitions
        if num_workers is None:
            num_workers = 1 if executor == "sequential" else p
        if not _is_int(num_workers) or num_workers < 1:
            raise ValueError(f"`num_workers` is {num_workers!r}, but must be an int >= 1")
        if executor == "mop" and num_workers > p:
            raise ValueError(
                f"`num_workers` is {num_workers}, but must be <= the number of partitions ({p}) for executor='mop'"
            )
        if executor == "sequential" and num_workers != 1:
            raise ValueError(f"`num_workers` is {num_workers}, but executor='sequential' uses exactly 1")
        resources = _check_resources(worker_resources)
        self.placement = dataset.placement(num_workers) if executor == "mop" else {0: list(range(num_workers))}
        self.model_fn, self.train_fn, self.eval_fn, self.input_fn = model_fn, train_fn, eval_fn, input_fn
        self.dataset = dataset
        self.procedure = _resolve_procedure(procedure)
        make_scheduler(scheduler, seed=seed)  # validates the name now, before any work
        self.scheduler_spec = scheduler
        self.scheduler_name = scheduler if isinstance(scheduler, str) else type(scheduler).__name__
        self.executor, self.seed, self.metric, self.mode = executor, seed, metric, mode
        self.num_workers, self.worker_resources, self.progress = num_workers, resources, progress
        self.unit_timeout_s, self.max_unit_retries, self.max_worker_restarts = (
            unit_timeout_s, max_unit_retries, max_worker_restarts)
        self.num_threads = max(1, int(resources.get("CPU", 1)))
        if max_workers is not None and (not _is_int(max_workers) or max_workers < num_workers):
            raise ValueError(f"`max_workers` is {max_workers!r}, but must be an int >= `num_workers` ({num_workers})")
        if max_workers is not None and executor == "sequential":
            raise ValueError("`max_workers` is set, but executor='sequential' uses exactly 1 worker")
        self.max_workers = max_workers
        if freezing is not None and not isinstance(freezing, Mapping):
            raise TypeError(f"`freezing` is {freezing!r}, but must be a dict of options or None")
        self.freezing = dict(freezing) if freezing is not None else None
        if faults is not None and not isinstance(faults, FaultPlan):
            raise TypeError(f"`faults` is {faults!r}, but must be a framework.engine.faults.FaultPlan or None")
        self.faults = faults if faults is not None else FaultPlan()
        self.extract = extract
        if not isinstance(deterministic, bool):
            raise TypeError(f"`deterministic` is {deterministic!r}, but must be True or False")
        self.deterministic = deterministic
        if not isinstance(queue_depth, int) or isinstance(queue_depth, bool) or queue_depth < 1:
            raise ValueError(f"`queue_depth` is {queue_depth!r}, but must be an int >= 1")
        if not (checkpoint in CHECKPOINT_POLICIES or (isinstance(checkpoint, (int, float))
                                                     and not isinstance(checkpoint, bool) and checkpoint > 0)):
            raise ValueError(f"`checkpoint` is {checkpoint!r}, but must be one of {list(CHECKPOINT_POLICIES)} or a "
                             "number of seconds > 0")
        self.queue_depth, self.checkpoint = queue_depth, checkpoint
        if not isinstance(data_on_device, bool):
            raise TypeError(f"`data_on_device` is {data_on_device!r}, but must be True or False")
        self.data_on_device = data_on_device
        self.callbacks = check_callbacks(callbacks)
        if name is not None and (not isinstance(name, str) or name in ("", ".", "..") or os.sep in name):
            raise ValueError(f"`name` is {name!r}, but must be a non-empty folder name without {os.sep!r}")
        self.storage = RunStorage(storage_path, name or run_name(type(self.procedure).__name__.lower()))
        self.storage_path = self.storage.local
        why = unusable_dir(self.storage_path)
        if why is not None:  # else `run` would fail only after Ray started
            raise ValueError(f"`storage_path` is {storage_path!r}, but the run's folder {self.storage_path!r} cannot be "
                             f"made: {why}")
        self._resuming = False
        if os.path.exists(os.path.join(self.storage_path, CATALOG_FILE)) or self.storage.remote_exists():
            raise FileExistsError(
                f"`storage_path` {self.storage.where!r} already holds a run; choose a new directory or use "
                "ModelSelection.resume()"
            )
        self._driver: Driver | None = None
        self._commands: list[tuple[str, dict[str, Any]]] = []  # given before `run` started the driver
        self._cache_dir: str | None = None  # the run's folder for activation caches (see `_backend`)

    # ---- public -------------------------------------------------------------------------------------------------
    @classmethod
    def resume(
        cls,
        storage_path: str,
        model_fn: Callable,
        train_fn: Callable,
        eval_fn: Callable,
        input_fn: Callable | None = None,
        procedure: Procedure | str | None = None,
        extract: Callable | None = None,
        trust_unverified: bool = False,
        **overrides: Any,
    ) -> ModelSelection:
        """A `ModelSelection` that continues the run in `storage_path` (after a driver crash) when `.run()` is called.

        Pass the same user functions. The procedure's state, the configs, their latest checkpoints and the schedule
        log come from the directory; `procedure` overrides the stored procedure state (it must pickle-verify). Units
        that were in flight at the crash, or whose checkpoint had not reached the disk, run again; the schedule log
        marks their lost attempts `lost`. A run made with `extract=` needs the same `extract` again. `overrides` may
        change `progress`, `unit_timeout_s`, `max_unit_retries`,
        `max_worker_restarts`, `scheduler`, `faults`, `queue_depth`, `checkpoint`, `callbacks`, and
        `worker_resources` (e.g. to resume a GPU run on CPU workers, or the other way round; default: the run's).
        Unless overridden, the run's own `unit_timeout_s`, `max_unit_retries` and `max_worker_restarts` apply.
        A URI `storage_path` is fetched into its local working copy first.

        The run's catalog must verify under this machine's key (a run made here, unedited); otherwise resume raises
        `UnverifiedRunError` naming what failed, unless `trust_unverified=True` (then it warns; rows that did not
        verify are never re-signed, and the procedure's pickled state still loads only if it verifies, so pass
        `procedure=`).
        """
        storage = RunStorage(storage_path, "resumed")
        if storage.uri is not None and not os.path.exists(os.path.join(storage.local, CATALOG_FILE)):
            storage.pull()  # another machine's run: its mirror (a local working copy is never older than it)
        path = storage.local
        if not os.path.exists(os.path.join(path, CATALOG_FILE)):
            raise FileNotFoundError(f"`storage_path` {storage_path!r} holds no {CATALOG_FILE}: nothing to resume")
        allowed = {"progress", "unit_timeout_s", "max_unit_retries", "max_worker_restarts", "scheduler", "faults",
                   "queue_depth", "checkpoint", "worker_resources", "callbacks"}
        unknown = set(overrides) - allowed
        if unknown:
            raise TypeError(f"unknown options {sorted(unknown)} for resume(); allowed: {sorted(allowed)}")
        catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE), readonly=True)
        try:
            check_verified(catalog, "resume", trust_unverified)
            meta = catalog.meta()
            _, blob, signature = catalog.last_round()
        finally:
            catalog.close()
        if meta.get("checkpoint") == "off":
            raise ValueError(f"the run in {storage_path!r} was made with checkpoint='off': it wrote no states to "
                             "resume from (only each config's final one)")
        if procedure is None:
            if blob is None:
                raise RuntimeError(f"the run in {storage_path!r} committed no round yet; pass `procedure=` to resume")
            procedure = loads_signed(blob, signature)
        if meta.get("extract") is not None and extract is None:
            raise ValueError(
                f"the run in {storage_path!r} used `extract` ({meta['extract']}), but `extract` is None; pass the same "
                "extract= to resume()"
            )
        if meta["scheduler"] not in _scheduler_names() and "scheduler" not in overrides:
            raise ValueError(
                f"the run in {storage_path!r} used the scheduler instance {meta['scheduler']!r}, which resume() cannot "
                "rebuild; pass `scheduler=` (the same instance or a name from framework.scheduling.SCHEDULERS)"
            )
        dataset = PartitionedDataset.load(confine(path, "data", "the data folder"), meta["dataset"])
        dataset.availability = {int(k): v for k, v in meta["placement"].items()} if meta["executor"] == "mop" else None
        options = {"scheduler": meta["scheduler"], "freezing": meta.get("freezing"),
                   "queue_depth": int(meta.get("queue_depth", 1)), "checkpoint": meta.get("checkpoint", "unit"),
                   "deterministic": bool(meta.get("deterministic", False)),
                   "worker_resources": meta["worker_resources"],
                   "data_on_device": bool(meta.get("data_on_device", False)),
                   # the run's failure handling, where it recorded it (runs from before keep the defaults)
                   **{k: meta[k] for k in ("unit_timeout_s", "max_unit_retries", "max_worker_restarts") if k in meta},
                   **overrides}
        self = cls(
            model_fn, train_fn, eval_fn, dataset, procedure, input_fn=input_fn, num_workers=meta["num_workers"],
            executor=meta["executor"], seed=meta["seed"],
            metric=meta["metric"], mode=meta["mode"], extract=extract, **options,
        )
        self.storage, self.storage_path, self._resuming = storage, path, True
        self._trust_unverified = trust_unverified
        self._partial_removed = 0
        return self

    def run(self) -> Result:
        """Run the selection to completion and return its `Result` (also written under `storage_path`). A resumed
        run that had already finished returns its result without starting Ray or any worker."""
        if self._resuming:
            if self._finished():
                print(f"Run {self.storage.where} had finished: nothing to resume", file=sys.stderr, flush=True)
                return Result(self.storage_path, self.model_fn)
            # checkpoint files a crashed driver or worker left half written are never part of the run
            self._partial_removed = remove_partial(os.path.join(self.storage_path, CHECKPOINT_DIR))
        ensure_ray(min_cpus=self.num_workers * self.worker_resources.get("CPU", 1))
        check_resources(self.worker_resources)  # a request no node can ever meet fails now, not after a hang
        os.makedirs(self.storage_path, exist_ok=True)
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE))
        ckpt = CheckpointStore(os.path.join(self.storage_path, CHECKPOINT_DIR), catalog)
        self._t0 = time.time()
        if self._resuming:
            # verified again by the writer that continues it: what changed since `resume()` checked is not trusted
            try:
                check_verified(catalog, "resume", self._trust_unverified)
            except BaseException:
                ckpt.close()
                catalog.close()
                raise
            catalog.add_event("resumed", pid=os.getpid(), partial_checkpoints_removed=self._partial_removed)
            self._rebuild_checkpoints(catalog)
        else:
            self._record_meta(catalog)
        backend = self._backend()
        options = DriverOptions(
            seed=self.seed, metric=self.metric, mode=self.mode, scheduler=self.scheduler_spec,
            unit_timeout_s=self.unit_timeout_s, max_unit_retries=self.max_unit_retries,
            max_worker_restarts=self.max_worker_restarts, max_workers=self.max_workers,
            worker_resources=self.worker_resources, deterministic=self.deterministic,
            storage_path=self.storage_path, queue_depth=self.queue_depth, checkpoint=self.checkpoint,
            check_metric=True)
        placement = {w: [p for p, ws in self.placement.items() if w in ws] for w in range(self.num_workers)}
        driver = Driver(backend, self.procedure, SQLiteRunLog(catalog, ckpt), placement, sorted(backend.entries),
                        options, self.faults)
        self._driver = driver
        for command, args in self._commands:
            backend.command(command, **args)
        run = driver.run_state
        if self.progress:
            print(f"Run directory: {self.storage.describe()}", file=sys.stderr, flush=True)
        interactive = sys.stderr.isatty()
        # in a job log (not a terminal) the bar is a status line every 30 s, not a line per refresh
        bar = tqdm(total=0, unit="unit", desc="model selection", disable=not self.progress, dynamic_ncols=True,
                   mininterval=0.1 if interactive else 30.0)
        run.bar, run.write = bar, tqdm.write
        planned = None if self._resuming else self.procedure.planned_epochs()
        if planned:  # a bar over the whole run's known work, not one that fills up and falls back every round
            bar.total = planned * len(driver.run_state.workers.partitions + driver.run_state.workers.eval_partitions)
            run.bar_planned = True
        run.on_unit = lambda: bar.update(1)
        t_round = [time.time()]

        def leaderboard() -> None:
            if self.progress:
                bar.write(driver.leaderboard_line(time.time() - t_round[0]))
            t_round[0] = time.time()

        run.leaderboard = leaderboard
        mirror = [_Mirror(self.storage)] if self.storage.uri is not None else []
        callbacks = CallbackList([*self.callbacks, *mirror], on_error=run.event)
        run.callbacks = callbacks
        try:
            driver.start_workers()
            info = run.workers.info
            catalog.add_event("workers_started", count=len(run.workers.holds))
            catalog.set_meta(data_bytes_per_worker=[info[w].get("data_bytes", 0) for w in sorted(info)])
            callbacks.call("on_run_start", RunInfo(self.storage_path, self.metric, self.mode, catalog.meta(),
                                                   self._resuming, os.path.basename(self.storage.where.rstrip("/"))))
            driver.run(resume_from=catalog if self._resuming else None)
        except BaseException:
            failed = True
            raise
        else:
            failed = False
        finally:
            if run.bar_planned and bar.n < bar.total:  # configs that failed or stopped early: their work is done
                bar.total = bar.n
                bar.refresh()
            bar.close()
            errors = ckpt.flush()
            ckpt.close()
            catalog.set_meta(end_time=time.time(), checkpoint_errors=errors, driver_cpu_s_per_unit={
                str(e): s / max(n, 1) for e, (s, n) in sorted(run.cpu_by_epoch.items())})
            catalog.close()
            backend.shutdown()
            if self._cache_dir is not None:
                shutil.rmtree(self._cache_dir, ignore_errors=True)
            if failed:  # what ran reaches the mirror, also when the run raised (and its error is the one raised)
                try:
                    self.storage.push(force=True)
                except Exception as e:  # noqa: BLE001
                    warnings.warn(f"could not mirror the run to {self.storage.uri}: {e}", stacklevel=2)
        result = Result(self.storage_path, self.model_fn)
        result.write()
        callbacks.call("on_run_end", result)
        self.storage.push(force=True)
        print(f"Results: {self.storage.describe()} ({len(result.configs)} configs, best {result.best_config_id}, "
              f"{self.metric}={_best_value(result)})", file=sys.stderr, flush=True)
        return result

    @property
    def rounds_completed(self) -> int:
        """Decisions committed so far (rounds, with a barrier); readable while `run` goes on."""
        return self._driver.rounds_completed if self._driver is not None else 0

    def live_workers(self) -> list[int]:
        """Ids of the live workers now (readable while `run` goes on)."""
        return self._driver.live_workers() if self._driver is not None else []

    def add_workers(self, count: int = 1, partitions: list[int] | None = None) -> None:
        """Scale out while the run goes on (thread-safe): start `count` workers; each loads `partitions` (default:
        the partitions with the fewest holders). They take units from the next dispatch on."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"`count` is {count!r}, but must be an int >= 1")
        self._command("add", count=count, partitions=partitions)

    def drain_worker(self, worker: int) -> None:
        """Scale in (thread-safe): `worker` gets no new units, finishes the one it runs, then leaves. Partitions it
        alone held are re-loaded on other workers."""
        self._command("drain", worker=worker)

    def kill_worker_process(self, worker: int | None = None) -> int | None:
        """Chaos testing (thread-safe): SIGKILL a live worker's process (a random one when None). Returns its id,
        or None when no worker lives."""
        live = self.live_workers()
        if not live:
            return None
        w = random.choice(live) if worker is None else worker
        self._command("kill", worker=w)
        return w

    def _command(self, command: str, **args: Any) -> None:
        if self._driver is None:
            self._commands.append((command, args))
        else:
            self._driver.run_state.backend.command(command, **args)

    # ---- resume -------------------------------------------------------------------------------------------------
    def _finished(self) -> bool:
        """Whether the run committed its last decision: no config is active after it (the procedure adds configs in
        the same commit that stops the others, so none active means it had nothing more to train)."""
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE), readonly=True)
        try:
            return catalog.last_round()[0] >= 0 and not (catalog.configs().status == "active").any()
        finally:
            catalog.close()

    # ---- set-up -------------------------------------------------------------------------------------------------
    def _record_meta(self, catalog: SQLiteCatalog) -> None:
        data_desc = self.dataset.save(os.path.join(self.storage_path, "data"))
        # the names replay imports (the catalog signs every meta row: a run directory cannot make replay call others)
        functions = {n: function_ref(f) for n, f in (("model_fn", self.model_fn), ("train_fn", self.train_fn),
                                                ("eval_fn", self.eval_fn), ("input_fn", self.input_fn))}
        catalog.set_meta(
            start_time=self._t0, seed=self.seed, executor=self.executor, scheduler=self.scheduler_name,
            num_workers=self.num_workers, worker_resources=self.worker_resources, num_threads=self.num_threads,
            metric=self.metric, mode=self.mode, placement={str(k): v for k, v in self.placement.items()},
            freezing=self.freezing, extract=_extract_ref(self.extract), deterministic=self.deterministic,
            queue_depth=self.queue_depth, checkpoint=self.checkpoint, data_on_device=self.data_on_device,
            unit_timeout_s=self.unit_timeout_s, max_unit_retries=self.max_unit_retries,
            max_worker_restarts=self.max_worker_restarts,
            synchronous=self.deterministic or getattr(self.procedure, "synchronous", True),
            procedure=type(self.procedure).__name__, dataset=data_desc, git_revision=git_revision(),
            code_digest=_code_digest(), storage_uri=self.storage.uri,
            functions=functions,
        )

    def _backend(self) -> RayBackend:
        """Workers as Ray actors; the full-data baselines see one "partition" 0 that is all the data. Activation
        caches (layer freezing with `cache=True`) go under a temporary folder of the run's own, `modelhopper-cache-*`,
        which `run` removes when it ends: the caches of workers that were killed (and could not remove theirs) too."""
        cache = isinstance(self.freezing, Mapping) and bool(self.freezing.get("cache"))
        self._cache_dir = tempfile.mkdtemp(prefix="modelhopper-cache-") if cache else None
        return RayBackend({**self._worker_fns(), "freezing": self.freezing, "cache_dir": self._cache_dir},
                          self.worker_resources, self.num_threads,
                          self.dataset.worker_entries(self.executor == "mop"), put_entries=self.dataset.in_memory,
                          queue_depth=self.queue_depth)

    def _worker_fns(self) -> dict[str, Any]:
        return {"model_fn": self.model_fn, "train_fn": self.train_fn, "eval_fn": self.eval_fn,
                "input_fn": self.input_fn, "extract": self.extract, "data_on_device": self.data_on_device}

    def _rebuild_checkpoints(self, catalog: SQLiteCatalog) -> None:
        """Before a resume starts its workers: damaged newest checkpoints are rebuilt from the log where the result
        matches the recorded checksum (`framework.engine.rebuild`), re-running at most one epoch's training units
        per config. Not with layer freezing, and not for a GPU run in a driver without CUDA (the checksum could not
        match)."""
        gpu = float(self.worker_resources.get("GPU", 0)) > 0
        if self.freezing is not None or (gpu and not torch.cuda.is_available()):
            return
        entries = self.dataset.worker_entries(self.executor == "mop")
        rebuild_checkpoints(catalog, self._worker_fns(), entries, seed=self.seed, num_threads=self.num_threads,
                            device="cuda" if gpu else "cpu", max_units=len(entries),
                            write=lambda line: print(line, file=sys.stderr, flush=True))


class _Mirror(Callback):
    """Mirrors a run with a URI `storage_path` after each committed decision (at most every `sync_every_s`)."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage

    def on_decision(self, round: int, decision: Any) -> None:
        self.storage.push()


def _best_value(result: Result) -> str:
    try:
        return f"{result.get_best_result().metrics.get(result.metric, float('nan')):.4g}"
    except LookupError:
        return "none"


def _scheduler_names() -> set[str]:
    from framework.scheduling import SCHEDULERS

    return set(SCHEDULERS)
