"""The worker actors this process's runs left (spares), kept for its next run: a new actor spends seconds on a process
that imports torch. `RayBackend(reuse_workers=True)` puts and takes them; what needs their CPUs frees them
(`release_spare_workers`): a run that must make a new actor kills them all, and Ray Data work the driver starts
(`PartitionedDataset.from_ray_dataset`) as many as it takes for one CPU to be free. Only Ray here (no torch), so the
data layer may free them too."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import ray

__all__ = ["SPARES", "SPARE_TTL_S", "release_spare_workers"]


def _job_id() -> str:
    """This driver's Ray job (the pool's keeper leases workers to it, and reclaims them when it dies)."""
    return ray.get_runtime_context().get_job_id()


#: how long a worker actor of a run that ended waits for the next run of this process to take it (`_Spares`); then it
#: is killed and its resources are free again
SPARE_TTL_S = 60.0


class _Spares:
    """Worker actors of this process's runs that ended cleanly, kept for its next run: a new actor spends seconds
    on a process that imports torch, which the next run in a notebook or a test session then skips (Ray Tune's
    `reuse_actors`, across runs). A spare is keyed by what its actor was made with (resources and thread groups);
    a run takes those of its key as it starts a worker (`_RayWorker.rebind`: every field as a new actor's), or a
    replacement, or a worker a person added; when none is left and it must make a new actor, it kills the others
    first, so they free the resources that actor needs. Spares a run leaves alone stay for the next (a run of one
    worker after one of three keeps two); a spare no run takes within `SPARE_TTL_S` is killed. Actors that joined a
    gang, kept an activation cache, or had a unit or a load in flight are never kept. Thread-safe (the TTL's timer
    kills from a thread of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[Any, list[Any]] = {}
        self._resources: dict[Any, dict[str, float]] = {}  # key -> the Ray resources one of its actors holds
        self._job: str | None = None  # the Ray job the handles belong to (a new `ray.init` makes them stale)
        self._timer: threading.Timer | None = None

    def _current(self) -> None:
        job = _job_id()
        if job != self._job:
            self._by_key, self._job = {}, job

    def put(self, key: Any, actor: Any, resources: Mapping[str, float]) -> None:
        with self._lock:
            self._current()
            self._by_key.setdefault(key, []).append(actor)
            self._resources[key] = {k: float(v) for k, v in resources.items() if v}
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(SPARE_TTL_S, self.release)
            self._timer.daemon = True
            self._timer.start()

    def take(self, key: Any) -> Any:
        """A spare made with `key` (None: there is none)."""
        with self._lock:
            self._current()
            actors = self._by_key.get(key)
            return actors.pop() if actors else None

    def held(self) -> dict[str, float]:
        """The Ray resources the spares hold: a run has them for its new workers (`RayBackend.start_worker` takes a
        spare of its key, else kills the others before it makes an actor)."""
        with self._lock:
            self._current()
            out: dict[str, float] = {}
            for key, actors in self._by_key.items():
                for name, amount in self._resources.get(key, {}).items():
                    out[name] = out.get(name, 0.0) + amount * len(actors)
            return out

    def release(self, free: Mapping[str, float] | None = None) -> int:
        """Kill spares now (their resources free again): every one, or with `free` only as many as it takes for the
        cluster to have that much free (what Ray reports free now, plus what those killed here held; a spare is
        killed only for a resource it holds that is short). Returns how many were killed."""
        with self._lock:
            if free is None:
                actors = [a for kept in self._by_key.values() for a in kept]
                self._by_key = {}
            else:
                actors = self._enough_for(free)
            if self._timer is not None and not any(self._by_key.values()):
                self._timer.cancel()
                self._timer = None
        if actors and ray.is_initialized():
            for actor in actors:
                with contextlib.suppress(Exception):  # gone already
                    ray.kill(actor, no_restart=True)
        return len(actors)

    def _enough_for(self, free: Mapping[str, float]) -> list[Any]:
        """Take out of the pool the spares to kill so that `free` is free (with the lock held)."""
        self._current()
        have = dict(ray.available_resources()) if ray.is_initialized() else {}
        out = []
        for key, kept in self._by_key.items():
            holds = self._resources.get(key, {})
            while kept and any(have.get(name, 0.0) < amount for name, amount in free.items() if holds.get(name)):
                out.append(kept.pop())
                for name, amount in holds.items():
                    have[name] = have.get(name, 0.0) + amount
        return out


SPARES = _Spares()


def release_spare_workers(free: Mapping[str, float] | None = None) -> int:
    """Kill the worker actors this process keeps from runs that ended (`RayBackend(reuse_workers=True)`, the
    default), freeing their CPUs and GPUs now rather than `SPARE_TTL_S` after the last run. With `free` (Ray
    resources, `{"CPU": 2}`), only as many as it takes for the cluster to have that much free now, for work this
    process cannot hand its spares to (a driver in another process, actors of its own). Returns how many."""
    if free is not None:
        for name, amount in free.items():
            if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not amount >= 0:
                raise ValueError(f"`free` is {dict(free)!r}, but each amount must be a number >= 0 ({name!r})")
    return SPARES.release(free)
