"""`RayBackend`: workers are Ray actors, partitions go through the object store, states hop as object refs.

This is the module of the engine that imports Ray (with `framework.cluster.ray_start`, which starts the Ray a run
uses: `ensure_ray`, re-exported here). It implements `framework.engine._base.Backend`: the driver
starts workers and submits units; `poll` turns finished Ray calls into events (a load that finished is a
`WorkerJoined`, a unit whose actor died a `WorkerLost`, a unit that could not fetch its state a `StateLost`).
A run attached to the local service (`modelhopper up`, `framework.cluster.service`) starts its workers on the
service's warm pool first and gives them back, reset, when it ends.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import itertools
import logging
import os
import signal
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import psutil
import ray
import torch

from framework.cluster import service
from framework.cluster.ray_start import ensure_ray as ensure_ray  # (re-exported: callers start Ray here)
from framework.cluster.spares import SPARES, _job_id
from framework.cluster.spares import release_spare_workers as release_spare_workers  # (re-exported)
from framework.engine._base import (
    Backend,
    Event,
    StateLost,
    UnitDone,
    UnitFailed,
    WorkerJoined,
    WorkerLost,
)
from framework.engine.faults import Fault
from framework.engine.gang import gang_id
from framework.engine.ledger import LEDGER_KEYS, LEDGER_TIMEOUT_S, PROCESS_LEDGER
from framework.engine.state import self_contained, unpack_state
from framework.engine.worker import Worker
from framework.functions import UserFunctions
from framework.options import RunOptions
from framework.scheduling import TRAIN
from framework.scheduling.units import UnitReport, UnitTask
from framework.store.checkpoint import write_later

logger = logging.getLogger(__name__)
_LOST_OBJECT_ERRORS = (ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError)
#: how long `stop_worker` waits for a worker to remove its files before it kills the worker
CLOSE_TIMEOUT_S = 5.0
#: how long a gang's members may take to join its group
GANG_SETUP_TIMEOUT_S = 60.0
#: how long a worker of the service's pool may take to become a run's, or to forget it (one still warming up imports
#: torch first: tens of seconds on a busy machine)
POOL_TIMEOUT_S = 120.0
#: how often (seconds) a run attached to the service asks whether it is going down (`RayBackend.stop_asked`)
ASK_EVERY_S = 1.0
#: the packages whose modules a worker of the pool keeps when it forgets a run (`_user_modules`): ours and the
#: libraries'; every other module a run's functions brought in is dropped, so the next run imports its own
OWN_PACKAGES = ("framework", "automl", "simulators")


class _Pending(NamedTuple):
    """A unit submitted to a worker's actor whose reply has not come yet."""

    ticket: int
    worker: int
    seq: int  # its place in the actor's queue (the actor runs its units in this order)
    state_ref: Any  # the ref of the new state (a tuple of them, one per member, for a pack)
    kind: str


class _GangRun:
    """A gang's unit in flight: its members' replies as they come (by rank), the first member's state."""

    def __init__(self, task: UnitTask, workers: Sequence[int], state_ref: Any) -> None:
        self.task, self.workers, self.state_ref = task, tuple(workers), state_ref
        self.replies: dict[int, UnitReport | BaseException] = {}


class _RayWorker(Worker):
    """`Worker` as a Ray actor; partition entries may be object refs (in-memory data put once by the driver), and
    frozen weights are shared through the object store.

    Units run one at a time in submission order. Each `enqueue` call (one per unit, on a small thread pool) first
    takes the unit's state out of the object store (onto the GPU, on a side stream, for a GPU worker), so the state
    of a queued unit arrives while the unit ahead of it runs, then waits for its turn, and records in the backend's
    start ledger (`framework.engine.ledger`) that it starts before it does. Checkpoints are written on a thread of
    their own (`save_ref`). The driver only passes object refs, wrapped in lists so Ray hands them over
    unresolved.
    """

    LOST_STATE_ERRORS = _LOST_OBJECT_ERRORS

    #: what a worker keeps when it forgets a run (`reset`): how its process started
    _KEEP = ("_threads_at_start", "_torch_defaults", "_modules_at_start", "_path_at_start")

    def __init__(self, *args: Any, ledger: tuple[Any, int] | None = None, **kwargs: Any) -> None:
        if not hasattr(self, "_threads_at_start"):  # (a spare's next run starts from it: `rebind`, `reset`)
            self._threads_at_start = torch.get_num_threads()
            self._torch_defaults = (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
            self._path_at_start = list(sys.path)
        if not args and not kwargs:  # a blank worker of the service's pool: `rebind` makes it a run's
            importlib.import_module("torch._dynamo")  # what `Worker.__init__` imports, paid before a run takes it
            self._modules_at_start = set(sys.modules)
            return
        super().__init__(*args, **kwargs)
        self._ledger = ledger  # (the backend's `StartLedger` (`framework.engine.ledger`), this actor's key in it)
        self._turn = 0  # sequence number of the unit whose turn it is
        self._turns = threading.Condition()
        self._streams = threading.local()  # a CUDA side stream per fetching thread

    def rebind(self, *args: Any, **kwargs: Any) -> bool:
        """Become a worker of another run (a spare it took, see `_Spares`, or a worker of the service's pool): every
        field as a new actor's (the arguments are `__init__`'s), torch's thread count as the process started unless
        the run sets one."""
        torch.set_num_threads(self._threads_at_start)
        self.__init__(*args, **kwargs)
        return True

    def add_code_paths(self, paths: Sequence[str]) -> None:
        """Import the next run's functions as its own workers would (a worker of the pool belongs to the service's
        Ray job, whose code paths are not the run's): the driver's script folder and working directory first on
        `sys.path`. Called before `rebind`, whose arguments are the run's functions."""
        sys.path[:0] = [p for p in paths if p not in sys.path]

    def reset(self) -> None:
        """Forget the run (a worker given back to the service's pool): every field but how the process started
        (data, states, frozen weights, the run's functions and ledger), the activation caches, the modules the run's
        functions came from (`_user_modules`) and the code paths it added; torch's threads, default dtype and
        determinism as the process started. `holds` says what is left."""
        if getattr(self, "_cache_removal", None) is not None:
            self.close()
        for name in [n for n in vars(self) if n not in self._KEEP]:
            delattr(self, name)
        for name in _user_modules(self._modules_at_start):
            del sys.modules[name]
        sys.path[:] = self._path_at_start
        torch.set_num_threads(self._threads_at_start)
        torch.set_default_dtype(self._torch_defaults[0])
        torch.use_deterministic_algorithms(self._torch_defaults[1])
        gc.collect()

    def holds(self) -> dict[str, Any]:
        """What this worker's process holds now: its fields, the torch tensors alive in it (count and bytes), the
        files it has open, torch's threads (and how many it started with), and the modules of a run's functions
        still imported (`_user_modules`)."""
        gc.collect()
        tensors = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
        return {"pid": os.getpid(), "fields": sorted(vars(self)), "tensors": len(tensors),
                "tensor_bytes": sum(t.nelement() * t.element_size() for t in tensors),
                "open_files": sorted(f.path for f in psutil.Process().open_files()),
                "threads": torch.get_num_threads(), "threads_at_start": self._threads_at_start,
                "user_modules": _user_modules(getattr(self, "_modules_at_start", set(sys.modules)))}

    def _fetch(self, boxed: list) -> Any:
        if boxed[0] is None:
            return None
        packed = ray.get(boxed[0])
        if self.device.type != "cuda":
            return unpack_state(packed, copy_model=False)
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            state = unpack_state(packed, self.device, copy_model=False)
        stream.synchronize()  # on the device before the unit's (default) stream reads it
        return state

    @ray.method(concurrency_group="units")
    def enqueue(self, seq: int, task: UnitTask, boxed: list) -> tuple[Any, ...]:
        """Fetch the states behind `boxed` (one per member of `task`; None: a fresh config), wait until units
        `0..seq-1` have run, then run this one: `(new state, report)` for a unit of its own (`Worker.run`),
        `(*new states, reports)` for a pack (`Worker.run_members`)."""
        try:
            states = [self._fetch([b]) for b in boxed]
        except BaseException as e:  # noqa: BLE001 - re-raised in its turn: the unit reports it (a lost state)
            states = e
        with self._turns:
            self._turns.wait_for(lambda: self._turn == seq)
        try:
            self._record_start(seq)
            if isinstance(states, BaseException):
                raise states
            if len(task.members) > 1:
                new_states, reports = self.run_members(task, states)
                return (*new_states, reports)
            return self.run(task, states[0])
        finally:
            with self._turns:
                self._turn += 1
                self._turns.notify_all()

    def _record_start(self, seq: int) -> None:
        """Tell the ledger that unit `seq` starts, and wait until it knows: a crash in the unit cannot undo that."""
        if self._ledger is None:
            return
        ledger, key = self._ledger
        try:
            ray.get(ledger.started.remote(key, seq))
        except ray.exceptions.RayError:  # the ledger is gone: the backend goes by the replies that arrive
            self._ledger = None

    def gang_address(self, gang: str) -> tuple[str, int]:
        """Host the rendezvous of gang `gang` here (its rank 0): this node's address and the store's port."""
        return ray.util.get_node_ip_address(), self.host_gang(gang)

    @ray.method(concurrency_group="save")
    def save_ref(self, boxed: list, path: str) -> tuple[str, int]:
        """Write the state behind `boxed[0]` as a checkpoint file (see `Worker.save`)."""
        return self.save(ray.get(boxed[0]), path)

    def _lost_state_error(self, unit) -> BaseException:
        return ray.exceptions.ObjectLostError(ray.ObjectRef.nil().hex(), None, f"injected fault: {unit}")

    def _publish(self, frozen: dict) -> Any:
        return ray.put(frozen)

    def _resolve(self, handle: Any) -> dict:
        return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle

    def load(
        self, partitions: Mapping[int, tuple[Sequence[Any], Sequence[Any]]], fault: Fault | None = None
    ) -> dict[int, int]:
        resolved = {
            pid: tuple([ray.get(e) if isinstance(e, ray.ObjectRef) else e for e in entries] for entries in pair)
            for pid, pair in partitions.items()
        }
        return super().load(resolved, fault)


def _gang_reports(task: UnitTask, replies: list[UnitReport]) -> tuple[UnitReport, ...]:
    """One report per unit of a gang's task (members that shared a partition's pass as one: their examples
    summed, their metrics example-weighted), each spanning the gang's unit (its members ran as one), an error if
    any member's user code failed."""
    start, end = min(r.start for r in replies), max(r.end for r in replies)
    error = next((r.error for r in replies if r.error is not None), None)
    comm = min(r.comm_s for r in replies)  # the slowest member's: it waited least for the others
    out = []
    for u in task.units:
        mine = [r for r in replies if r.unit == u]
        n = sum(r.num_examples for r in mine)
        metrics = {k: sum(r.metrics.get(k, 0.0) * r.num_examples for r in mine) / max(n, 1) for k in mine[0].metrics}
        out.append(UnitReport(u, mine[0].worker, start, end, metrics, n, sum(r.state_bytes for r in mine),
                              error if error is not None else None, comm_s=comm))
    return tuple(out)


def _user_modules(at_start: set[str]) -> list[str]:
    """The modules imported since the process started (`at_start`) that are neither the standard library's, an
    installed library's, nor ours (`OWN_PACKAGES`): those a run's functions came from (its project's files)."""
    paths = sysconfig.get_paths()
    libraries = tuple({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")} | set(site.getsitepackages()))
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if (name not in at_start and isinstance(file, str) and not file.startswith(libraries)
                and name.split(".")[0] not in OWN_PACKAGES):
            found.append(name)
    return sorted(found)


def check_resources(resources: Mapping[str, float]) -> None:
    """Fail before any work when no worker could ever be placed: the cluster's total of a resource one worker asks
    for is smaller than the request (e.g. `{"GPU": 1}` on a cluster without GPUs, which Ray would wait on forever)."""
    total = ray.cluster_resources()
    for k, v in resources.items():
        if v > 0 and total.get(k, 0.0) < v:
            have = ", ".join(f"{name}={amount:g}" for name, amount in sorted(total.items())
                             if not name.startswith(("node:", "memory", "object_store_memory")))
            raise ValueError(
                f"`worker_resources` asks for {k}={v:g} per worker, but the Ray cluster has {k}="
                f"{total.get(k, 0.0):g} in all ({have}); add a node that has it (ray start --address=... "
                f"--resources / --num-gpus) or lower the request")


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    opts: dict[str, Any] = {"num_cpus": resources.get("CPU", 1), "num_gpus": resources.get("GPU", 0)}
    if custom:
        opts["resources"] = custom
    return opts


#: the unit threads a worker actor has at least (one more than the units it may hold): a run of any `queue_depth` up
#: to this one takes the same spares and pool workers (idle threads cost nothing; units run in submission order
#: whatever the threads)
UNIT_THREADS = 4


def _threads(queue_depth: int) -> int:
    return max(queue_depth, UNIT_THREADS)


def worker_class(queue_depth: int) -> Any:
    """The actor class of a run's workers: a thread for every unit it may hold (at least `UNIT_THREADS`) and one
    spare, one for checkpoints; never restarted by Ray (the driver handles failures)."""
    groups = {"units": _threads(queue_depth) + 1, "save": 1}
    return ray.remote(max_restarts=0, max_task_retries=0, concurrency_groups=groups)(_RayWorker)


def worker_key(resources: Mapping[str, float], queue_depth: int) -> tuple[str, int]:
    """What a worker actor is made with (its resources and thread groups): a spare or a worker of the pool serves
    a run whose workers have the same key (every `queue_depth` up to `UNIT_THREADS` has one)."""
    return repr(sorted(actor_options(resources).items())), _threads(queue_depth)


def code_paths() -> list[str]:
    """Where this driver's workers import the run's functions from (what Ray gives its job's workers): the
    script's folder and the working directory."""
    return list(dict.fromkeys([os.path.abspath(sys.path[0] or os.curdir), os.path.abspath(os.curdir)]))


def materialize(state: Any) -> dict | None:
    """A self-contained copy of a config state (unpacked, frozen weights fetched back in): what a checkpoint
    stores."""
    return self_contained(unpack_state(state), lambda h: ray.get(h) if isinstance(h, ray.ObjectRef) else h)



class RayBackend(Backend):
    """Worker actors on the local or attached Ray cluster (not restarted by Ray: the driver handles failures).

    Args:
        functions: what the workers run (`framework.functions.UserFunctions`).
        resources: Ray resources per worker; a worker with a GPU puts models on it.
        num_threads: torch threads per worker.
        entries: partition -> (train entries, valid entries): data, paths or URIs a worker's `input_fn` loads.
        put_entries: put every entry into the object store once (in-memory data shared by reference).
        queue_depth: units the driver may hold on one worker at once (the actor keeps a thread for each).
        reuse_workers: start workers on the warm pool of the local service this process is attached to
            (`framework.cluster.service`) and give them back when the run ends, or on the actors an earlier run of
            this process left (`_Spares`), leaving this run's to the next; False: new actors, killed at the end.
        worker_options: the other `Worker` keyword arguments (`freezing`, `data_on_device`, `cache_dir`).
    """

    def __init__(
        self,
        functions: UserFunctions,
        resources: Mapping[str, float],
        num_threads: int,
        entries: Mapping[int, tuple[Sequence[Any], Sequence[Any]]],
        put_entries: bool = False,
        queue_depth: int = RunOptions.queue_depth,
        reuse_workers: bool = True,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.functions, self.worker_options = functions, dict(worker_options or {})
        self.resources, self.num_threads = dict(resources), num_threads
        self.queue_depth, self.reuse_workers = queue_depth, reuse_workers
        self._spare_key = worker_key(self.resources, queue_depth)
        self._pool = service.attached_pool()  # the keeper of the local service's pool (None: not attached)
        self._leased: set[int] = set()  # workers whose actor came from the pool (given back at the end)
        self._pool_state: Any = None  # the pool's answer to "are you going down?" while it is on its way
        self._next_ask, self._going_down = 0.0, False
        self._shared_ledger: Any = None  # the service's start ledger (`_service_ledger`)
        self._ganged: set[int] = set()  # workers that joined a gang (never kept as spares)
        if put_entries:
            entries = {p: ([ray.put(e) for e in tr], [ray.put(e) for e in va]) for p, (tr, va) in entries.items()}
        self.entries = dict(entries)
        self._actors: dict[int, Any] = {}
        self._pids: dict[int, int] = {}  # worker -> its process id (for `kill`)
        self._seqs: dict[int, int] = {}  # worker -> sequence number of the last unit submitted to its actor
        self._loads: dict[Any, tuple[int, frozenset[int]]] = {}  # load ref -> (worker, partitions)
        self._units: dict[Any, _Pending] = {}  # report ref -> its unit
        self._tickets = itertools.count()
        self._ledger: Any = None  # the start ledger: the service's, or this process's (`PROCESS_LEDGER`)
        self._keys: dict[int, tuple[str, int]] = {}  # worker -> its actor's key in the ledger
        self._gangs: set[tuple[int, ...]] = set()  # gangs whose group is up (kept while all their workers live)
        self._gang_runs: dict[int, _GangRun] = {}  # ticket -> a gang's unit in flight
        self.gang_setups: list[float] = []  # seconds each gang's group took to set up
        self._orphans: list[Any] = []  # replies of gang members whose unit is over (a member died)

    # ---- workers ------------------------------------------------------------------------------------------------
    def start_worker(self, worker: int, partitions: Iterable[int], fault: Fault | None = None) -> None:
        parts = frozenset(partitions)
        if worker not in self._actors:
            device = "cuda" if self.resources.get("GPU", 0) > 0 else "cpu"
            self._seqs.pop(worker, None)  # a new actor counts its units from 0
            if self._ledger is None:  # (a new actor takes a second to start: the service keeps one warm)
                self._ledger = self._service_ledger() or PROCESS_LEDGER.get()
            key = self._keys[worker] = (_job_id(), next(LEDGER_KEYS))
            kwargs = dict(device=device, num_threads=self.num_threads, ledger=(self._ledger, key),
                          device_fraction=min(1.0, self.resources.get("GPU", 0)) or 1.0, functions=self.functions,
                          **self.worker_options)
            actor = None  # a worker of the service's pool first, else a spare of this process, else a new actor
            if self.reuse_workers and self._pool is not None:
                actor = self._from_pool(worker, kwargs)
            if self.reuse_workers and actor is None:
                actor = self._spare(worker, kwargs)
            if actor is None:  # (none of this run's key is left) the other spares would hold what a new actor needs
                SPARES.release()
            self._actors[worker] = actor or worker_class(self.queue_depth).options(
                **actor_options(self.resources)).remote(worker, **kwargs)
        ref = self._actors[worker].load.remote({p: self.entries[p] for p in parts}, fault)
        self._loads[ref] = (worker, parts)

    @property
    def _caches(self) -> bool:
        """Whether the workers keep activation caches (layer freezing's `cache` option)."""
        return bool((self.worker_options.get("freezing") or {}).get("cache"))

    def _spare(self, worker: int, kwargs: dict[str, Any]) -> Any:
        """A spare actor of this run's key, made `worker` of this run (None: there is none alive)."""
        while (actor := SPARES.take(self._spare_key)) is not None:
            try:
                ray.get(actor.rebind.remote(worker, **kwargs), timeout=LEDGER_TIMEOUT_S)
                return actor
            except Exception:  # noqa: BLE001 - it died, or hangs: the next, or a new actor
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        return None

    def _from_pool(self, worker: int, kwargs: dict[str, Any]) -> Any:
        """A worker of the service's pool of this run's key, made `worker` of this run (None: the pool has none, or
        the one it gave failed; the pool's keeper takes that one back dead when the run ends)."""
        try:
            actor = ray.get(self._pool.take.remote(self._spare_key, _job_id()), timeout=LEDGER_TIMEOUT_S)
        except ray.exceptions.RayError:  # the keeper is gone (the service is going down)
            return None
        if actor is None:
            return None
        try:
            ray.get(actor.add_code_paths.remote(code_paths()), timeout=POOL_TIMEOUT_S)
            ray.get(actor.rebind.remote(worker, **kwargs), timeout=POOL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - it died, or hangs: a new actor of the run's own
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            return None
        self._leased.add(worker)
        return actor

    def _service_ledger(self) -> Any:
        """The start ledger of the service this run is attached to (None: not attached, or the service is gone)."""
        if self._pool is not None and self._shared_ledger is None:
            with contextlib.suppress(ray.exceptions.RayError):
                self._shared_ledger = ray.get(self._pool.ledger.remote(), timeout=LEDGER_TIMEOUT_S)
        return self._shared_ledger

    def _give_back(self, actors: list[Any]) -> None:
        """Reset `actors` (workers of the pool this run may give back, `_can_spare`) and give them back to the
        pool's keeper; the pool's workers this run does not give back (lost, stopped, or not clean) it kills."""
        clean = []
        for actor, ref in [(a, a.reset.remote()) for a in actors]:
            try:
                ray.get(ref, timeout=POOL_TIMEOUT_S)
                clean.append(actor)
            except Exception:  # noqa: BLE001 - dead or stuck: never back in the pool
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        try:
            ray.get(self._pool.give_back.remote(_job_id(), clean), timeout=LEDGER_TIMEOUT_S)
        except ray.exceptions.RayError:  # the keeper is gone: the service is going down, and its workers with it
            for actor in clean:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)

    def stop_asked(self) -> str | None:
        """Why the session should end: the local service this run is attached to is going down (`modelhopper
        down`); asked of the pool's keeper at most every `ASK_EVERY_S`, without waiting for its answer."""
        if self._pool is not None and not self._going_down:
            if self._pool_state is None and time.monotonic() >= self._next_ask:
                self._pool_state, self._next_ask = self._pool.state.remote(), time.monotonic() + ASK_EVERY_S
            if self._pool_state is not None and ray.wait([self._pool_state], timeout=0)[0]:
                ref, self._pool_state = self._pool_state, None
                try:
                    self._going_down = ray.get(ref) != service.UP
                except ray.exceptions.RayError:  # the keeper is gone: so is the service, soon
                    self._going_down = True
        return "the local service is going down (`modelhopper down`)" if self._going_down else None

    def _can_spare(self, worker: int) -> bool:
        """Whether `worker`'s actor may serve the next run: it never joined a gang, keeps no activation cache, and
        has nothing in flight."""
        return (self.reuse_workers and ray.is_initialized() and worker not in self._ganged
                and not self._caches
                and all(u.worker != worker for u in self._units.values())
                and all(w != worker for w, _ in self._loads.values()))

    def stop_worker(self, worker: int) -> None:
        actor = self._actors.pop(worker, None)
        if actor is not None:
            if self._caches:  # a killed actor cannot remove its activation cache
                try:
                    ray.get(actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - dead or stuck: the run removes its caches' folder at its end
                    pass
            ray.kill(actor, no_restart=True)
        self._forget(worker)

    def kill(self, worker: int) -> None:
        try:
            os.kill(self._pids[worker], signal.SIGKILL)
        except (KeyError, ProcessLookupError):
            pass  # already gone: its units report it

    def free_resources(self) -> dict[str, float]:
        """What the cluster has free, counting what this process's spares hold as free: a new worker takes one of
        its key, or kills them first (`start_worker`)."""
        free = dict(ray.available_resources())
        for name, amount in SPARES.held().items():
            free[name] = free.get(name, 0.0) + amount
        return free

    def _forget(self, worker: int) -> None:
        for ref, (w, _) in list(self._loads.items()):
            if w == worker:
                del self._loads[ref]
        for ref, u in list(self._units.items()):
            if u.worker == worker:
                del self._units[ref]
        self._leased.discard(worker)
        key = self._keys.pop(worker, None)
        if key is not None:
            self._ledger.last.remote(key)  # its entry goes
        for gang in [g for g in self._gangs if worker in g]:  # its gangs break up: the others leave them
            self._gangs.discard(gang)
            for w in gang:
                if w in self._actors:
                    self._actors[w].leave_gang.remote(gang_id(gang))

    def _lost(self, worker: int, why: str, unreported: Sequence[_Pending] = (), loading: bool = False) -> WorkerLost:
        """The actor of `worker` died: forget it, and name its unreported units (`unreported` and those still
        pending) that it had started, from the ledger (`WorkerLost.started`; None when the ledger cannot say)."""
        mine = sorted([*unreported, *(u for u in self._units.values() if u.worker == worker)], key=lambda u: u.seq)
        key = self._keys.pop(worker, None)
        started = None
        if key is not None:
            try:
                last = ray.get(self._ledger.last.remote(key), timeout=LEDGER_TIMEOUT_S)
                started = tuple(u.ticket for u in mine if u.seq <= last)
            except ray.exceptions.RayError:
                pass
        self._actors.pop(worker, None)
        self._forget(worker)
        return WorkerLost(time.time(), worker, why, loading=loading, started=started)

    # ---- units --------------------------------------------------------------------------------------------------
    def submit(self, workers: Sequence[int], task: UnitTask, states: Sequence[Any]) -> int:
        """A unit of its own, a gang (every member trains its partition, `_submit_gang`) or a pack on one worker
        (its members run there one after another, `Worker.run_members`: one state ref per member)."""
        if len(workers) > 1 and len(task.members) > 1:
            raise NotImplementedError(f"{type(self).__name__} runs a pack on one worker or a gang of one config, "
                                      f"but was given a pack of {len(task.members)} configs {task.members} on a gang "
                                      f"of workers {tuple(workers)}")
        if len(workers) > 1:
            return self._submit_gang(tuple(workers), task, states[0])
        ticket = next(self._tickets)
        seq = self._seqs[workers[0]] = self._seqs.get(workers[0], -1) + 1
        *state_refs, report_ref = self._actors[workers[0]].enqueue.options(num_returns=len(states) + 1).remote(
            seq, task, list(states))
        state = state_refs[0] if len(state_refs) == 1 else tuple(state_refs)
        self._units[report_ref] = _Pending(ticket, workers[0], seq, state, task.unit.kind)
        return ticket

    def _submit_gang(self, workers: tuple[int, ...], task: UnitTask, state: Any) -> int:
        """Every member queues the unit (each trains its own partition, `Worker.run`); the gang's group is set up
        first if it is not up yet (once per gang, not per unit)."""
        if task.unit.kind == TRAIN and workers not in self._gangs:
            self._form_gang(workers)
        ticket = next(self._tickets)
        for rank, w in enumerate(workers):
            seq = self._seqs[w] = self._seqs.get(w, -1) + 1
            state_ref, report_ref = self._actors[w].enqueue.options(num_returns=2).remote(seq, task, [state])
            if rank == 0:  # the first member's state is the gang's
                self._gang_runs[ticket] = _GangRun(task, workers, state_ref)
            self._units[report_ref] = _Pending(ticket, w, seq, state_ref if rank == 0 else None, task.unit.kind)
        return ticket

    def _form_gang(self, workers: tuple[int, ...]) -> None:
        """Set up the gang's process group: its first worker hosts the rendezvous, every member joins at once
        (gloo on CPU workers, NCCL on GPU ones). A member that is gone leaves the group down: the gang's unit then
        fails on the others (`GangBrokenError`) and the loss of that worker re-queues it."""
        t0, name = time.perf_counter(), gang_id(workers)
        self._ganged.update(workers)
        backend = "nccl" if self.resources.get("GPU", 0) > 0 else "gloo"
        try:
            host, port = ray.get(self._actors[workers[0]].gang_address.remote(name))
            ray.get([self._actors[w].join_gang.remote(name, i, len(workers), port, host, backend)
                     for i, w in enumerate(workers)], timeout=GANG_SETUP_TIMEOUT_S)
        except (ray.exceptions.RayError, KeyError):
            return
        self._gangs.add(workers)
        self.gang_setups.append(time.perf_counter() - t0)

    def _gang_reply(self, unit: _Pending, ref: Any) -> list[Event]:
        """A gang member replied: once every member has, the gang's unit is done (one report per unit, in the
        task's order, all with the gang's span), failed in user code, or lost with a member."""
        run = self._gang_runs.get(unit.ticket)
        if run is None:
            return []
        rank = run.workers.index(unit.worker)
        try:
            run.replies[rank] = ray.get(ref)
        except ray.exceptions.RayActorError as e:  # the gang's unit re-runs once the driver hears of the loss
            self._gang_runs.pop(unit.ticket)
            self._drop_gang_refs(unit.ticket)
            return [self._lost(unit.worker, f"died ({type(e).__name__}) in gang {run.workers}", [unit])]
        except _LOST_OBJECT_ERRORS as e:
            self._gang_runs.pop(unit.ticket)
            self._drop_gang_refs(unit.ticket)
            return [StateLost(time.time(), unit.ticket, run.workers[0], e)]
        except ray.exceptions.RayTaskError as e:  # its group broke (a member died: its loss comes on its own)
            run.replies[rank] = e
        if len(run.replies) < len(run.workers):
            return []
        self._gang_runs.pop(unit.ticket)
        broken = [r for r in run.replies.values() if isinstance(r, BaseException)]
        if broken:  # no member died, yet the group broke (a timeout): the unit fails, and is retried
            self._gangs.discard(run.workers)
            err = f"the gang {run.workers} broke: {broken[0]}"
            reports = tuple(UnitReport(u, run.workers[0], time.time(), time.time(), error=err) for u in run.task.units)
            return [UnitFailed(time.time(), unit.ticket, run.workers[0], reports)]
        reports = _gang_reports(run.task, [run.replies[i] for i in range(len(run.workers))])
        if any(r.error is not None for r in reports):
            return [UnitFailed(time.time(), unit.ticket, run.workers[0], reports)]
        state = run.state_ref if run.task.unit.kind == TRAIN else None
        return [UnitDone(time.time(), unit.ticket, run.workers[0], reports, (state,) * len(reports))]

    def _drop_gang_refs(self, ticket: int) -> None:
        """The other members' replies to a gang's unit that is over: read (and dropped) once they come."""
        for ref, u in list(self._units.items()):
            if u.ticket == ticket:
                del self._units[ref]
                self._orphans.append(ref)

    def _read_orphans(self) -> None:
        done, self._orphans = ray.wait(self._orphans, num_returns=len(self._orphans), timeout=0)
        for ref in done:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(ref)  # (an error nobody reads would be logged as unhandled)

    def poll(self, timeout: float | None) -> list[Event]:
        if self._orphans:
            self._read_orphans()
        deadline = None if timeout is None else time.time() + timeout
        events: list[Event] = []
        while True:
            waitable = list(self._units) + list(self._loads)
            left = None if deadline is None else max(0.0, deadline - time.time())
            step = 0.2 if left is None else min(left, 0.2)
            if waitable:
                ready, rest = ray.wait(waitable, num_returns=1, timeout=step)
            else:
                ready, rest = [], []
                time.sleep(step)
            if ready or (left is not None and left <= 0.2):
                break
        if ready and rest:  # everything else already finished comes along, in one batch
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        # units in submission order: a worker runs its units in order, so when one of them reports its worker dead,
        # the units it ran before that whose replies came finished first and count (else the loss would re-queue a
        # finished unit); loads last, for the same reason: a live worker that dies loading keeps its finished units
        ready.sort(key=lambda r: (r in self._loads, self._units[r].ticket if r in self._units else -1))
        for ref in ready:
            if ref in self._loads:
                events.append(self._joined(ref))
                continue
            if ref not in self._units:  # its worker was reported lost earlier in this batch
                continue
            unit = self._units.pop(ref)
            if unit.ticket in self._gang_runs:
                events += self._gang_reply(unit, ref)
                continue
            try:
                reply: UnitReport | tuple[UnitReport, ...] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                events.append(self._lost(unit.worker, f"died ({type(e).__name__})", [unit]))
                continue
            except _LOST_OBJECT_ERRORS as e:
                events.append(StateLost(time.time(), unit.ticket, unit.worker, e))
                continue
            reports = reply if isinstance(reply, tuple) else (reply,)  # (a pack's: one per member)
            if all(r.error is not None for r in reports):
                events.append(UnitFailed(time.time(), unit.ticket, unit.worker, reports))
            else:
                refs = unit.state_ref if isinstance(unit.state_ref, tuple) else (unit.state_ref,)
                states = refs if unit.kind == TRAIN else (None,) * len(reports)
                events.append(UnitDone(time.time(), unit.ticket, unit.worker, reports, states))
        return events

    def _joined(self, ref: Any) -> Event:
        worker, parts = self._loads.pop(ref)
        actor = self._actors.get(worker)
        try:
            ray.get(ref)
            info: dict[str, Any] = ray.get(actor.data_info.remote())
            self._pids[worker] = info["pid"] = ray.get(actor.pid.remote())
            if self.functions.extract is not None:
                info["extraction"] = ray.get(actor.extraction_stats.remote())
        except ray.exceptions.RayActorError as e:
            return self._lost(worker, repr(e), loading=True)
        return WorkerJoined(time.time(), worker, parts, info)

    # ---- states and time ---------------------------------------------------------------------------------------
    def put(self, state: dict[str, Any] | None) -> Any:
        return None if state is None else ray.put(state)

    def get(self, handle: Any, *, self_contained: bool = False) -> dict[str, Any] | None:
        if handle is None:
            return None
        state = ray.get(handle)
        return materialize(state) if self_contained else unpack_state(state)

    def save(self, handle: Any, path: str, worker: int | None = None) -> Callable[[], tuple[str, int]]:
        """The worker that produced the state starts writing it now, on its own thread (the driver never holds the
        state); if that worker is gone by then, the driver writes it."""
        actor = self._actors.get(worker) if worker is not None else None
        if actor is None:
            return write_later(lambda: self.get(handle, self_contained=True), path)
        ref = actor.save_ref.remote([handle], path)

        def wait() -> tuple[str, int]:
            try:
                return ray.get(ref)
            except ray.exceptions.RayActorError:
                return write_later(lambda: self.get(handle, self_contained=True), path)()

        return wait

    def now(self) -> float:
        return time.time()

    def shutdown(self) -> None:
        back = []  # workers of the service's pool it gives back
        for w in list(self._actors):
            if self._can_spare(w):
                actor = self._actors.pop(w)
                if w in self._leased:
                    back.append(actor)
                else:
                    SPARES.put(self._spare_key, actor, self.resources)
                self._forget(w)
            else:
                self.stop_worker(w)
        if self._pool is not None:
            self._give_back(back)
        self._ledger = None  # (the service's or the process's: it serves the next runs)
