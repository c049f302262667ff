"""A MOP worker: holds its partitions in memory and runs training/eval units on whatever config hops in.

`Worker` is plain Python so `replay` can run it in-process; the engine wraps it with `ray.remote` as an actor.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from framework.data import concat_data, data_len, shard_data
from framework.engine.faults import InjectedFault
from framework.engine.gang import GangBrokenError, GangMember, gang_id
from framework.scheduling.units import TRAIN, Unit, UnitReport, UnitTask, unit_seed
from framework.trainable import Trainable, accepted_kwargs

# {"model": state_dict, "optimizer", "lr_scheduler", "grad_scaler": state_dicts or None,
#  "visited": {epoch: [partitions absorbed, in order]}},
# tensors on CPU; loadable with torch.load(weights_only=True).
ModelState = dict[str, Any]


def seed_everything(s: int) -> None:
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % (2**32))


def _to_cpu(obj: Any) -> Any:
    """Tensors in `obj` on the host (a host tensor is shared, not copied: the model it came from is dropped after
    its unit)."""
    return _map_leaves(obj, lambda t: t.detach().to("cpu") if isinstance(t, torch.Tensor) else t)


#: rows per batch when a worker runs `extract` over a partition
EXTRACT_BATCH = 1024


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors and arrays in `obj` (tuples, lists and dicts are walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _concat_features(outs: list[Any], n: int) -> Any:
    """Concatenate per-batch outputs of `extract` (a tensor, or a dict of tensors, each batch-first)."""
    if not outs:
        raise ValueError("`extract` got a partition with no records")
    first = outs[0]
    if isinstance(first, torch.Tensor):
        feats: Any = torch.cat(outs)
    elif isinstance(first, dict) and all(isinstance(v, torch.Tensor) for v in first.values()):
        feats = {k: torch.cat([o[k] for o in outs]) for k in first}
    else:
        raise TypeError(f"`extract` must return a tensor or a dict of tensors, got {type(first).__name__}")
    lens = {len(v) for v in (feats.values() if isinstance(feats, dict) else [feats])}
    if lens != {n}:
        raise ValueError(f"`extract` must keep the batch as the first dimension: {n} records gave lengths {lens}")
    return feats


@dataclass(frozen=True)
class _Slot:
    """Where one tensor of a packed state lives in its buffer."""

    offset: int
    nbytes: int
    dtype: str  # e.g. "float32" (an attribute of torch)
    shape: tuple[int, ...]


_ALIGN = 64


@dataclass
class PackedState:
    """A config state with every dense tensor copied into one contiguous byte buffer: what travels between workers.

    Ray moves a numpy buffer through its shared-memory object store without pickling it (one copy in, none out),
    where a dict of torch tensors is pickled tensor by tensor; the receiver takes the whole state back with one copy
    (`unpack_state`). `tree` is the state with each tensor replaced by its `_Slot`.
    """

    buffer: np.ndarray  # uint8 (each tensor starts at a multiple of 64 bytes)
    tree: Any
    nbytes: int = 0  # bytes of tensor payload (the buffer without its alignment padding)


def _map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` with `fn` applied to every leaf under its dicts, lists and tuples. A plain function, not a recursive
    closure: that would be a reference cycle, keeping every tensor it saw alive until the cyclic collector runs."""
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_leaves(v, fn) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_map_leaves(v, fn) for v in obj)
    return fn(obj)


def _unpack_tree(obj: Any, flat: torch.Tensor, copy: bool) -> Any:
    def leaf(slot: Any) -> Any:
        if not isinstance(slot, _Slot):
            return slot
        dtype = getattr(torch, slot.dtype)
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=dtype, device=flat.device)
        view = flat[slot.offset : slot.offset + slot.nbytes].view(dtype).view(slot.shape)
        return view.clone() if copy else view

    return _map_leaves(obj, leaf)


def pack_state(state: ModelState | None) -> PackedState | None:
    """`state` with its dense tensors in one buffer (on the host: a GPU tensor is copied down once)."""
    if state is None:
        return None
    tensors: list[torch.Tensor] = []
    end = 0

    def leaf(obj: Any) -> Any:  # a dense tensor becomes its slot in the buffer
        nonlocal end
        if not (isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_quantized):
            return obj
        slot = _Slot(end, obj.numel() * obj.element_size(), str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
        tensors.append(obj)
        end += -(-slot.nbytes // _ALIGN) * _ALIGN
        return slot

    tree = _map_leaves(state, leaf)
    buffer = np.empty(end, dtype=np.uint8)
    flat = torch.from_numpy(buffer)
    offset = payload = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n:
            flat[offset : offset + n].view(t.dtype).view(t.shape).copy_(t.detach())
        offset += -(-n // _ALIGN) * _ALIGN
        payload += n
    return PackedState(buffer, tree, payload)


def unpack_state(
    state: PackedState | ModelState | None, device: torch.device | str | None = None, copy_model: bool = True
) -> ModelState | None:
    """The plain state behind a `PackedState` (a plain state or None passes through). Every tensor is a writable
    copy of its own (so the model's weights can be dropped once loaded while the optimizer keeps its moments), on
    `device` when given (one copy of the whole buffer from pinned memory to the GPU, asynchronous on the current
    stream, then one per tensor there). `copy_model=False`: the tensors under `"model"` are views of the buffer
    instead, read-only when the buffer is (enough for `load_state_dict`, which copies them into the model)."""
    if not isinstance(state, PackedState):
        return state
    with warnings.catch_warnings():  # a buffer read from Ray's object store is read-only: it is only read here
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(state.buffer) if state.buffer.size else torch.empty(0, dtype=torch.uint8)
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    tree = state.tree
    if copy_model or not isinstance(tree, dict):
        return _unpack_tree(tree, flat, True)
    return {k: _unpack_tree(v, flat, k != "model") for k, v in tree.items()}


def state_nbytes(state: ModelState | None) -> int:
    """Bytes of tensor payload in a model state (what a hop moves)."""
    if state is None:
        return 0
    if isinstance(state, PackedState):
        return state.nbytes
    total = 0
    stack: list[Any] = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


#: the prefix of a worker's activation-cache folder (layer freezing with `cache=True`)
CACHE_PREFIX = "modelhopper-w"


class Worker(GangMember):
    """Runs units on the partitions it holds. Failures in user code come back as `UnitReport.error`.

    With layer freezing and `cache=True`, the worker keeps activation caches in a folder `modelhopper-w<id>-*`, made
    on first use under `cache_dir` (default: the system's temporary folder). `close()` removes it; so does the
    worker's garbage collection or its process's normal exit. A worker killed outright cannot: a run gives its
    workers a `cache_dir` of its own and removes that when it ends.
    """

    def __init__(
        self,
        worker_id: int,
        model_fn: Callable,
        train_fn: Callable,
        eval_fn: Callable,
        input_fn: Callable | None = None,
        device: str = "cpu",
        num_threads: int | None = None,
        freezing: Mapping[str, Any] | None = None,
        extract: Callable | None = None,
        data_on_device: bool = False,
        cache_dir: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.data_on_device = data_on_device
        self.model_fn, self.train_fn, self.eval_fn, self.input_fn = model_fn, train_fn, eval_fn, input_fn
        # torch imports its compiler stack lazily on the first optimizer construction (~1-2 s): pay it at start-up,
        # in parallel with the other workers, not inside the first (timed) unit.
        import torch._dynamo  # noqa: F401
        self.device = torch.device(device)
        if num_threads:
            torch.set_num_threads(num_threads)
        self.data: dict[tuple[str, int], Any] = {}
        self.freezing = dict(freezing) if freezing is not None else None
        # (config, generation) -> frozen weights this worker holds (received or published), and their handle
        self._frozen: dict[tuple[int, int], tuple[dict[str, torch.Tensor], Any]] = {}
        self._cache_parent = cache_dir
        self._cache_root: str | None = None  # made on first use (`_cache_folder`)
        self._cache_removal: weakref.finalize | None = None
        self.extract = extract
        self.extraction: dict[str, Any] = {"seconds": 0.0, "bytes": 0, "records": 0, "partitions": []}

    def close(self) -> None:
        """Remove this worker's activation caches (the backend calls it before it stops the worker)."""
        if self._cache_removal is not None:
            self._cache_removal()
        self._cache_root = self._cache_removal = None
        if self._cache_parent is not None:
            try:  # the run's folder for caches, once no worker of this node uses it (the run removes its own)
                os.rmdir(self._cache_parent)
            except OSError:
                pass

    def _cache_folder(self) -> str:
        if self._cache_root is None:
            for _ in range(3):  # another worker's `close` may remove the empty parent between the two calls
                if self._cache_parent is not None:
                    os.makedirs(self._cache_parent, exist_ok=True)
                try:
                    root = tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{self.worker_id}-", dir=self._cache_parent)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise FileNotFoundError(f"cannot make an activation cache under {self._cache_parent!r}")
            self._cache_root = root
            self._cache_removal = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)
        return self._cache_root

    # ---- data -------------------------------------------------------------------------------------------------
    def load(
        self, partitions: Mapping[int, tuple[Sequence[Any], Sequence[Any]]], fault: str | None = None
    ) -> dict[int, int]:
        """Load partitions `{id: (train_entries, valid_entries)}`; several entries are concatenated into one.

        Returns the number of training examples per partition. `fault`: an injected fault to act out first.
        """
        if fault is not None:
            self._act_out(fault, None)
        if self.extract is not None:  # `extraction_stats` describes the latest load
            self.extraction = {"seconds": 0.0, "bytes": 0, "records": 0, "partitions": []}
        for pid, (train_entries, valid_entries) in partitions.items():
            for split, entries in (("train", train_entries), ("valid", valid_entries)):
                parts = [self.input_fn(e) if self.input_fn is not None else e for e in entries]
                data = concat_data(parts)
                data = self._extract(data) if self.extract is not None else data
                if self.data_on_device:  # once per load, not once per batch of every unit
                    data = _map_leaves(data, lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t)
                self.data[(split, pid)] = data
            if self.extract is not None:
                self.extraction["partitions"].append(pid)
        return {pid: data_len(self.data[("train", pid)]) for pid in partitions}

    def _extract(self, data: Any, batch_size: int = EXTRACT_BATCH) -> Any:
        """`(x, y, ...) -> (extract(x), y, ...)`: the frozen prefix run once over the partition, near the data."""
        if not (isinstance(data, (tuple, list)) and len(data) >= 2):
            raise TypeError(
                f"`extract` needs a partition's data to be a tuple (inputs, labels, ...), got {type(data).__name__}"
            )
        x = data[0] if isinstance(data[0], torch.Tensor) else torch.as_tensor(data[0])
        if isinstance(self.extract, torch.nn.Module):
            self.extract.to(self.device).eval()
        start = time.perf_counter()
        outs: list[Any] = []
        with torch.no_grad():
            for s in range(0, len(x), batch_size):
                out = self.extract(x[s : s + batch_size].to(self.device))
                outs.append(_to_cpu(out))
        feats = _concat_features(outs, len(x))
        self.extraction["seconds"] += time.perf_counter() - start
        self.extraction["bytes"] += _tensor_bytes(feats)
        self.extraction["records"] += len(x)
        return (feats, *data[1:])

    def extraction_stats(self) -> dict[str, Any]:
        """Time, bytes and records of the features this worker materialized in its latest `load`."""
        return dict(self.extraction, partitions=list(self.extraction["partitions"]))

    def data_nbytes(self) -> int:
        """Bytes of in-memory data this worker holds (tensors and arrays only; dicts of them from `extract`)."""
        total = 0
        for d in self.data.values():
            items = d if isinstance(d, tuple) else (d,)
            for a in items:
                if isinstance(a, (torch.Tensor, np.ndarray, dict)):
                    total += _tensor_bytes(a)
        return total

    def pid(self) -> int:
        return os.getpid()

    # ---- units ------------------------------------------------------------------------------------------------
    def _build(self, task: UnitTask, state: ModelState | None) -> Trainable:
        # Construction is seeded per config, so a config's initial weights do not depend on the worker it starts on.
        seed_everything(unit_seed(task.seed, task.unit.config_id))
        trainable = Trainable.of(self.model_fn(task.config))
        trainable.model.to(self.device)
        if state is not None:
            trainable.model.load_state_dict(self._full_weights(task.unit.config_id, state))
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

    # ---- frozen layers (Egeria): the controller, and hops that leave frozen weights behind ----------------------
    #: errors that mean a state object is gone (set by the Ray subclass); they propagate to the driver
    LOST_STATE_ERRORS: tuple[type[BaseException], ...] = ()

    def _controller(self, model: torch.nn.Module, unit: Unit, state: ModelState | None) -> Any:
        from framework.freezing import FreezingController, split_by_size, split_children, split_regex

        opts = dict(self.freezing or {})
        split = opts.pop("modules", "children")
        cache = opts.pop("cache", False)
        if isinstance(split, int):
            modules = split_by_size(model, split)
        elif split == "children":
            modules = split_children(model)
        else:
            modules = split_regex(model, split)
        cache_dir = os.path.join(self._cache_folder(), f"c{unit.config_id}-p{unit.partition}") if cache else None
        controller = FreezingController(model, modules, cache_dir=cache_dir, **opts)
        if state is not None and state.get("freezing") is not None:
            controller.load_state_dict(state["freezing"])
        return controller

    def _split_frozen(self, config_id: int, model: torch.nn.Module, new_state: ModelState) -> None:
        """Move the frozen weights out of the hop payload: they are published once per (config, generation) and
        a worker that already holds them never receives them again."""
        from framework.freezing import frozen_parameter_names

        fstate = new_state["freezing"]
        names = frozen_parameter_names(model, fstate, include_buffers=True)
        if not names:
            return
        key = (config_id, int(fstate["generation"]))
        if key not in self._frozen:
            frozen = {k: _to_cpu(new_state["model"][k]) for k in names}
            self._frozen = {k: v for k, v in self._frozen.items() if k[0] != config_id}  # older generations
            self._frozen[key] = (frozen, self._publish(frozen))
        new_state["model"] = {k: v for k, v in new_state["model"].items() if k not in set(names)}
        new_state["frozen"] = {"generation": key[1], "weights": self._frozen[key][1]}

    def _full_weights(self, config_id: int, state: ModelState) -> dict[str, Any]:
        if "frozen" not in state:
            return state["model"]
        key = (config_id, int(state["frozen"]["generation"]))
        if key not in self._frozen:
            weights = self._resolve(state["frozen"]["weights"])
            self._frozen = {k: v for k, v in self._frozen.items() if k[0] != config_id}
            self._frozen[key] = (weights, state["frozen"]["weights"])
        return {**state["model"], **self._frozen[key][0]}

    def _publish(self, frozen: dict[str, torch.Tensor]) -> Any:
        """A handle other workers can resolve (in-process: the tensors themselves; on Ray: an object ref)."""
        return frozen

    def _resolve(self, handle: Any) -> dict[str, torch.Tensor]:
        return handle

    def _lost_state_error(self, unit: Unit) -> BaseException:
        """The error a worker meets when a config's state object is gone (the Ray subclass raises Ray's own)."""
        return LookupError(f"the state object of {unit} is lost")

    def _act_out(self, fault: str, unit: Unit | None) -> None:
        """Act out an injected fault (`framework.engine.faults`) as a unit (or a load, `unit` None) starts."""
        if fault == "raise":
            raise InjectedFault(f"injected fault in {unit}")
        if fault == "lose_state":
            raise self._lost_state_error(unit)
        if fault in ("kill_worker", "kill_loading"):
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "hang":
            threading.Event().wait()  # forever: the driver's health check kills this worker
        raise ValueError(f"unknown injected fault {fault!r}")

    def save(self, state: PackedState | ModelState, path: str) -> tuple[str, int]:
        """Write `state` as a self-contained checkpoint file at `path` (atomically); returns (sha256, bytes)."""
        from framework.engine.checkpoint import write_atomic

        return write_atomic(self_contained(unpack_state(state), self._resolve), path)

    def run(
        self, task: UnitTask, state: PackedState | ModelState | None
    ) -> tuple[PackedState | None, UnitReport]:
        """Run one unit from `state` (None: a fresh config). Returns (new state, packed, or None for eval; report).

        In a gang (`task.workers` has several), this worker trains its own partition (`task.partitions`; a share of
        it where several members have the same one) with the gang's gradients averaged at every optimizer step,
        and reports its own unit; the first member returns the state (which holds every member's partitions in its
        visits), the others None."""
        unit, rank, gang, share, trainable = task.unit, 0, None, (0, 1), None
        if len(task.workers) > 1:
            unit, rank, gang, share = self._gang_place(task)
        start = time.time()
        report = UnitReport(unit=unit, worker=self.worker_id, start=start, end=start)
        try:
            if task.fault is not None and rank == 0:  # (a gang's fault is its first member's)
                self._act_out(task.fault, unit)
            state = unpack_state(state, self.device if self.device.type == "cuda" else None, copy_model=False)
            trainable = self._build(task, state)
            if state is not None:  # the model holds the weights now: keep only what the unit still reads
                state = {"visited": state.get("visited") or {}, "freezing": state.get("freezing")}
            model, optimizer = trainable.model, trainable.optimizer
            data = shard_data(self.data[("train" if unit.kind == TRAIN else "valid", unit.partition)], *share)
            seed_everything(unit_seed(task.seed, unit.config_id, unit.epoch, unit.partition, int(unit.kind == TRAIN),
                                      *share))
            averaging = gang.averaging(optimizer) if gang is not None else None
            comm0 = gang.comm_seconds if gang is not None else 0.0
            # what a train_fn / eval_fn may declare as keyword arguments besides its four positional ones
            extras = {"epoch": unit.epoch, "lr_scheduler": trainable.lr_scheduler, "grad_scaler": trainable.grad_scaler,
                      "gang_size": len(task.workers) if gang is not None else 1}
            if unit.kind == TRAIN and self.freezing is not None:
                model.train()
                controller = self._controller(model, unit, state)
                try:
                    metrics = self.train_fn(model, optimizer, data, task.config, freezing=controller,
                                            **accepted_kwargs(self.train_fn, extras))
                    freezing_state = controller.state_dict()
                finally:
                    controller.close()
            elif unit.kind == TRAIN:
                model.train()
                metrics = self.train_fn(model, optimizer, data, task.config, **accepted_kwargs(self.train_fn, extras))
            if gang is not None:
                gang.finish(optimizer)  # follow the members with batches left, so every member ends alike
                averaging.restore()
                report.comm_s = gang.comm_seconds - comm0
            if unit.kind != TRAIN:
                model.eval()
                with torch.no_grad():
                    metrics = self.eval_fn(model, data, task.config,
                                           **accepted_kwargs(self.eval_fn, {"epoch": unit.epoch}))
            metrics = _check_metrics(metrics, "train_fn" if unit.kind == TRAIN else "eval_fn")
            new_state = None
            if unit.kind == TRAIN:
                # The visit record travels inside the state, so a config proves which partitions it absorbed.
                visited = {e: list(ps) for e, ps in (state or {}).get("visited", {}).items()}
                visited.setdefault(unit.epoch, []).extend(u.partition for u in task.units)  # (a gang's: all)
                # (tensors stay where they are: `pack_state` copies them into the hop's buffer once)
                new_state = {"model": model.state_dict(), **trainable.state_dict(), "visited": visited}
                if self.freezing is not None:
                    new_state["freezing"] = freezing_state
                    self._split_frozen(unit.config_id, model, new_state)
            report.num_examples = metrics.pop("num_examples") if "num_examples" in metrics else data_len(data)
            report.metrics = metrics
            new_state = pack_state(new_state) if rank == 0 else None  # (a gang's members hold the same weights)
            report.state_bytes = state_nbytes(new_state)
        except (GangBrokenError, *self.LOST_STATE_ERRORS):
            raise  # the config's state could not be fetched, or its gang broke: not the user's fault
        except Exception:  # user code failed: report it against the config, keep the worker alive
            new_state, report.error = None, traceback.format_exc()
            if gang is not None and trainable is not None:  # the others are not left waiting for this member
                with contextlib.suppress(Exception):
                    gang.finish(trainable.optimizer)
        report.end = time.time()
        return new_state, report

    def _gang_place(self, task: UnitTask) -> tuple[Unit, int, Any, tuple[int, int]]:
        """This worker's part of a gang's task: (its unit, its rank, the gang (None for eval: no gradients), its
        share of the partition (index, count))."""
        rank = task.workers.index(self.worker_id)
        parts = task.partitions or (task.unit.partition,) * len(task.workers)
        sharers = [i for i, p in enumerate(parts) if p == parts[rank]]
        unit = Unit(task.unit.config_id, task.unit.epoch, parts[rank], task.unit.kind)
        gang = None
        if unit.kind == TRAIN:
            gang = self.__dict__.get("gangs", {}).get(gang_id(task.workers))
            if gang is None:
                raise GangBrokenError(f"worker {self.worker_id} is in no gang of workers {task.workers}")
        return unit, rank, gang, (sharers.index(rank), len(sharers))


def self_contained(state: ModelState | None, resolve: Callable[[Any], dict] = lambda handle: handle) -> ModelState | None:
    """`state` with frozen weights shared between workers (`state["frozen"]`) fetched back into its model: what a
    checkpoint stores. `resolve` turns the shared handle into the weights."""
    if state is None or "frozen" not in state:
        return state
    frozen = resolve(state["frozen"]["weights"])
    return {**{k: v for k, v in state.items() if k != "frozen"}, "model": {**state["model"], **frozen}}


def _check_metrics(metrics: Any, fn_name: str) -> dict[str, float]:
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
