"""`ModelSelection`: the driver. It owns the run loop; policies, procedures and user code plug into it.

Per round (epoch barrier): every active config gets one training unit per partition and then one eval unit per
validation partition; a `Scheduler` dispatches them to idle workers through a `DispatchState` (the MOP invariants);
completions arrive through `ray.wait` (event-driven); the catalog logs every unit; the checkpoint writer saves the
latest state of each config off the critical path; after the round the procedure decides, and the round's results,
the decision and the procedure's state are committed in one SQLite transaction (the point a resume restarts from).

Failures (Cerebro 5.6): a unit whose worker dies or hangs goes back to the queue and re-runs from the config's last
state; the worker is restarted (or its partitions re-loaded elsewhere). A failure in user code counts against the
config only.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import queue
import random
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from tqdm.auto import tqdm

from automl import ACTIVE, FAILED, STOPPED, ConfigState, Decision, Procedure
from framework.data import PartitionedDataset
from framework.engine.catalog import SQLiteCatalog
from framework.engine.checkpoint import CheckpointStore, CorruptCheckpointError
from framework.engine.faults import DRIVER_ACTIONS, FaultPlan
from framework.engine.pool import WorkerPool
from framework.engine.ray_backend import ensure_ray, materialize
from framework.engine.recovery import resume_units, should_retry, units_to_redo
from framework.engine.signing import dumps_signed, loads_signed
from framework.engine.worker import UnitReport, UnitTask, epoch_metrics, unit_seed
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.scheduling import EVAL, TRAIN, Assignment, DispatchState, Scheduler, Unit, make_scheduler

EXECUTORS = ("mop", "task_parallel", "sequential")
MODES = ("min", "max")
_LOST_OBJECT_ERRORS = (ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError)


@dataclass
class _Config:
    id: int
    config: dict[str, Any]
    parent: int | None = None
    status: str = ACTIVE
    history: list[dict[str, float]] = field(default_factory=list)
    state_ref: Any = None  # ObjectRef of the latest state (None before the first unit)
    units: int = 0  # training units absorbed so far (all epochs)
    visited: dict[int, list[int]] = field(default_factory=dict)  # epoch -> partitions absorbed (driver's mirror)
    failures: int = 0  # failures of user code so far

    def view(self) -> ConfigState:
        return ConfigState(self.id, dict(self.config), len(self.history), tuple(self.history), self.status, self.parent)


@dataclass
class _InFlight:
    assignment: Assignment
    state_ref: Any
    started: float
    faults: tuple[str, ...] = ()  # injected driver-side faults (framework.engine.faults.DRIVER_ACTIONS)


def _fn_ref(fn: Callable | None) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


def _extract_ref(extract: Callable | None) -> str | None:
    """What the run log records about `extract`: a function's `module:qualname`, or an object's class."""
    if extract is None:
        return None
    if hasattr(extract, "__qualname__"):
        return _fn_ref(extract)
    return _fn_ref(type(extract))


def _git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _resolve_procedure(procedure: Any) -> Procedure:
    if isinstance(procedure, Procedure):
        return procedure
    if isinstance(procedure, str):
        from automl import load_procedure

        return load_procedure(procedure)
    raise TypeError(f"`procedure` is {procedure!r}, but must be an automl.Procedure (or a 'module:Class' string)")


class ModelSelection:
    """Train many configs on a partitioned dataset with model hopper parallelism, and pick the best.

    Args:
        model_fn: `model_fn(config) -> (torch.nn.Module, torch.optim.Optimizer)`.
        train_fn: `train_fn(model, optimizer, data, config) -> dict` (one pass over the worker's partition `data`;
            may return `num_examples`; a `*loss*` metric that is NaN fails the config).
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
        storage_path: the run's directory (default: a new folder under `./runs/`).
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
    ) -> None:
        for name, fn in (("model_fn", model_fn), ("train_fn", train_fn), ("eval_fn", eval_fn)):
            if not callable(fn):
                raise TypeError(f"`{name}` is {fn!r}, but must be callable")
        if input_fn is not None and not callable(input_fn):
            raise TypeError(f"`input_fn` is {input_fn!r}, but must be callable or None")
        if extract is not None and not callable(extract):
            raise TypeError(f"`extract` is {extract!r}, but must be callable (e.g. a torch.nn.Module) or None")
        if not isinstance(dataset, PartitionedDataset):
            raise TypeError(f"`dataset` is a {type(dataset).__name__}, but must be a framework.PartitionedDataset")
        if executor not in EXECUTORS:
            raise ValueError(f"`executor` is {executor!r}, but must be one of {list(EXECUTORS)}")
        if mode not in MODES:
            raise ValueError(f"`mode` is {mode!r}, but must be one of {list(MODES)}")
        if not isinstance(metric, str) or not metric.startswith(("valid_", "train_")):
            raise ValueError(f"`metric` is {metric!r}, but must name a reported metric as 'valid_<name>' or 'train_<name>'")
        if not isinstance(seed, int):
            raise TypeError(f"`seed` is {seed!r}, but must be an int")
        if unit_timeout_s is not None and not (isinstance(unit_timeout_s, (int, float)) and unit_timeout_s > 0):
            raise ValueError(f"`unit_timeout_s` is {unit_timeout_s!r}, but must be a number > 0 or None")
        for name, v in (("max_unit_retries", max_unit_retries), ("max_worker_restarts", max_worker_restarts)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"`{name}` is {v!r}, but must be an int >= 0")
        p = dataset.num_partitions
        if num_workers is None:
            num_workers = 1 if executor == "sequential" else p
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"`num_workers` is {num_workers!r}, but must be an int >= 1")
        if executor == "mop" and num_workers > p:
            raise ValueError(
                f"`num_workers` is {num_workers}, but must be <= the number of partitions ({p}) for executor='mop'"
            )
        if executor == "sequential" and num_workers != 1:
            raise ValueError(f"`num_workers` is {num_workers}, but executor='sequential' uses exactly 1")
        resources = dict(worker_resources or {"CPU": 1})
        for k, v in resources.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"`worker_resources[{k!r}]` is {v!r}, but must be a number >= 0")
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
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < num_workers):
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
        if storage_path is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            storage_path = os.path.join("runs", f"run-{stamp}")
        self.storage_path = os.path.abspath(storage_path)
        self._resuming = False
        if os.path.exists(os.path.join(self.storage_path, CATALOG_FILE)):
            raise FileExistsError(
                f"`storage_path` {self.storage_path!r} already holds a run; choose a new directory or use "
                "ModelSelection.resume()"
            )
        self._control: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.pool: WorkerPool | None = None
        self._live_workers: int | None = None  # what the procedure was last told
        self.rounds_completed = 0  # rounds (epoch barriers) committed so far; readable while `run` goes on

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
        **overrides: Any,
    ) -> ModelSelection:
        """A `ModelSelection` that continues the run in `storage_path` (after a driver crash) when `.run()` is called.

        Pass the same user functions. The procedure's state, the configs, their latest checkpoints and the schedule
        log come from the directory; `procedure` overrides the stored procedure state (it must pickle-verify). Units
        that were in flight at the crash, or whose checkpoint had not reached the disk, run again; the schedule log
        marks their lost attempts `lost`. A run made with `extract=` needs the same `extract` again. `overrides` may
        change `progress`, `unit_timeout_s`, `max_unit_retries`,
        `max_worker_restarts`, `scheduler`, `faults`.
        """
        path = os.path.abspath(storage_path)
        if not os.path.exists(os.path.join(path, CATALOG_FILE)):
            raise FileNotFoundError(f"`storage_path` {storage_path!r} holds no {CATALOG_FILE}: nothing to resume")
        allowed = {"progress", "unit_timeout_s", "max_unit_retries", "max_worker_restarts", "scheduler", "faults"}
        unknown = set(overrides) - allowed
        if unknown:
            raise TypeError(f"unknown options {sorted(unknown)} for resume(); allowed: {sorted(allowed)}")
        catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE))
        try:
            meta = catalog.meta()
            _, blob, signature = catalog.last_round()
        finally:
            catalog.close()
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
        dataset = PartitionedDataset.load(os.path.join(path, "data"), meta["dataset"])
        dataset.availability = {int(k): v for k, v in meta["placement"].items()} if meta["executor"] == "mop" else None
        options = {"scheduler": meta["scheduler"], "freezing": meta.get("freezing"), **overrides}
        self = cls(
            model_fn, train_fn, eval_fn, dataset, procedure, input_fn=input_fn, num_workers=meta["num_workers"],
            worker_resources=meta["worker_resources"], executor=meta["executor"], seed=meta["seed"],
            metric=meta["metric"], mode=meta["mode"], extract=extract, **options,
        )
        self.storage_path, self._resuming = path, True
        return self

    def run(self) -> Result:
        """Run the selection to completion and return its `Result` (also written under `storage_path`)."""
        os.makedirs(self.storage_path, exist_ok=True)
        ensure_ray(min_cpus=self.num_workers * self.worker_resources.get("CPU", 1))
        self._catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE))
        self._ckpt = CheckpointStore(os.path.join(self.storage_path, CHECKPOINT_DIR), self._catalog)
        self._t0 = time.time()
        if self._resuming:
            self._event("resumed", pid=os.getpid())
        else:
            self._record_meta()
        try:
            self._start_pool()
            self._loop()
        finally:
            errors = self._ckpt.flush()
            self._ckpt.close()
            self._catalog.set_meta(end_time=time.time(), checkpoint_errors=errors)
            self._catalog.close()
            if self.pool is not None:
                self.pool.shutdown()
        result = Result(self.storage_path, self.model_fn)
        result.write()
        return result

    def add_workers(self, count: int = 1, partitions: list[int] | None = None) -> None:
        """Scale out while the run goes on (thread-safe): start `count` workers; each loads `partitions` (default:
        the partitions with the fewest holders). They take units from the next dispatch on."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"`count` is {count!r}, but must be an int >= 1")
        self._control.put(("add", (count, partitions)))

    def drain_worker(self, worker: int) -> None:
        """Scale in (thread-safe): `worker` gets no new units, finishes the one it runs, then leaves. Partitions it
        alone held are re-loaded on other workers."""
        self._control.put(("drain", worker))

    def kill_worker_process(self, worker: int | None = None) -> int | None:
        """Chaos testing: SIGKILL a live worker's process (a random one when None). Returns its id."""
        try:
            live = sorted(self.pool.holds) if self.pool else []
        except RuntimeError:  # the run loop changed the pool meanwhile
            return None
        if not live:
            return None
        w = random.choice(live) if worker is None else worker
        try:
            self.pool.kill_process(w)
        except (ray.exceptions.RayActorError, KeyError, ProcessLookupError):
            return None
        return w

    # ---- set-up -------------------------------------------------------------------------------------------------
    def _record_meta(self) -> None:
        data_desc = self.dataset.save(os.path.join(self.storage_path, "data"))
        self._catalog.set_meta(
            start_time=self._t0, seed=self.seed, executor=self.executor, scheduler=self.scheduler_name,
            num_workers=self.num_workers, worker_resources=self.worker_resources, num_threads=self.num_threads,
            metric=self.metric, mode=self.mode, placement={str(k): v for k, v in self.placement.items()},
            freezing=self.freezing, extract=_extract_ref(self.extract),
            procedure=type(self.procedure).__name__, dataset=data_desc, git_revision=_git_revision(),
            functions={n: _fn_ref(f) for n, f in (("model_fn", self.model_fn), ("train_fn", self.train_fn),
                                                  ("eval_fn", self.eval_fn), ("input_fn", self.input_fn))},
        )

    def _start_pool(self) -> None:
        ds = self.dataset
        put = (lambda e: ray.put(e)) if ds.in_memory else (lambda e: e)
        train = [put(e) for e in ds.train]
        valid = [put(e) for e in ds.valid]
        if self.executor == "mop":
            entries = {p: ([train[p]], [valid[p]]) for p in range(ds.num_partitions)}
        else:  # full-data baselines: the one "partition" 0 is all the data, on every worker
            entries = {0: (train, valid)}
        fns = {"model_fn": self.model_fn, "train_fn": self.train_fn, "eval_fn": self.eval_fn, "input_fn": self.input_fn,
               "freezing": self.freezing, "extract": self.extract}
        self.pool = WorkerPool(fns, self.worker_resources, self.num_threads, entries)
        for w in range(self.num_workers):
            self._start_worker(w, [p for p, ws in self.placement.items() if w in ws])
        while self.pool.joining:  # the first round waits for every worker to hold its data
            [ref], _ = ray.wait(list(self.pool.joining), num_returns=1)
            self._join(ref, None)
        if not self.pool.holds:
            raise RuntimeError("no worker could be started; see the run's events for the errors")
        self.data_bytes_per_worker = []
        for actor in list(self.pool.actors.values()):
            try:
                self.data_bytes_per_worker.append(ray.get(actor.data_nbytes.remote()))
            except ray.exceptions.RayActorError:  # died right after loading: the run loop will see it
                pass
        self._event("workers_started", count=len(self.pool.holds))
        self._catalog.set_meta(data_bytes_per_worker=self.data_bytes_per_worker)

    # ---- the run loop -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        bind_params = inspect.signature(self.procedure.bind).parameters
        extra = {"num_workers": self.num_workers} if "num_workers" in bind_params else {}
        self.procedure.bind(self.metric, self.mode, self.storage_path, **extra)
        self._live_workers = self.num_workers
        self._count_workers()  # fewer may have started
        self._configs: dict[int, _Config] = {}
        self._durations: dict[tuple[int, str, int], float] = {}
        self._round_reports: dict[int, list[UnitReport]] = defaultdict(list)
        if self._resuming:
            round_, units = self._restore()
            self.rounds_completed = round_
        else:
            self._commit(-1, [], self.procedure.step([]))
            round_, units = 0, None
        bar = tqdm(total=0, unit="unit", desc="model selection", disable=not self.progress, dynamic_ncols=True)
        try:
            while True:
                active = [c for c in self._configs.values() if c.status == ACTIVE]
                if not active:
                    break
                if units is None:
                    units = [Unit(c.id, len(c.history), p, kind) for c in active for kind in (TRAIN, EVAL)
                             for p in sorted(self.pool.entries)]
                bar.total += len(units)
                bar.refresh()
                t_round = time.time()
                self._run_round(round_, units, bar)
                ended = self._close_round(round_, active)
                bar.write(self._leaderboard_line(round_, time.time() - t_round))
                self._commit(round_, ended, self.procedure.step(
                    [c.view() for c in sorted(self._configs.values(), key=lambda c: c.id)]))
                round_, units = round_ + 1, None
                self.rounds_completed = round_
                self._round_reports = defaultdict(list)
                self._grow_into_free_resources()
        finally:
            bar.close()

    def _scheduler_for(self, round_: int) -> Scheduler:
        if isinstance(self.scheduler_spec, Scheduler):
            return self.scheduler_spec
        return make_scheduler(self.scheduler_spec, seed=unit_seed(self.seed, round_, 7))

    def _run_round(self, round_: int, units: list[Unit], bar: tqdm) -> None:
        state = DispatchState(units, self.pool.availability(), estimate=self._estimate)
        scheduler = self._scheduler_for(round_)
        scheduler.start_round(state)
        self._in_flight: dict[Any, _InFlight] = {}
        self._deferred: list[Callable[[], None]] = []
        while not state.finished:
            self._handle_control(state)
            for a in scheduler.select(state):
                state.start(a)
                self._submit(a)
            self._run_deferred()  # log and checkpoint the last completion only once its successor is on its way
            waitable = list(self._in_flight) + list(self.pool.joining)
            if not waitable:
                self._wait_for_holders(state)
                continue
            ready, _ = ray.wait(waitable, num_returns=1, timeout=self._wait_timeout())
            if not ready:
                self._check_hung(state)
                continue
            ref = ready[0]
            if ref in self.pool.joining:
                self._join(ref, state)
                continue
            flight = self._in_flight.pop(ref)
            try:
                report: UnitReport = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._worker_lost(flight.assignment.worker, state, f"died ({type(e).__name__})")
                continue
            except _LOST_OBJECT_ERRORS as e:
                self._state_lost(flight.assignment, state, e)
                continue
            if self._handle(round_, flight, report, state):
                bar.update(1)
        self._run_deferred()

    def _run_deferred(self) -> None:
        for fn in self._deferred:
            fn()
        self._deferred.clear()

    def _submit(self, a: Assignment) -> None:
        c = self._configs[a.unit.config_id]
        injected = self.faults.on_dispatch(a.unit, a.worker)
        for action in injected:
            self._event("fault_injected", action=action, unit=str(a.unit), worker=a.worker)
        worker_fault = next((f for f in injected if f not in DRIVER_ACTIONS), None)
        task = UnitTask(a.unit, c.config, self.seed, fault=worker_fault)
        state_ref, report_ref = self.pool.actors[a.worker].run.options(num_returns=2).remote(task, c.state_ref)
        driver_faults = tuple(f for f in injected if f in DRIVER_ACTIONS)
        self._in_flight[report_ref] = _InFlight(a, state_ref, time.time(), driver_faults)

    def _start_worker(self, worker: int, partitions: Any) -> None:
        """Start (or restart) a worker and have it load `partitions`; it joins when `ray.wait` sees the load end."""
        injected = self.faults.on_load(worker)
        for action in injected:
            self._event("fault_injected", action=action, worker=worker)
        self.pool.start(worker, partitions, fault=injected[0] if injected else None)

    def _event(self, kind: str, **detail: Any) -> None:
        """Log an event (the run's record of what happened) and show it to the fault plan's observer."""
        self._catalog.add_event(kind, **detail)
        self.faults.observe(kind, detail)

    def _crash(self) -> None:
        """An injected driver crash: every queued checkpoint reaches the disk, then the process dies unannounced."""
        self._ckpt.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def _handle(self, round_: int, flight: _InFlight, report: UnitReport, state: DispatchState) -> bool:
        """Apply a finished unit; returns False when the unit must run again."""
        unit, c = flight.assignment.unit, self._configs[flight.assignment.unit.config_id]
        self._finish_drain(flight.assignment.worker)
        if report.error is not None:
            self._catalog.add_unit(round_, report, status="failed")
            c.failures += 1
            if should_retry(c.failures, self.max_unit_retries):
                state.requeue(unit)
                self._event("unit_retry", config_id=c.id, unit=str(unit), attempt=c.failures)
                return False
            state.complete(unit)
            state.drop_config(c.id)
            c.status = FAILED
            self._catalog.update_config(c.id, status=FAILED, error=report.error)
            self._event("config_failed", config_id=c.id, unit=str(unit))
            tqdm.write(f"config {c.id} failed in {unit.kind} unit (epoch {unit.epoch}, partition {unit.partition}):\n"
                       + report.error.strip().splitlines()[-1])
            return True
        state.complete(unit)
        self._durations[(c.id, unit.kind, flight.assignment.worker)] = report.end - report.start
        self._round_reports[c.id].append(report)
        if unit.kind == TRAIN:
            c.state_ref, c.units = flight.state_ref, c.units + 1
            c.visited.setdefault(unit.epoch, []).append(unit.partition)

        def record(units=c.units, ref=flight.state_ref) -> None:
            # the log row first, then the checkpoint: a checkpoint never holds a unit the log does not know
            self._catalog.add_unit(round_, report, status="done")
            if "crash_driver" in flight.faults:
                self._crash()
            if unit.kind == TRAIN and "skip_checkpoint" not in flight.faults:
                self._ckpt.submit(c.id, unit.epoch, units, lambda: materialize(ray.get(ref)))

        self._deferred.append(record)
        return True

    # ---- failures, elasticity -----------------------------------------------------------------------------------
    def _wait_timeout(self) -> float:
        """ray.wait's timeout: until the earliest unit deadline, and at most 1 s so control requests are seen."""
        limit = self._unit_limit()
        if limit is None or not self._in_flight:
            return 1.0
        earliest = min(f.started for f in self._in_flight.values()) + limit
        return max(0.01, min(1.0, earliest - time.time()))

    def _unit_limit(self) -> float | None:
        if self.unit_timeout_s is not None:
            return self.unit_timeout_s
        if not self._durations:
            return None
        return max(60.0, 20 * max(self._durations.values()))

    def _check_hung(self, state: DispatchState) -> None:
        limit = self._unit_limit()
        if limit is None:
            return
        now = time.time()
        for f in list(self._in_flight.values()):
            if now - f.started > limit:
                self._worker_lost(f.assignment.worker, state, f"hung: {f.assignment.unit} ran over {limit:.1f}s")

    def _worker_lost(self, worker: int, state: DispatchState, why: str) -> None:
        """Requeue what the worker ran (Q' -> Q), then restart it or re-load its partitions elsewhere."""
        for ref, f in list(self._in_flight.items()):
            if f.assignment.worker == worker:
                del self._in_flight[ref]
        lost = state.remove_worker(worker)
        held = self.pool.remove(worker)
        self._event("worker_failed", worker=worker, why=why, requeued=[str(u) for u in lost])
        self._count_workers()
        tqdm.write(f"worker {worker} {why}; re-queued {len(lost)} unit(s)")
        self._restart_or_reassign(worker, held)

    def _restart_or_reassign(self, worker: int, partitions: set[int]) -> None:
        restarts = self.pool.restarts.get(worker, 0)
        if restarts < self.max_worker_restarts:
            self.pool.restarts[worker] = restarts + 1
            self._start_worker(worker, partitions)
            self._event("worker_restarting", worker=worker, partitions=sorted(partitions),
                                    attempt=restarts + 1)
        else:
            self._ensure_holders()

    def _ensure_holders(self) -> None:
        """Re-load every partition that no live or incoming worker holds onto the least-loaded live worker."""
        av, incoming = self.pool.availability(), self.pool.incoming()
        live = [w for w in self.pool.holds if w not in self.pool.draining]
        for p, ws in av.items():
            if ws or p in incoming:
                continue
            if not live:
                self._event("waiting_for_holder", partition=p)
                tqdm.write(f"partition {p} has no live worker: waiting for a worker that holds it")
                continue
            target = min(live, key=lambda w: len(self.pool.holds[w]))
            self._start_worker(target, [p])
            self._event("partition_reload", partition=p, worker=target)
            tqdm.write(f"partition {p} lost its last holder: re-loading it on worker {target}")

    def _join(self, ref: Any, state: DispatchState | None) -> None:
        worker, parts = self.pool.joining[ref]
        try:
            self.pool.joined(ref)
        except ray.exceptions.RayActorError as e:
            self.pool.remove(worker)
            self._event("worker_start_failed", worker=worker, error=repr(e))
            self._restart_or_reassign(worker, parts)
            return
        if self.extract is not None:
            try:
                stats = ray.get(self.pool.actors[worker].extraction_stats.remote())
                self._event("features_materialized", worker=worker, **stats)
            except ray.exceptions.RayActorError:  # died right after loading: the run loop will see it
                pass
        if state is not None:
            state.add_worker(worker, parts)
        self._event("worker_joined", worker=worker, partitions=sorted(parts))
        self._count_workers()

    def _count_workers(self) -> None:
        """Tell the procedure the live worker count whenever it changes (its concurrency follows the pool)."""
        n = len(self.pool.holds)
        if self._live_workers is not None and n != self._live_workers:  # None: the procedure is not bound yet
            self._live_workers = n
            self.procedure.workers_changed(n)
            self._event("workers_changed", num_workers=n)

    def _state_lost(self, a: Assignment, state: DispatchState, error: Exception) -> None:
        """The config's latest state object is gone: restore it from its newest verified checkpoint."""
        c = self._configs[a.unit.config_id]
        self._run_deferred()  # every completed unit is logged and its checkpoint queued before we look at the disk
        self._ckpt.flush()
        try:
            ckpt, _, units = self._ckpt.load_latest(c.id)
        except CorruptCheckpointError as e:
            ckpt, units = None, 0
            if c.units:
                state.requeue(a.unit)
                self._fail_config(c, state, f"its state was lost ({error!r}) and no checkpoint is usable: {e}")
                return
        state.requeue(a.unit)
        behind = c.units - units
        visited = {e: list(ps) for e, ps in (ckpt or {}).get("visited", {}).items()}
        epoch = a.unit.epoch
        redo = units_to_redo(c.visited, visited, epoch, behind)
        if redo is None:
            self._fail_config(c, state, f"its state was lost ({error!r}) and the newest checkpoint is {behind} units old")
            return
        for p in redo:
            state.reopen(Unit(c.id, epoch, p, TRAIN))
        # the units to re-do are gone from the config's weights: their log rows and metrics must go too
        gone = [r for r in self._round_reports[c.id] if r.unit.kind == TRAIN and r.unit.epoch == epoch
                and r.unit.partition in redo]
        self._round_reports[c.id] = [r for r in self._round_reports[c.id] if r not in gone]
        self._catalog.mark_units(self._catalog.unit_seqs([r.unit for r in gone]), "lost")
        c.state_ref = ray.put(ckpt) if ckpt is not None else None
        c.units, c.visited = units, visited
        self._event("state_restored", config_id=c.id, units=units, rerun=redo)

    def _fail_config(self, c: _Config, state: DispatchState, why: str) -> None:
        state.drop_config(c.id)
        c.status = FAILED
        self._catalog.update_config(c.id, status=FAILED, error=why)
        self._event("config_failed", config_id=c.id, why=why)
        tqdm.write(f"config {c.id} failed: {why}")

    def _wait_for_holders(self, state: DispatchState) -> None:
        stalled = sorted(state.stalled_partitions())
        self._event("waiting_for_holder", partitions=stalled)
        tqdm.write(f"units of partitions {stalled} wait for a worker that holds them (add_workers() to provide one)")
        try:
            kind, arg = self._control.get(timeout=300)
        except queue.Empty:
            raise RuntimeError(f"no worker holds partitions {stalled} and none joined within 300 s") from None
        self._control.put((kind, arg))

    def _handle_control(self, state: DispatchState) -> None:
        while True:
            try:
                kind, arg = self._control.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                count, partitions = arg
                for _ in range(count):
                    w = self.pool.next_id()
                    parts = partitions if partitions is not None else self._least_replicated()
                    self._start_worker(w, parts)
                    self._event("worker_added", worker=w, partitions=list(parts))
            elif kind == "drain" and arg in self.pool.holds:
                self.pool.draining.add(arg)
                state.drain_worker(arg)
                self._event("worker_draining", worker=arg)
                self._ensure_holders()
                self._finish_drain(arg)

    def _grow_into_free_resources(self) -> None:
        """Elastic scale-out at a barrier: add workers while the cluster has room for one and `max_workers` allows.

        Workers still loading count as taken; Ray's available resources already exclude every live actor.
        """
        if self.max_workers is None:
            return
        free = dict(ray.available_resources())
        need = {"CPU": 1.0, **self.worker_resources}
        room = self.max_workers - len(self.pool.holds) - len(self.pool.joining)
        while room > 0 and all(free.get(k, 0.0) >= v for k, v in need.items() if v > 0):
            for k, v in need.items():
                free[k] = free.get(k, 0.0) - v
            self.add_workers(1)
            self._event("autoscale", free={k: free.get(k, 0.0) for k in need})
            room -= 1

    def _least_replicated(self) -> list[int]:
        """Partitions a new worker should load: the least-held ones (counting workers still loading), as many as an
        average worker holds."""
        holders = {p: len(ws) for p, ws in self.pool.availability().items()}
        for _, parts in self.pool.joining.values():
            for p in parts:
                holders[p] += 1
        per_worker = max(1, round(sum(holders.values()) / max(1, len(self.pool.holds) + len(self.pool.joining))))
        return sorted(sorted(holders, key=lambda p: (holders[p], p))[:per_worker])

    def _finish_drain(self, worker: int) -> None:
        if worker in self.pool.draining and not any(f.assignment.worker == worker for f in self._in_flight.values()):
            self.pool.remove(worker)
            self._event("worker_drained", worker=worker)
            self._count_workers()

    # ---- round boundaries -----------------------------------------------------------------------------------
    def _close_round(self, round_: int, active: list[_Config]) -> list[_Config]:
        ended = []
        for c in active:
            if c.status != ACTIVE:
                continue
            c.history.append(epoch_metrics(self._round_reports[c.id]))
            ended.append(c)
        return ended

    def _commit(self, round_: int, ended: list[_Config], decision: Decision) -> None:
        """Apply the procedure's decision and commit the round atomically (metrics, statuses, new configs, state)."""
        if not isinstance(decision, Decision):
            raise TypeError(f"{type(self.procedure).__name__}.step returned {decision!r}, but must return a Decision")
        name = type(self.procedure).__name__
        for cid in decision.stop:
            if cid not in self._configs:
                raise ValueError(f"{name} stopped config {cid!r}, which does not exist")
            if self._configs[cid].status == ACTIVE:
                self._configs[cid].status = STOPPED
        new = []
        for source, cfg in [(None, cfg) for cfg in decision.add] + list(decision.clone):
            cid = len(self._configs)
            c = _Config(cid, dict(cfg), parent=source)
            if source is not None:
                if source not in self._configs:
                    raise ValueError(f"{name} cloned config {source!r}, which does not exist")
                src_ref = self._configs[source].state_ref
                if src_ref is not None:  # the clone's own epochs start at 0: it inherits weights, not visits
                    c.state_ref = ray.put({**ray.get(src_ref), "visited": {}})
            self._configs[cid] = c
            new.append((cid, c.config, source, round_ + 1))
            if c.state_ref is not None:  # a clone's starting point is durable before the round commits
                self._ckpt.submit(cid, 0, 0, lambda ref=c.state_ref: ray.get(ref))
        self._ckpt.flush()
        self._catalog.commit_round(
            round_,
            epochs=[(c.id, len(c.history) - 1, c.history[-1]) for c in ended],
            statuses=[(c.id, c.status, len(c.history)) for c in self._configs.values() if c.status != FAILED],
            new_configs=new,
            procedure=dumps_signed(self.procedure),
        )
        self._event("round_committed", round=round_)
        if self.faults.crash_after_commit(round_):
            self._crash()

    def _restore(self) -> tuple[int, list[Unit]]:
        """Rebuild the driver's state from the catalog and checkpoints; return the round to run and its units."""
        last, _, _ = self._catalog.last_round()
        round_ = last + 1
        configs, epochs = self._catalog.configs(), self._catalog.epochs()
        history: dict[int, list[dict]] = defaultdict(list)
        for row in epochs.sort_values(["config_id", "epoch"]).to_dict("records"):
            history[row.pop("config_id")].append(
                {k: v for k, v in row.items() if k not in ("epoch", "round") and v == v})
        units_log = self._catalog.units(status="done")
        partial = units_log[units_log["round"] == round_]
        todo: list[Unit] = []
        lost_seqs: list[int] = []
        for row in configs.itertuples():
            parent = None if row.parent != row.parent or row.parent is None else int(row.parent)
            c = _Config(int(row.config_id), row.config, parent=parent, status=row.status,
                        history=history.get(int(row.config_id), []))
            self._configs[c.id] = c
            if c.status != ACTIVE:
                continue
            try:
                state, _, c.units = self._ckpt.load_latest(c.id)
                c.state_ref = ray.put(state)
                c.visited = {int(e): list(ps) for e, ps in state["visited"].items()}
            except CorruptCheckpointError as e:
                if c.history or parent is not None:  # it had trained weights: they cannot be recovered
                    c.status = FAILED
                    self._catalog.update_config(c.id, status=FAILED, error=f"cannot resume: {e}")
                    continue
                c.state_ref, c.units, c.visited = None, 0, {}  # not trained past its first round: start afresh
            epoch = len(c.history)
            rows = {int(r.seq): r for r in partial[partial.config_id == c.id].itertuples()}
            kept, lost, run = resume_units(
                c.id, epoch, self.pool.entries, c.visited.get(epoch, []),
                [(seq, Unit(c.id, int(r.epoch), int(r.partition), r.kind)) for seq, r in rows.items()])
            for r in (rows[seq] for seq in kept):
                self._round_reports[c.id].append(UnitReport(
                    Unit(c.id, int(r.epoch), int(r.partition), r.kind), int(r.worker), r.start, r.end,
                    _json(r.metrics), int(r.num_examples), int(r.state_bytes)))
            lost_seqs += lost
            todo += run
        self._catalog.mark_units(lost_seqs, "lost")
        self._event("resume_plan", round=round_, rerun=len(todo), lost_units=len(lost_seqs))
        return round_, todo

    def _estimate(self, unit: Unit, worker: int) -> float:
        """Measured duration of this config's last unit of this kind on this worker (or any worker), else 1."""
        key = (unit.config_id, unit.kind, worker)
        if key in self._durations:
            return self._durations[key]
        same = [d for (cid, kind, _), d in self._durations.items() if cid == unit.config_id and kind == unit.kind]
        return sum(same) / len(same) if same else 1.0

    def _leaderboard_line(self, round_: int, seconds: float) -> str:
        scored = [(c.history[-1].get(self.metric), c.id) for c in self._configs.values() if c.history and c.status != FAILED]
        scored = [(v, cid) for v, cid in scored if v is not None]
        active = sum(c.status == ACTIVE for c in self._configs.values())
        failed = sum(c.status == FAILED for c in self._configs.values())
        if not scored:
            return f"round {round_}: {seconds:.1f}s, no {self.metric} reported yet ({failed} failed)"
        v, cid = (min if self.mode == "min" else max)(scored)
        return (f"round {round_}: {seconds:.1f}s | best config {cid} {self.metric}={v:.4f} | "
                f"{active} active, {failed} failed, {len(self._configs)} total")


def _json(text: str | None) -> dict:
    import json

    return json.loads(text) if text else {}


def _scheduler_names() -> set[str]:
    from framework.scheduling import SCHEDULERS

    return set(SCHEDULERS)
