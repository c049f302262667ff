"""`ModelSelection`: the driver. It owns the run loop; policies, procedures and user code plug into it.

Per round (epoch barrier): every active config gets one training unit per partition and then one eval unit per
validation partition; a `Scheduler` dispatches them to idle workers through a `DispatchState` (the MOP invariants);
completions arrive through `ray.wait` (event-driven, no polling sleep); the catalog logs every unit; the checkpoint
writer saves the latest state of each config off the critical path; after the round the procedure decides.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
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
from framework.engine.checkpoint import CheckpointStore
from framework.engine.ray_backend import ensure_ray, start_worker
from framework.engine.worker import UnitReport, UnitTask, epoch_metrics
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.scheduling import EVAL, TRAIN, Assignment, DispatchState, Scheduler, Unit, make_scheduler

EXECUTORS = ("mop", "task_parallel", "sequential")
MODES = ("min", "max")


@dataclass
class _Config:
    id: int
    config: dict[str, Any]
    parent: int | None = None
    status: str = ACTIVE
    history: list[dict[str, float]] = field(default_factory=list)
    state_ref: Any = None  # ObjectRef of the latest state (None before the first unit)
    units: int = 0  # training units absorbed so far (all epochs)

    def view(self) -> ConfigState:
        return ConfigState(self.id, dict(self.config), len(self.history), tuple(self.history), self.status, self.parent)


def _fn_ref(fn: Callable | None) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


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
        import automl

        loader = getattr(automl, "load_procedure", None)
        if loader is not None:
            return loader(procedure)
    raise TypeError(f"`procedure` is {procedure!r}, but must be an automl.Procedure (or a 'module:Class' string)")


class ModelSelection:
    """Train many configs on a partitioned dataset with model hopper parallelism, and pick the best.

    Args:
        model_fn: `model_fn(config) -> (torch.nn.Module, torch.optim.Optimizer)`.
        train_fn: `train_fn(model, optimizer, data, config) -> dict` (one pass over the worker's partition `data`;
            may return `num_examples`; a `*loss*` metric that is NaN fails the config).
        eval_fn: `eval_fn(model, data, config) -> dict`, called under `torch.no_grad()`.
        dataset: a `PartitionedDataset`.
        procedure: an `automl.Procedure` (GridSearch, RandomSearch, ...), or a `"module:Class"` string.
        input_fn: `input_fn(entry) -> data`, run on the worker to load a partition (default: the entry itself).
        num_workers: worker actors (default: one per partition; the full-data `sequential` executor uses one).
        worker_resources: Ray resources per worker, e.g. `{"CPU": 1, "GPU": 0}`; a GPU worker puts models on its GPU.
        scheduler: a name from `framework.scheduling.SCHEDULERS` or a `Scheduler` instance.
        executor: `"mop"` (partitions stay, models hop), `"task_parallel"` (every worker holds all data and trains
            whole epochs of one config, the Ray Tune / Celery pattern) or `"sequential"` (one worker, all data).
        seed: run seed; every unit is seeded from (seed, config, epoch, partition).
        storage_path: the run's directory (default: a new folder under `./runs/`).
        metric, mode: what ranks configs (`valid_<name>` or `train_<name>`; `"min"` or `"max"`).
        progress: show a progress bar over units and a leaderboard line per round.
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
    ) -> None:
        for name, fn in (("model_fn", model_fn), ("train_fn", train_fn), ("eval_fn", eval_fn)):
            if not callable(fn):
                raise TypeError(f"`{name}` is {fn!r}, but must be callable")
        if input_fn is not None and not callable(input_fn):
            raise TypeError(f"`input_fn` is {input_fn!r}, but must be callable or None")
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
        self.availability = dataset.placement(num_workers) if executor == "mop" else {0: list(range(num_workers))}
        self.model_fn, self.train_fn, self.eval_fn, self.input_fn = model_fn, train_fn, eval_fn, input_fn
        self.dataset = dataset
        self.procedure = _resolve_procedure(procedure)
        self.scheduler = make_scheduler(scheduler, seed=seed)
        self.scheduler_name = scheduler if isinstance(scheduler, str) else type(scheduler).__name__
        self.executor, self.seed, self.metric, self.mode = executor, seed, metric, mode
        self.num_workers, self.worker_resources, self.progress = num_workers, resources, progress
        self.num_threads = max(1, int(resources.get("CPU", 1)))
        if storage_path is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            storage_path = os.path.join("runs", f"run-{stamp}")
        self.storage_path = os.path.abspath(storage_path)
        if os.path.exists(os.path.join(self.storage_path, CATALOG_FILE)):
            raise FileExistsError(f"`storage_path` {self.storage_path!r} already holds a run; choose a new directory")

    # ---- public -------------------------------------------------------------------------------------------------
    def run(self) -> Result:
        """Run the selection to completion and return its `Result` (also written under `storage_path`)."""
        os.makedirs(self.storage_path, exist_ok=True)
        ensure_ray(min_cpus=self.num_workers * self.worker_resources.get("CPU", 1))
        self._catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE))
        self._ckpt = CheckpointStore(os.path.join(self.storage_path, CHECKPOINT_DIR), self._catalog)
        self._t0 = time.time()
        self._record_meta()
        self._workers: dict[int, Any] = {}
        try:
            self._start_workers()
            self._loop()
        finally:
            errors = self._ckpt.flush()
            self._ckpt.close()
            self._catalog.set_meta(end_time=time.time(), checkpoint_errors=errors)
            self._catalog.close()
            for actor in self._workers.values():
                ray.kill(actor)
        result = Result(self.storage_path, self.model_fn)
        result.write()
        return result

    # ---- set-up -------------------------------------------------------------------------------------------------
    def _record_meta(self) -> None:
        data_desc = self.dataset.save(os.path.join(self.storage_path, "data"))
        self._catalog.set_meta(
            start_time=self._t0, seed=self.seed, executor=self.executor, scheduler=self.scheduler_name,
            num_workers=self.num_workers, worker_resources=self.worker_resources, num_threads=self.num_threads,
            metric=self.metric, mode=self.mode, availability={str(k): v for k, v in self.availability.items()},
            procedure=type(self.procedure).__name__, dataset=data_desc, git_revision=_git_revision(),
            functions={n: _fn_ref(f) for n, f in (("model_fn", self.model_fn), ("train_fn", self.train_fn),
                                                  ("eval_fn", self.eval_fn), ("input_fn", self.input_fn))},
        )

    def _start_workers(self) -> None:
        ds = self.dataset
        put = (lambda e: ray.put(e)) if ds.in_memory else (lambda e: e)
        train = [put(e) for e in ds.train]
        valid = [put(e) for e in ds.valid]
        fns = {"model_fn": self.model_fn, "train_fn": self.train_fn, "eval_fn": self.eval_fn, "input_fn": self.input_fn}
        loads = []
        for w in range(self.num_workers):
            actor = start_worker(w, self.worker_resources, fns, self.num_threads)
            self._workers[w] = actor
            if self.executor == "mop":
                held = {p: ([train[p]], [valid[p]]) for p, ws in self.availability.items() if w in ws}
            else:  # full-data baselines: the one "partition" 0 is all the data, on every worker
                held = {0: (train, valid)}
            loads.append(actor.load.remote(held))
        self.partition_sizes = ray.get(loads)
        self._catalog.add_event("workers_started", count=self.num_workers, sizes=self.partition_sizes)
        self.data_bytes_per_worker = ray.get([a.data_nbytes.remote() for a in self._workers.values()])
        self._catalog.set_meta(data_bytes_per_worker=self.data_bytes_per_worker)

    # ---- the run loop -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        bind_params = inspect.signature(self.procedure.bind).parameters
        extra = {"num_workers": self.num_workers} if "num_workers" in bind_params else {}
        self.procedure.bind(self.metric, self.mode, self.storage_path, **extra)
        self._configs: dict[int, _Config] = {}
        self._durations: dict[tuple[int, str, int], float] = {}
        self._state_out: dict[Any, Any] = {}  # report ref -> state ref of the same unit
        self._apply(self.procedure.step([]), 0)
        partitions = sorted(self.availability)
        bar = tqdm(total=0, unit="unit", desc="model selection", disable=not self.progress, dynamic_ncols=True)
        round_ = 0
        try:
            while True:
                active = [c for c in self._configs.values() if c.status == ACTIVE]
                if not active:
                    break
                units = [
                    Unit(c.id, len(c.history), p, kind) for c in active for kind in (TRAIN, EVAL) for p in partitions
                ]
                bar.total += len(units)
                bar.refresh()
                t_round = time.time()
                reports = self._run_round(round_, units, bar)
                self._close_round(round_, active, reports)
                bar.write(self._leaderboard_line(round_, time.time() - t_round))
                round_ += 1
                self._apply(self.procedure.step([c.view() for c in sorted(self._configs.values(), key=lambda c: c.id)]), round_)
        finally:
            bar.close()

    def _run_round(self, round_: int, units: list[Unit], bar: tqdm) -> dict[int, list[UnitReport]]:
        state = DispatchState(units, self.availability, estimate=self._estimate)
        self.scheduler.start_round(state)
        in_flight: dict[Any, tuple[Assignment, Any]] = {}
        reports: dict[int, list[UnitReport]] = defaultdict(list)  # config -> its completed units this round
        while not state.finished:
            for a in self.scheduler.select(state):
                state.start(a)
                in_flight[self._submit(a)] = a
            if not in_flight:
                raise RuntimeError(
                    f"round {round_}: {len(state.pending)} units are pending but none can run; partitions "
                    f"{sorted(state.stalled_partitions())} have no live worker"
                )
            [ready], _ = ray.wait(list(in_flight), num_returns=1)
            a = in_flight.pop(ready)
            state_ref = self._state_out.pop(ready)
            try:
                report: UnitReport = ray.get(ready)
            except ray.exceptions.RayActorError as e:
                self._worker_failed(a.worker, state, e)
                continue
            self._handle(round_, a, report, state_ref, state, reports)
            bar.update(1)
        return reports

    def _submit(self, a: Assignment) -> Any:
        c = self._configs[a.unit.config_id]
        task = UnitTask(a.unit, c.config, self.seed)
        state_ref, report_ref = self._workers[a.worker].run.options(num_returns=2).remote(task, c.state_ref)
        self._state_out[report_ref] = state_ref
        return report_ref

    def _handle(
        self, round_: int, a: Assignment, report: UnitReport, state_ref: Any, state: DispatchState, reports: dict
    ) -> None:
        unit, c = a.unit, self._configs[a.unit.config_id]
        if report.error is not None:
            state.complete(unit)
            state.drop_config(c.id)
            c.status = FAILED
            self._catalog.add_unit(round_, report, status="failed")
            self._catalog.update_config(c.id, status=FAILED, error=report.error)
            self._catalog.add_event("config_failed", config_id=c.id, unit=str(unit))
            tqdm.write(f"config {c.id} failed in {unit.kind} unit (epoch {unit.epoch}, partition {unit.partition}):\n"
                       + report.error.strip().splitlines()[-1])
            return
        state.complete(unit)
        self._catalog.add_unit(round_, report, status="done")
        self._durations[(c.id, unit.kind, a.worker)] = report.end - report.start
        reports[c.id].append(report)
        if unit.kind == TRAIN:
            c.state_ref, c.units = state_ref, c.units + 1
            self._ckpt.submit(c.id, unit.epoch, c.units, lambda ref=state_ref: ray.get(ref))

    def _worker_failed(self, worker: int, state: DispatchState, error: Exception) -> None:
        lost = state.remove_worker(worker)
        self._workers.pop(worker, None)
        self._catalog.add_event("worker_failed", worker=worker, requeued=[str(u) for u in lost], error=repr(error))
        tqdm.write(f"worker {worker} failed ({type(error).__name__}); re-queued {len(lost)} unit(s)")
        self.availability = {p: [w for w in ws if w != worker] for p, ws in self.availability.items()}

    def _close_round(self, round_: int, active: list[_Config], reports: dict[int, list[UnitReport]]) -> None:
        for c in active:
            if c.status != ACTIVE:
                continue
            metrics = epoch_metrics(reports[c.id])
            c.history.append(metrics)
            self._catalog.add_epoch(c.id, len(c.history) - 1, round_, metrics)
            self._catalog.update_config(c.id, epochs=len(c.history))

    def _apply(self, decision: Decision, next_round: int) -> None:
        if not isinstance(decision, Decision):
            raise TypeError(f"{type(self.procedure).__name__}.step returned {decision!r}, but must return a Decision")
        for cid in decision.stop:
            if cid not in self._configs:
                raise ValueError(f"{type(self.procedure).__name__} stopped config {cid!r}, which does not exist")
            c = self._configs[cid]
            if c.status == ACTIVE:
                c.status = STOPPED
                self._catalog.update_config(cid, status=STOPPED)
        new = [(None, cfg) for cfg in decision.add] + list(decision.clone)
        for source, cfg in new:
            cid = len(self._configs)
            c = _Config(cid, dict(cfg), parent=source)
            if source is not None:
                if source not in self._configs:
                    raise ValueError(f"{type(self.procedure).__name__} cloned config {source!r}, which does not exist")
                src_ref = self._configs[source].state_ref
                if src_ref is not None:  # the clone's own epochs start at 0: it inherits weights, not visits
                    c.state_ref = ray.put({**ray.get(src_ref), "visited": {}})
            self._configs[cid] = c
            self._catalog.add_config(cid, c.config, ACTIVE, parent=source, first_round=next_round)

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
