"""A MOP worker: holds its partitions in memory and runs training/eval units on whatever config hops in.

`Worker` is plain Python so `replay` can run it in-process; the engine wraps it with `ray.remote` as an actor. What
it holds lives here (partitions, placed on its device when they fit; features that `extract` made near the data;
activation caches and the frozen weights of layer freezing); how a unit runs is `framework.engine.runner`, the state
format `framework.engine.state`, the step-level training loop `framework.engine.steps`.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from framework.data import concat_data, data_len, tensor_bytes
from framework.engine.extraction import extract_features
from framework.engine.faults import DIE, HANG, LOSE_STATE, RAISE, STRETCH, Fault, InjectedFault
from framework.engine.frozen import FrozenLayers
from framework.engine.gang import GangMember
from framework.engine.runner import run_members, run_unit
from framework.engine.state import ModelState, PackedState, map_leaves, self_contained, unpack_state
from framework.engine.steps import StepLoop, device_of
from framework.functions import UserFunctions
from framework.scheduling.units import EVAL, TRAIN, Unit, UnitReport, UnitTask
from framework.sources import Source

#: the prefix of a worker's activation-cache folder (layer freezing with `cache=True`)
CACHE_PREFIX = "modelhopper-w"
#: the share of its GPU's memory a worker's partitions may take there by default (`data_on_device=None`)
DEVICE_DATA_SHARE = 0.25


class Worker(GangMember, FrozenLayers):
    """Runs units on the partitions it holds. Failures in user code come back as `UnitReport.error`.

    What it runs is `functions` (a `framework.functions.UserFunctions`): training and evaluation run the user's
    `train_fn`/`eval_fn`, or, given a `step_fn` (and `eval_step`), the engine's loop around it
    (`framework.engine.steps.StepLoop`) for whichever of the two is not given.

    `data_on_device`: where the partitions live on a GPU worker. None (the default): on the device when all of this
    worker's partitions fit in `DEVICE_DATA_SHARE` of the memory of its share of the GPU (`device_fraction`), else
    in host memory, each batch copied to the device as it is used. True: on the device. False: in host memory.

    With layer freezing and `cache=True`, the worker keeps activation caches in a folder `modelhopper-w<id>-*`, made
    on first use under `cache_dir` (default: the system's temporary folder). `close()` removes it; so does the
    worker's garbage collection or its process's normal exit. A worker killed outright cannot: a run gives its
    workers a `cache_dir` of its own and removes that when it ends.
    """

    def __init__(
        self,
        worker_id: int,
        functions: UserFunctions,
        device: str = "cpu",
        num_threads: int | None = None,
        freezing: Mapping[str, Any] | None = None,
        data_on_device: bool | None = None,
        cache_dir: str | None = None,
        device_fraction: float = 1.0,
    ) -> None:
        self.worker_id, self.functions = worker_id, functions
        self.data_on_device, self.device_fraction = data_on_device, device_fraction
        f = functions
        steps = StepLoop(f.step_fn, f.eval_step) if f.step_fn is not None or f.eval_step is not None else None
        self.model_fn = f.model_fn
        self.train_fn = f.train_fn if f.train_fn is not None else steps.train
        self.step_fn = f.step_fn if f.train_fn is None else None  # (what a fused pack runs: `runner.run_members`)
        self.eval_fn = f.eval_fn if f.eval_fn is not None else steps.evaluate
        #: what user code the metrics of a unit of each kind came from (named in errors)
        self.fn_names = {TRAIN: f.train_name, EVAL: f.eval_name}
        # torch imports its compiler stack lazily on the first optimizer construction (~1-2 s): pay it at start-up,
        # in parallel with the other workers, not inside the first (timed) unit.
        import torch._dynamo  # noqa: F401
        self.device = torch.device(device)
        if num_threads:
            torch.set_num_threads(num_threads)
        self.data: dict[tuple[str, int], Any] = {}
        self.fingerprints: dict[str, dict[str, Any]] = {}  # "split/partition/entry" -> what its source read
        self.freezing = dict(freezing) if freezing is not None else None
        # (config, generation) -> frozen weights this worker holds (received or published), and their handle
        self._frozen: dict[tuple[int, int], tuple[dict[str, torch.Tensor], Any]] = {}
        self._cache_parent = cache_dir
        self._cache_root: str | None = None  # made on first use (`_cache_folder`)
        self._cache_removal: weakref.finalize | None = None
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
        self, partitions: Mapping[int, tuple[Sequence[Any], Sequence[Any]]], fault: Fault | None = None
    ) -> dict[int, int]:
        """Load partitions `{id: (train_entries, valid_entries)}`; several entries are concatenated into one.

        An entry that is a `framework.sources.Source` is read here by its `read()` (`input_fn` is not called for
        it); any other entry is data itself, or what `input_fn(entry)` makes of it. Returns the number of training
        examples per partition. `fault`: an injected fault to act out first.
        """
        if fault is not None:
            self.act_out(fault, None)
        input_fn, extract = self.functions.input_fn, self.functions.extract
        if extract is not None:  # `extraction_stats` describes the latest load
            self.extraction = {"seconds": 0.0, "bytes": 0, "records": 0, "partitions": []}
        for pid, (train_entries, valid_entries) in partitions.items():
            for split, entries in (("train", train_entries), ("valid", valid_entries)):
                parts = [e.read() if isinstance(e, Source) else input_fn(e) if input_fn is not None else e
                         for e in entries]
                for i, e in enumerate(entries):  # what each source read, for the driver to record or compare
                    if isinstance(e, Source):
                        self.fingerprints[f"{split}/{pid}/{i}"] = e.fingerprint()
                data = concat_data(parts)
                if extract is not None:
                    data = extract_features(extract, data, self.device, self.extraction)
                self.data[(split, pid)] = self._place(data)
            if extract is not None:
                self.extraction["partitions"].append(pid)
        return {pid: data_len(self.data[("train", pid)]) for pid in partitions}

    def _place(self, data: Any) -> Any:
        """`data` on the worker's device where `data_on_device` says so (once per load, not once per batch)."""
        if self.device.type == "cpu" or self.data_on_device is False:
            return data
        if self.data_on_device is None:  # on a GPU, when it fits in the worker's share of the memory
            if self.device.type != "cuda":
                return data
            budget = DEVICE_DATA_SHARE * self.device_fraction * torch.cuda.get_device_properties(self.device).total_memory
            held = sum(tensor_bytes(d) for d in self.data.values() if device_of(d).type == "cuda")
            if held + tensor_bytes(data) > budget:
                return data
        return map_leaves(data, lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t)

    def extraction_stats(self) -> dict[str, Any]:
        """Time, bytes and records of the features this worker materialized in its latest `load`."""
        return dict(self.extraction, partitions=list(self.extraction["partitions"]))

    @property
    def data_placed(self) -> dict[tuple[str, int], str]:
        """Where each partition this worker holds lives, by (split, partition): "cpu", "cuda:0", ..."""
        return {k: str(device_of(d)) for k, d in self.data.items()}

    def data_nbytes(self) -> int:
        """Bytes of in-memory data this worker holds (tensors and arrays, dicts of them from `extract` included)."""
        return sum(tensor_bytes(d) for d in self.data.values())

    def data_info(self) -> dict[str, Any]:
        """What a worker that joined reports: the bytes of data it holds and where they live (e.g. "cuda:0", "cpu",
        or "cpu+cuda:0" when only some partitions fit on the device), and the fingerprints of the sources it read
        (by "split/partition/entry")."""
        info = {"data_bytes": self.data_nbytes(), "data_device": "+".join(sorted(set(self.data_placed.values())))}
        if self.fingerprints:
            info["fingerprints"] = dict(self.fingerprints)  # (`framework.sources.Source.fingerprint`, by entry)
        return info

    def pid(self) -> int:
        return os.getpid()

    # ---- units ------------------------------------------------------------------------------------------------
    def run(self, task: UnitTask, state: PackedState | ModelState | None) -> tuple[PackedState | None, UnitReport]:
        """Run one member's unit from `state` (None: a fresh config); see `framework.engine.runner.run_unit`."""
        return run_unit(self, task, state)

    def run_members(self, task: UnitTask, states: Sequence[PackedState | ModelState | None]
                    ) -> tuple[tuple[PackedState | None, ...], tuple[UnitReport, ...]]:
        """Run every member of an assignment (a pack: fused, or one after another); a state and a report per member."""
        return run_members(self, task, states)

    #: errors that mean a state object is gone (set by the Ray subclass); they propagate to the driver
    LOST_STATE_ERRORS: tuple[type[BaseException], ...] = ()

    def _lost_state_error(self, unit: Unit) -> BaseException:
        """The error a worker meets when a config's state object is gone (the Ray subclass raises Ray's own)."""
        return LookupError(f"the state object of {unit} is lost")

    def act_out(self, fault: Fault, unit: Unit | None) -> None:
        """Act out an injected fault (`framework.engine.faults`) as a unit (or a load, `unit` None) starts: the one
        place a worker maps each `FaultKind.effect` to what it does."""
        effect = fault.spec.effect
        if effect == RAISE:
            raise InjectedFault(f"injected fault in {unit}")
        if effect == LOSE_STATE:
            raise self._lost_state_error(unit)
        if effect == DIE:
            os.kill(os.getpid(), signal.SIGKILL)
        if effect == HANG:
            threading.Event().wait()  # forever: the driver's health check kills this worker
        if effect == STRETCH:
            time.sleep(fault.seconds)  # then the unit runs as usual
            return
        raise ValueError(f"injected fault {fault.action!r} has effect {effect!r}, which a worker cannot act out")

    def save(self, state: PackedState | ModelState, path: str) -> tuple[str, int]:
        """Write `state` as a self-contained checkpoint file at `path` (atomically); returns (sha256, bytes)."""
        from framework.store.checkpoint import write_atomic

        return write_atomic(self_contained(unpack_state(state), self._resolve), path)

