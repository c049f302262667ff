"""`ModelSelection`: what a user calls. It validates the arguments, records the run, and wires the driver.

The work is the driver loop's (`framework.driver`) over a `RayBackend` (`framework.engine`): workers hold partitions,
units hop between them, the procedure decides at every barrier (or epoch end without one), and every decision is
committed to the run directory (where a resume restarts). Failures (Cerebro 5.6) are the driver's handlers. The run's
options are `framework.options.RunOptions`; what a run records and resume reads is `framework.run_record`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from automl import Procedure
from framework import run_record
from framework.arguments import (
    check_callbacks,
    check_dataset,
    check_faults,
    check_user_code,
    new_run_storage,
    resolve_procedure,
)
from framework.callbacks import Callback, RunInfo
from framework.data import PartitionedDataset
from framework.driver import Driver, SQLiteRunLog, stopping
from framework.driver.commands import QueueCommands, Sources
from framework.driver.observers import ProgressBar, RunClock, StorageMirror, print_summary
from framework.engine.faults import FaultPlan
from framework.engine.ray_backend import RayBackend, check_resources, ensure_ray
from framework.functions import UserFunctions
from framework.options import EXECUTORS, RECORDED, RunOptions
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.scheduling import Scheduler
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore, remove_partial
from framework.store.lock import writer_lock

__all__ = ["EXECUTORS", "ModelSelection"]

_D = RunOptions()  # the options' defaults are RunOptions' (`worker_resources=None` is its default, one CPU)
#: what `ModelSelection` reads through from its `options` (`sel.queue_depth` is `sel.options.queue_depth`)
_OPTION_ATTRIBUTES = frozenset(f.name for f in dataclasses.fields(RunOptions)) | {"scheduler_name", "num_threads"}
_FUNCTION_ATTRIBUTES = frozenset(f.name for f in dataclasses.fields(UserFunctions))


class ModelSelection:
    """Train many configs on a partitioned dataset with model hopper parallelism, and pick the best.

    Training is a `step_fn` (recommended: the engine runs the loop, `framework.engine.steps`) or a `train_fn`.

    Args:
        model_fn: `model_fn(config) -> (torch.nn.Module, torch.optim.Optimizer)` or a `framework.Trainable`.
        train_fn: `train_fn(model, optimizer, data, config) -> dict`: one pass of your own over the partition `data`
            (may return `num_examples`; a NaN or infinite metric fails the config). None with a `step_fn`.
        eval_fn: `eval_fn(model, data, config) -> dict` under `torch.no_grad()`; None: `eval_step` or `step_fn`.
        dataset: a `PartitionedDataset` (its `replicas`/`availability`: which workers hold which partition).
        procedure: an `automl.Procedure` (GridSearch, RandomSearch, HyperBand, ...), a registered name ("grid",
            "hyperband", ...) or a `"module:Class"` string, constructed with `procedure_args` (a dict of keywords).
        input_fn: `input_fn(entry) -> data`, run on the worker to load a partition (default: the entry itself).
        storage_path: the run's directory: a local path, a `pyarrow.fs` URI (`s3://...`: a local copy mirrored there,
            `framework.store.storage`), or None: a new folder `<name>` under `$MODELHOPPER_STORAGE`, else
            `~/modelhopper_runs` (never the working directory, which `ray job submit` replaces).
        name: the run folder's name when `storage_path` is None (default: `<procedure>-<timestamp>`).
        progress: show a progress bar over units and a leaderboard line per round.
        extract: a picklable callable (e.g. a frozen `torch.nn.Module` in eval mode) each worker applies once to the
            inputs of each partition it loads, under `torch.no_grad()`: `(x, y)` becomes `(extract(x), y)` (features
            near the data, Vista/Nautilus; `framework.planner.transfer_on_engine` builds it).
        faults: a `framework.engine.faults.FaultPlan`: faults injected at exact points, and an observer of events.
        callbacks: `framework.Callback`s called as the run goes on (e.g. `framework.TensorBoardCallback()`);
            `dashboard=True` (or `framework.dashboard.serve`'s keywords) serves the run's page, its URL on stderr.
        step_fn: `step_fn(model, batch, config) -> loss | (loss, metrics) | {"loss": ...}` on `batch_size` rows.
        eval_step: `eval_step(model, batch, config) -> dict` of a batch's means (batches of `eval_batch_size`).

    The other arguments are the run's options: `framework.RunOptions` documents each one, holds their defaults and
    validates them (`self.options` is the validated record, `num_workers` resolved). In short:

        num_workers: worker actors (default: one per partition; the full-data `sequential` executor uses one).
        worker_resources: Ray resources per worker (default `{"CPU": 1}`); a GPU worker puts models on its GPU.
        scheduler: which waiting unit an idle worker trains next (`framework.scheduling.SCHEDULERS`, a Scheduler).
        executor: `"mop"` (partitions stay, models hop), `"task_parallel"` or `"sequential"` (the baselines).
        seed: run seed; every unit is seeded from (seed, config, epoch, partition).
        metric, mode: what ranks configs (`valid_<name>` or `train_<name>`; `"min"` or `"max"`).
        unit_timeout_s: seconds after which a running unit is declared hung (its worker is restarted).
        max_unit_retries, max_worker_restarts: retries of a unit whose user code raised; restarts of a worker id.
        freezing: Egeria layer freezing (through the step loop, or `train_fn(..., freezing=controller)`), or None.
        max_workers: elastic scale-out: grow into free cluster resources up to this many workers.
        deterministic: reproducible by seed (a seeded visit order and the epoch barrier), at some throughput.
        queue_depth: units a worker holds at once (default 2; 1 is Cerebro's model).
        checkpoint: when config states reach the disk: `"epoch"` (default), `"unit"`, every N seconds, or `"off"`.
        data_on_device: where a GPU worker keeps its partitions (None: on the GPU when they fit).
        pack: configs of one architecture a worker trains at once as one fused model (1, k <= 16, or "auto").
        stop, time_budget_s: stoppers as Ray Tune's (`framework.stoppers`); the run's seconds (resumable with more).
    """

    def __init__(
        self, model_fn: Callable, train_fn: Callable | None = None, eval_fn: Callable | None = None,
        dataset: PartitionedDataset | None = None, procedure: Procedure | str | None = None, input_fn: Callable | None = None, num_workers: int | None = _D.num_workers,
        worker_resources: Mapping[str, float] | None = None, scheduler: str | Scheduler = _D.scheduler,
        executor: str = _D.executor, seed: int = _D.seed, storage_path: str | None = None, stop: Any = _D.stop,
        metric: str = _D.metric, mode: str = _D.mode, progress: bool = True,
        unit_timeout_s: float | None = _D.unit_timeout_s, max_unit_retries: int = _D.max_unit_retries,
        max_worker_restarts: int = _D.max_worker_restarts, freezing: Mapping[str, Any] | None = _D.freezing,
        extract: Callable | None = None, max_workers: int | None = _D.max_workers, faults: FaultPlan | None = None,
        deterministic: bool = _D.deterministic, queue_depth: int = _D.queue_depth,
        checkpoint: str | float = _D.checkpoint, data_on_device: bool | None = _D.data_on_device,
        callbacks: list[Callback] | None = None, name: str | None = None,
        procedure_args: Mapping[str, Any] | None = None, dashboard: bool | Mapping[str, Any] = False,
        step_fn: Callable | None = None, eval_step: Callable | None = None, pack: int | str = _D.pack,
        time_budget_s: float | None = _D.time_budget_s,
    ) -> None:
        functions = check_user_code(model_fn, train_fn, eval_fn, input_fn, extract, step_fn, eval_step, pack)
        check_dataset(dataset)
        options = RunOptions(
            seed=seed, metric=metric, mode=mode, scheduler=scheduler, executor=executor, num_workers=num_workers,
            worker_resources=worker_resources, unit_timeout_s=unit_timeout_s, max_unit_retries=max_unit_retries,
            max_worker_restarts=max_worker_restarts, max_workers=max_workers, freezing=freezing,
            deterministic=deterministic, queue_depth=queue_depth, checkpoint=checkpoint,
            data_on_device=data_on_device, pack=pack, check_metric=True, stop=stop, time_budget_s=time_budget_s,
        ).resolve_workers(dataset.num_partitions).for_live_run()
        n = options.num_workers
        self.placement = dataset.placement(n) if executor == "mop" else {0: list(range(n))}
        self.functions = functions
        self.dataset, self.progress = dataset, progress
        self.procedure = resolve_procedure(procedure, procedure_args)
        self.faults, self.callbacks = check_faults(faults), check_callbacks(callbacks, dashboard)
        self.storage = new_run_storage(storage_path, name, self.procedure)
        self.options: RunOptions = options.replace(storage_path=self.storage.local)
        self._driver: Driver | None = None
        self._resuming, self._commands, self._cache_dir = False, QueueCommands(), None  # (commands: the loop's)

    def __getattr__(self, name: str) -> Any:
        """The run's options and functions read as attributes: `sel.queue_depth` is `sel.options.queue_depth`,
        `sel.step_fn` is `sel.functions.step_fn`."""
        if name in _OPTION_ATTRIBUTES and "options" in self.__dict__:
            return getattr(self.options, name)
        if name in _FUNCTION_ATTRIBUTES and "functions" in self.__dict__:
            return getattr(self.functions, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- public -------------------------------------------------------------------------------------------------
    @classmethod
    def resume(
        cls, storage_path: str, model_fn: Callable, train_fn: Callable | None = None, eval_fn: Callable | None = None,
        input_fn: Callable | None = None, procedure: Procedure | str | None = None, extract: Callable | None = None,
        trust_unverified: bool = False, *, progress: bool = True, faults: FaultPlan | None = None,
        callbacks: list[Callback] | None = None, step_fn: Callable | None = None, eval_step: Callable | None = None,
        accept_changed_data: bool = False, **overrides: Any,
    ) -> ModelSelection:
        """A `ModelSelection` that continues the run in `storage_path` (after a driver crash) when `.run()` is called.

        Pass the same user functions (`step_fn`/`eval_step` as keywords). The procedure's state, the configs, their
        checkpoints and the schedule log come from the directory; `procedure` overrides the stored procedure state
        (it must pickle-verify). Units in flight at the crash, or not yet checkpointed, run again (logged `lost`).
        `extract=` must be the run's. `overrides` may change `framework.options.RESUMABLE` options (e.g.
        `worker_resources`); the others are the run's own. A URI `storage_path` is fetched first. The catalog must
        verify under this machine's key (else `UnverifiedRunError`) unless `trust_unverified=True` (it warns; nothing
        unverified is re-signed or unpickled); a data file that differs from what the run read is refused naming
        it, unless `accept_changed_data=True` (then recorded)."""
        run = run_record.load_run(storage_path, procedure, extract, trust_unverified, overrides)
        stopping.check_budget_left(run.storage.local, run.options.time_budget_s, run.options.stop)  # before any work
        self = cls(model_fn, train_fn, eval_fn, run.dataset, run.procedure, input_fn=input_fn, extract=extract,
                   progress=progress, faults=faults, callbacks=callbacks, step_fn=step_fn, eval_step=eval_step,
                   **{k: getattr(run.options, k) for k in RECORDED})
        self.storage, self._resuming, self._trust_unverified = run.storage, True, trust_unverified
        self.options, self._partial_removed = self.options.replace(storage_path=run.storage.local), 0
        self._accept_changed_data = accept_changed_data
        return self

    def run(self) -> Result:
        """Run the selection to completion and return its `Result` (also written under `storage_path`); a finished
        run's resume returns it at once. Holds the run's `writer_lock`: resuming a run being written is an error."""
        with contextlib.ExitStack() as lock:
            return self._run(lock, RunClock())

    def _run(self, lock: contextlib.ExitStack, clock: RunClock) -> Result:
        options = self.options
        if self._resuming:
            lock.enter_context(writer_lock(self.storage_path))  # first: a second resume is refused
            if run_record.is_finished(self.storage_path):
                print(f"Run {self.storage.where} had finished: nothing to resume", file=sys.stderr, flush=True)
                return Result(self.storage_path, self.model_fn)
            # checkpoint files a crashed driver or worker left half written are never part of the run
            self._partial_removed = remove_partial(os.path.join(self.storage_path, CHECKPOINT_DIR))
        ensure_ray(min_cpus=options.num_workers * options.worker_resources.get("CPU", 1))
        check_resources(options.worker_resources)  # a request no node can ever meet fails now, not after a hang
        clock.lap("ray")
        os.makedirs(self.storage_path, exist_ok=True)
        if not self._resuming:
            lock.enter_context(writer_lock(self.storage_path))
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE))
        ckpt = CheckpointStore(os.path.join(self.storage_path, CHECKPOINT_DIR), catalog)
        self._t0 = time.time()
        if self._resuming:
            run_record.reopen_run(catalog, ckpt, options, self.functions, self._entries(),
                       trust_unverified=self._trust_unverified, partial_removed=self._partial_removed)
        else:
            run_record.record_run(catalog, options, placement=self.placement, procedure=self.procedure,
                                  dataset=self.dataset, functions=self.functions, storage_uri=self.storage.uri,
                                  start_time=self._t0)
        backend = self._backend()
        placement = {w: [p for p, ws in self.placement.items() if w in ws] for w in range(options.num_workers)}
        planned = None if self._resuming else self.procedure.planned_epochs()
        bar = ProgressBar(self.progress, planned and planned * 2 * len(backend.entries),
                          lambda s: self._driver.leaderboard_line(s), f"Run directory: {self.storage.describe()}")
        mirror = [StorageMirror(self.storage)] if self.storage.uri is not None else []
        commands = Sources(self._commands, run_record.inbox_commands(catalog, self.storage_path))  # ours, others'
        driver = Driver(backend, self.procedure, SQLiteRunLog(catalog, ckpt), placement, sorted(backend.entries),
                        options, self.faults, commands=commands, observers=[bar, *self.callbacks, *mirror, clock],
                        pack_key=self.functions.pack_key(), pack_epochs=self.functions.mixes_epochs())
        self._driver, run = driver, driver.run_state
        if self._resuming:  # the data must be what the run read
            run_record.expect_recorded_data(run, catalog, backend.entries, self._accept_changed_data)
        clock.lap("set_up")
        failed = True  # until `driver.run` returns
        try:
            driver.start_workers()
            info = run.workers.info
            catalog.add_event("workers_started", count=len(run.workers.holds))
            catalog.set_meta(data_bytes_per_worker=[info[w].get("data_bytes", 0) for w in sorted(info)])
            run.observers.call("on_run_start", RunInfo(self.storage_path, options.metric, options.mode, catalog.meta(),
                                                   self._resuming, os.path.basename(self.storage.where.rstrip("/"))))
            driver.run(resume_from=catalog if self._resuming else None)
            failed = False
        finally:
            bar.close()
            errors = ckpt.flush()
            ckpt.close()
            cpu = {str(e): s / max(n, 1) for e, (s, n) in sorted(run.cpu_by_epoch.items())}
            catalog.set_meta(end_time=time.time(), checkpoint_errors=errors, **stopping.failed_meta(run),
                             driver_cpu_s_per_unit=cpu)
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
        run.observers.call("on_run_end", result)
        self.storage.push(force=True)
        print_summary(self.storage, result, options.metric)
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
        self._commands.put("add_workers", count=count, partitions=partitions)

    def drain_worker(self, worker: int) -> None:
        """Scale in (thread-safe): `worker` gets no new units, finishes the one it runs, then leaves. Partitions it
        alone held are re-loaded on other workers."""
        self._commands.put("drain_worker", worker=worker)

    def kill_worker_process(self, worker: int | None = None) -> int | None:
        """Chaos testing (thread-safe): SIGKILL a live worker's process (a random one when None). Returns its id,
        or None when no worker lives."""
        if not (live := self.live_workers()):
            return None
        w = random.choice(live) if worker is None else worker
        self._commands.put("kill_worker", worker=w)
        return w

    # ---- set-up -------------------------------------------------------------------------------------------------
    def _backend(self) -> RayBackend:
        """Workers as Ray actors (the full-data baselines see one "partition" 0: all the data). Activation caches
        (freezing with `cache=True`) go under the run's own `modelhopper-cache-*` folder, which `run` removes."""
        freezing = self.options.freezing
        cache = isinstance(freezing, Mapping) and bool(freezing.get("cache"))
        self._cache_dir = tempfile.mkdtemp(prefix="modelhopper-cache-") if cache else None
        return RayBackend(self.functions, self.options.worker_resources, self.options.num_threads, self._entries(),
                          put_entries=self.dataset.in_memory, queue_depth=self.options.queue_depth,
                          worker_options={"freezing": freezing, "cache_dir": self._cache_dir,
                                          "data_on_device": self.options.data_on_device})

    def _entries(self) -> dict[int, tuple[list, list]]:
        return self.dataset.worker_entries(self.options.executor == "mop")
