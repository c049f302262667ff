"""Running an assignment on a worker: one member's unit (`run_unit`), and an assignment's members (`run_members`).

A unit builds the config's `Trainable` from its state (construction is seeded per config, so a config's initial
weights do not depend on where it starts), seeds the unit from (run seed, config, epoch, partition, kind), trains or
evaluates with the worker's functions (the user's `train_fn`/`eval_fn`, or the engine's `StepLoop` around a
`step_fn`), checks the metrics, and packs the new state with its visit record. Failures in user code come back as
`UnitReport.error`; a lost state or a broken gang propagates (not the user's fault: the driver re-runs the unit).

A pack (`task.members` holds several configs) trains as one fused model when it can (`_run_fused`,
`framework.engine.packs.FusedPack`): every member built from its own state and seeded as alone, each reading its
rows in its own unit seed's order, all stepped at once, each ending with the weights it would reach alone (up to
float rounding) and its own report; a member whose loss goes non-finite fails alone. A member's LR scheduler is its
own: a per-step one ("step" interval) steps after every step of the fused pass and the pack's optimizer follows its
learning rate; an "epoch" one is stepped when the member is built, as alone. A pack's evaluation runs fused too
(`_evaluate_fused`: the worker's `eval_step` or `step_fn`, every member on the same batches in order, each report
as alone; a user's `eval_fn` is not fused). A pack that cannot fuse (`PackError`: different architectures, a
`train_fn`, an enabled GradScaler, ...; or an error of the fused pass itself) runs one member after another, each
exactly as it would run on its own, its reports noting why.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import random
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from framework.data import data_len, shard_data
from framework.engine.gang import GangBrokenError
from framework.engine.packs import FusedPack, PackError
from framework.engine.state import ModelState, PackedState, pack_state, state_nbytes, unpack_state
from framework.engine.steps import StepLoop, batch_size_of
from framework.scheduling.units import TRAIN, Unit, UnitReport, UnitTask, unit_seed
from framework.trainable import Trainable, accepted_kwargs


class UnitHost(Protocol):
    """What the runner reads of the worker that runs a unit (kept by `framework.engine.worker.Worker`, which calls
    the runner: the runner never imports it)."""

    worker_id: int
    device: torch.device
    data: dict[tuple[str, int], Any]  # ("train" | "valid", partition) -> the partition's data
    model_fn: Callable
    train_fn: Callable | None
    step_fn: Callable | None
    eval_fn: Callable | None
    fn_names: dict[str, str]  # unit kind -> the user function's name, for error messages
    freezing: dict[str, Any] | None

    def act_out(self, fault: Any, unit: Unit | None) -> None: ...

    def gang_place(self, task: UnitTask) -> tuple[Unit, int, Any, tuple[int, int]]: ...

    def controller(self, model: torch.nn.Module, unit: Unit, state: ModelState | None) -> Any: ...

    def split_frozen(self, config_id: int, model: torch.nn.Module, new_state: ModelState) -> None: ...

    def full_weights(self, config_id: int, state: ModelState) -> dict[str, Any]: ...


__all__ = ["member_tasks", "run_members", "run_unit", "seed_everything", "seed_torch"]


def seed_everything(s: int) -> None:
    """Seed torch's CPU generator, every GPU's where CUDA is available, `random` and NumPy's global generator.

    Not `torch.manual_seed`: that also seeds MPS, XPU and MTIA and, for each device kind not initialised, queues the
    seed with the caller's whole stack (`traceback.format_stack`), which costs 0.2-1 ms a call; a unit seeds twice.
    """
    seed_torch(s)
    random.seed(s)
    np.random.seed(s % (2**32))


def seed_torch(s: int) -> None:
    """Seed torch's CPU generator and, where CUDA is available, every GPU's (queued until CUDA initialises, as
    `torch.manual_seed` would): `seed_everything`'s torch part, without `torch.manual_seed`'s stack capture."""
    torch.default_generator.manual_seed(s)
    if _cuda_available():
        torch.cuda.manual_seed_all(s)


@functools.cache
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def run_members(
    worker: UnitHost, task: UnitTask, states: Sequence[PackedState | ModelState | None]
) -> tuple[tuple[PackedState | None, ...], tuple[UnitReport, ...]]:
    """Run every member of `task` (`task.members`, in order; one state each) on `worker`: fused when they can be (see
    the module docstring), else one after another. (new states, reports), one of each per member. A member whose
    user code fails does not stop the others."""
    if len(task.members) <= 1:
        state, report = run_unit(worker, task, states[0])
        return (state,), (report,)
    if len(task.workers) > 1:
        raise NotImplementedError(f"a pack of {len(task.members)} configs on a gang of workers {task.workers} has no "
                                  "runner yet: a pack runs on one worker")
    members = member_tasks(task)
    fused, note = (_run_fused if task.unit.kind == TRAIN else _evaluate_fused)(worker, members, states)
    if fused is not None:
        return fused
    out = [run_unit(worker, t, s) for t, s in zip(members, states, strict=True)]
    start, end = out[0][1].start, out[-1][1].end
    for _, report in out:  # the pack held its worker as one: every member's row spans it (as a gang's rows do)
        report.start, report.end, report.note = start, end, note
    return tuple(s for s, _ in out), tuple(r for _, r in out)


def member_tasks(task: UnitTask) -> list[UnitTask]:
    """A pack's task as one task per member, each with its own injected fault (if any)."""
    configs = task.configs or (task.config,) * len(task.members)
    faults = task.faults or (task.fault, *[None] * (len(task.members) - 1))
    return [UnitTask(unit, config, task.seed, fault) for unit, config, fault in zip(task.units, configs, faults,
                                                                                  strict=True)]


def _run_fused(worker: UnitHost, members: list[UnitTask], states: Sequence[PackedState | ModelState | None]
               ) -> tuple[tuple[tuple[PackedState | None, ...], tuple[UnitReport, ...]] | None, str | None]:
    """Train a pack's members as one `FusedPack`: (their states and reports, None), or (None, why not) when they
    cannot be fused (the caller then runs them one after another, from their untouched states). A member's LR
    scheduler steps as alone: one with a `scheduler_interval` of "step" after every step of the pass (its own
    schedule), an "epoch" one when the member is built for its first unit of an epoch (`_build`)."""
    if worker.step_fn is None or worker.freezing is not None:
        return None, "not fused: packs fuse a `step_fn` without layer freezing"
    start, reports, built = _prepare_members(worker, members, states)
    live = sorted(built)
    data = worker.data[("train", members[0].unit.partition)]
    n = data_len(data)
    if len(live) < 2 or any(batch_size_of(members[i].config) > n for i in live):
        return None, None  # (alone, each member reports its own error)
    why = next((f"config {members[i].unit.config_id} has an enabled GradScaler (mixed precision)" for i in live
                if built[i][0].grad_scaler is not None and built[i][0].grad_scaler.is_enabled()), None)
    if why is not None:
        return None, f"not fused: {why}, which a pack does not stack"
    orders = []
    for i in live:  # each member's rows in the order its own unit seed draws, as when it trains alone
        _seed_unit(members[i].seed, members[i].unit)
        orders.append(torch.randperm(n))
    for i in live:
        built[i][0].model.train()
    trainables = [built[i][0] for i in live]
    try:
        pack = FusedPack([t.model for t in trainables], [t.optimizer for t in trainables],
                         ids=[members[i].unit.config_id for i in live])
        results = pack.train(worker.step_fn, data, [members[i].config for i in live], orders,
                             _extras(worker.step_fn, [members[i].unit for i in live]),
                             lr_schedulers=[t.lr_scheduler if t.scheduler_interval == "step" else None
                                            for t in trainables])
        pack.write_back()
    except PackError as e:
        return None, f"not fused: {e}"
    except Exception as e:  # the fused pass itself failed: alone, each member's own error (if any) is its own
        return None, f"not fused: the fused pass raised {type(e).__name__}: {e}"
    return _finish_members(worker, members, built, results, reports, data, start), None


def _extras(fn: Callable, units: list[Unit]) -> dict[str, Any]:
    """The keywords `fn` takes of a pack's step (`epoch`, `freezing`: None); `PackError` where it takes `epoch` and
    the members are at different epochs (an asynchronous pack: the step runs once for all of them)."""
    extras = accepted_kwargs(fn, {"epoch": units[0].epoch, "freezing": None})
    epochs = sorted({u.epoch for u in units})
    if "epoch" in extras and len(epochs) > 1:
        raise PackError(f"the step takes `epoch`, and the members are at epochs {epochs}; a pack runs the step once "
                        "for all of them")
    return extras


def _evaluate_fused(worker: UnitHost, members: list[UnitTask], states: Sequence[PackedState | ModelState | None]
                    ) -> tuple[tuple[tuple[PackedState | None, ...], tuple[UnitReport, ...]] | None, str | None]:
    """Evaluate a pack's members as one `FusedPack` (`FusedPack.evaluate`: the worker's `eval_step`, or its
    `step_fn`, as `StepLoop.evaluate` runs it alone): (their (None) states and reports, None), or (None, why not)
    when they cannot be fused (the caller then evaluates them one after another). A user's `eval_fn` is not
    fused, and says nothing (a note refuses the pack's key, training included: `Packer.observe`)."""
    loop = getattr(worker.eval_fn, "__self__", None)
    if not isinstance(loop, StepLoop) or getattr(worker.eval_fn, "__func__", None) is not StepLoop.evaluate:
        return None, None
    fn = loop.eval_step if loop.eval_step is not None else loop.step_fn
    start, reports, built = _prepare_members(worker, members, states)
    live = sorted(built)
    if len(live) < 2:
        return None, None  # (alone, each member reports its own error)
    unit = members[live[0]].unit
    data = worker.data[("valid", unit.partition)]
    models = [built[i][0].model for i in live]
    for model in models:
        model.eval()
    _seed_unit(members[live[0]].seed, unit)  # (an evaluation draws nothing as a rule; if it does, reproducibly)
    try:
        # (an evaluation reads no optimizer: a plain SGD per member, which stacks nothing, stands in for any)
        pack = FusedPack(models, [torch.optim.SGD(m.parameters(), lr=0.0) for m in models],
                         ids=[members[i].unit.config_id for i in live])
        results = pack.evaluate(fn, data, [members[i].config for i in live],
                                _extras(fn, [members[i].unit for i in live]),
                                name="eval_step" if loop.eval_step is not None else "step_fn")
    except PackError as e:
        return None, f"not fused: {e}"
    except Exception as e:  # the fused pass itself failed: alone, each member's own error (if any) is its own
        return None, f"not fused: the fused evaluation raised {type(e).__name__}: {e}"
    return _finish_members(worker, members, built, results, reports, data, start), None


def _prepare_members(worker: UnitHost, members: list[UnitTask], states: Sequence[PackedState | ModelState | None]
                     ) -> tuple[float, list[UnitReport], dict[int, tuple[Trainable, ModelState | None]]]:
    """A fused pack's start: (its start time, a report per member, each member's `_prepare` by index); a member
    whose user code (or injected fault) fails has its report's error and is left out; the others go on."""
    start = time.time()
    reports = [UnitReport(unit=t.unit, worker=worker.worker_id, start=start, end=start) for t in members]
    built: dict[int, tuple[Trainable, ModelState | None]] = {}
    for i, (t, state) in enumerate(zip(members, states, strict=True)):
        try:
            built[i] = _prepare(worker, t, t.unit, state)
        except worker.LOST_STATE_ERRORS:
            raise
        except Exception:  # this member's user code (or its injected fault) failed: the others go on
            reports[i].error = traceback.format_exc()
    return start, reports, built


def _finish_members(worker: UnitHost, members: list[UnitTask], built: dict[int, tuple[Trainable, ModelState | None]],
                    results: list[dict[str, float]], reports: list[UnitReport], data: Any, start: float
                    ) -> tuple[tuple[PackedState | None, ...], tuple[UnitReport, ...]]:
    """A fused pack's end: each live member's metrics (`results`, in member order) checked into its report and its
    new state packed (`_finish`; a member's failure there is its own); every report spans the pack."""
    new_states: list[PackedState | None] = [None] * len(members)
    for i, metrics in zip(sorted(built), results, strict=True):
        trainable, state = built[i]
        try:
            new_states[i] = _finish(worker, members[i], trainable, state, metrics, None, reports[i], data)
        except Exception:
            reports[i].error = traceback.format_exc()
    end = time.time()
    for r in reports:
        r.start, r.end = start, end
    return tuple(new_states), tuple(reports)


def _prepare(worker: UnitHost, task: UnitTask, unit: Unit, state: PackedState | ModelState | None, act: bool = True
             ) -> tuple[Trainable, ModelState | None]:
    """A unit's start: its injected fault acted out (when `act`), the config's `Trainable` built from its state,
    and what the unit still reads of that state once the model holds the weights (visits and freezing)."""
    if task.fault is not None and act:
        worker.act_out(task.fault, unit)
    state = unpack_state(state, worker.device if worker.device.type == "cuda" else None, copy_model=False)
    trainable = _build(worker, task, state)
    return trainable, None if state is None else {"visited": state.get("visited") or {},
                                                  "freezing": state.get("freezing")}


def _seed_unit(seed: int, unit: Unit, share: tuple[int, int] = (0, 1)) -> None:
    """Seed a unit from (run seed, config, epoch, partition, kind, its share of the partition): alone or in a pack,
    a unit draws the same row order."""
    seed_everything(unit_seed(seed, unit.config_id, unit.epoch, unit.partition, int(unit.kind == TRAIN), *share))


def run_unit(worker: UnitHost, task: UnitTask, state: PackedState | ModelState | None
             ) -> tuple[PackedState | None, UnitReport]:
    """Run one unit from `state` (None: a fresh config). Returns (new state, packed, or None for eval; report).

    In a gang (`task.workers` has several), the worker trains its own partition (`task.partitions`; a share of it
    where several members have the same one) with the gang's gradients averaged at every optimizer step, and reports
    its own unit; the first member returns the state (which holds every member's partitions in its visits), the
    others None."""
    unit, rank, gang, share, trainable = task.unit, 0, None, (0, 1), None
    if len(task.workers) > 1:
        unit, rank, gang, share = worker.gang_place(task)
    start = time.time()
    report = UnitReport(unit=unit, worker=worker.worker_id, start=start, end=start)
    try:
        trainable, state = _prepare(worker, task, unit, state, act=rank == 0)  # (a gang's fault: its first member's)
        data = shard_data(worker.data[("train" if unit.kind == TRAIN else "valid", unit.partition)], *share)
        _seed_unit(task.seed, unit, share)
        if unit.kind == TRAIN:
            metrics, freezing_state, report.comm_s = _train(worker, task, unit, trainable, data, state, gang)
        else:
            trainable.model.eval()
            with torch.no_grad():
                metrics = worker.eval_fn(trainable.model, data, task.config,
                                         **accepted_kwargs(worker.eval_fn, {"epoch": unit.epoch}))
        new_state = _finish(worker, task, trainable, state, metrics, freezing_state if unit.kind == TRAIN else None,
                            report, data, rank, task.units)
    except (GangBrokenError, *worker.LOST_STATE_ERRORS):
        raise  # the config's state could not be fetched, or its gang broke: not the user's fault
    except Exception:  # user code failed: report it against the config, keep the worker alive
        new_state, report.error = None, traceback.format_exc()
        if gang is not None and trainable is not None:  # the others are not left waiting for this member
            with contextlib.suppress(Exception):
                gang.finish(trainable.optimizer)
    report.end = time.time()
    return new_state, report


def _finish(worker: UnitHost, task: UnitTask, trainable: Trainable, state: ModelState | None, metrics: Any,
            freezing_state: Any, report: UnitReport, data: Any, rank: int = 0, units: Sequence[Unit] = ()
            ) -> PackedState | None:
    """A unit's metrics checked into `report` and its new state (with its visit record) packed: None for an
    evaluation, and for a gang's members but its first. `units`: what the state absorbed (default: the unit)."""
    unit = task.unit
    metrics = check_metrics(metrics, worker.fn_names[unit.kind])
    new_state = None
    if unit.kind == TRAIN:
        # The visit record travels inside the state, so a config proves which partitions it absorbed.
        visited = {e: list(ps) for e, ps in (state or {}).get("visited", {}).items()}
        visited.setdefault(unit.epoch, []).extend(u.partition for u in (units or (unit,)))  # (a gang's: all)
        # (tensors stay where they are: `pack_state` copies them into the hop's buffer once)
        new_state = {"model": trainable.model.state_dict(), **trainable.state_dict(), "visited": visited}
        if worker.freezing is not None:
            new_state["freezing"] = freezing_state
            worker.split_frozen(unit.config_id, trainable.model, new_state)
    report.num_examples = metrics.pop("num_examples") if "num_examples" in metrics else data_len(data)
    report.metrics = metrics
    new_state = pack_state(new_state) if rank == 0 else None  # (a gang's members hold the same weights)
    report.state_bytes = state_nbytes(new_state)
    return new_state


def _train(worker: UnitHost, task: UnitTask, unit: Unit, trainable: Trainable, data: Any, state: ModelState | None,
           gang: Any) -> tuple[Any, Any, float]:
    """One training pass of the worker's `train_fn` (in a gang: its gradients averaged at every step, and the
    members with batches left followed to the end); (metrics, the freezing controller's state or None, seconds in
    the gang's all-reduces)."""
    model, optimizer = trainable.model, trainable.optimizer
    # what a train_fn may declare as keyword arguments besides its four positional ones
    extras = {"epoch": unit.epoch, "lr_scheduler": trainable.lr_scheduler, "grad_scaler": trainable.grad_scaler,
              "gang_size": len(task.workers) if gang is not None else 1,
              "scheduler_interval": trainable.scheduler_interval}
    averaging = gang.averaging(optimizer) if gang is not None else None
    comm0 = gang.comm_seconds if gang is not None else 0.0
    model.train()
    controller = worker.controller(model, unit, state) if worker.freezing is not None else None
    try:
        if controller is not None:
            extras["freezing"] = controller
        metrics = worker.train_fn(model, optimizer, data, task.config, **accepted_kwargs(worker.train_fn, extras))
        freezing_state = controller.state_dict() if controller is not None else None
    finally:
        if controller is not None:
            controller.close()
    if gang is not None:
        gang.finish(optimizer)  # follow the members with batches left, so every member ends alike
        averaging.restore()
    return metrics, freezing_state, gang.comm_seconds - comm0 if gang is not None else 0.0


def _build(worker: UnitHost, task: UnitTask, state: ModelState | None) -> Trainable:
    # Construction is seeded per config, so a config's initial weights do not depend on the worker it starts on.
    seed_everything(unit_seed(task.seed, task.unit.config_id))
    trainable = Trainable.of(worker.model_fn(task.config))
    trainable.model.to(worker.device)
    if state is not None:
        trainable.model.load_state_dict(worker.full_weights(task.unit.config_id, state))
        # a state with weights but no visits is a clone's starting point (PBT exploit): it inherits the donor's
        # weights and moments, but trains with its own (perturbed) config's hyper-parameters
        trainable.load_state_dict(state, fresh_hyperparameters=not state.get("visited"))
        visited = state.get("visited") or {}
        if (task.unit.kind == TRAIN and trainable.lr_scheduler is not None and trainable.scheduler_interval == "epoch"
                and visited and task.unit.epoch not in visited):
            with warnings.catch_warnings():  # the optimizer did step: in earlier units, on whichever workers
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                trainable.lr_scheduler.step()  # the config's first unit of a new epoch: one step per epoch
    return trainable


def check_metrics(metrics: Any, fn_name: str) -> dict[str, float]:
    """What user code returned as a unit's metrics, as `{name: float}` (and `num_examples` as an int)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{fn_name} must return a dict of metrics, got {type(metrics).__name__}")
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor):
            v = v.item()
        if k == "num_examples":
            out[k] = _check_num_examples(v, fn_name)
            continue
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{fn_name} returned metric {k!r} = {v!r}, which is not a number") from None
    # a NaN would rank silently (last, or not at all): it fails the config instead, named by a loss where one is
    for k, v in sorted(out.items(), key=lambda kv: "loss" not in kv[0]):
        if not math.isfinite(v):
            raise FloatingPointError(f"{fn_name} returned a non-finite {'loss' if 'loss' in k else 'metric'}: "
                                     f"{k} = {v}")
    return out


def _check_num_examples(v: Any, fn_name: str) -> int:
    """`num_examples` as returned by user code: the examples a unit used, which weight its metrics in the epoch's
    mean (so 0 would drop them, and a negative count would flip them)."""
    bad = isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or not float(v).is_integer()
    if bad or not 1 <= v < 2**63:  # SQLite keeps 64-bit integers
        raise ValueError(f"{fn_name} returned `num_examples` = {v!r}, but it must be a positive int (below 2**63: "
                         "the examples the unit used, which weight its metrics in the epoch's mean)")
    return int(v)
