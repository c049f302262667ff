"""The worker pool: which actors are alive, which partitions each has loaded, and workers on their way in.

Workers join asynchronously: `start(worker, partitions)` creates the actor and sends `load`; the driver's `ray.wait`
sees the load finish and calls `joined(ref)`. The same path serves the first start, restarts after a failure, new
workers (elasticity) and re-loading a partition whose only holder died.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping
from typing import Any

import ray

from framework.engine.ray_backend import start_worker


class WorkerPool:
    """Live worker actors and their partitions (Ray objects stay here and in the driver loop, nowhere else)."""

    def __init__(
        self,
        fns: Mapping[str, Any],
        resources: Mapping[str, float],
        num_threads: int,
        entries: Mapping[int, tuple[list[Any], list[Any]]],
    ) -> None:
        self.fns, self.resources, self.num_threads = dict(fns), dict(resources), num_threads
        self.entries = dict(entries)  # partition -> (train entries, valid entries): refs, paths or URIs
        self.actors: dict[int, Any] = {}
        self.holds: dict[int, set[int]] = {}  # live, loaded worker -> partitions
        self.joining: dict[Any, tuple[int, set[int]]] = {}  # load ref -> (worker, partitions)
        self.draining: set[int] = set()
        self.restarts: dict[int, int] = {}
        self.started: set[int] = set()  # every worker id ever started: a new worker never reuses a dead one's id

    # ---- membership -------------------------------------------------------------------------------------------
    def start(self, worker: int, partitions: Iterable[int], fault: str | None = None) -> Any:
        """Start (or restart) `worker` and load `partitions` on it; returns the load ref to wait on. `fault`: an
        injected fault the worker acts out as it loads (`framework.engine.faults.LOAD_ACTIONS`)."""
        parts = set(partitions)
        self.started.add(worker)
        if worker not in self.actors:
            self.actors[worker] = start_worker(worker, self.resources, self.fns, self.num_threads)
        ref = self.actors[worker].load.remote({p: self.entries[p] for p in parts}, fault)
        self.joining[ref] = (worker, parts)
        return ref

    def joined(self, ref: Any) -> tuple[int, set[int]]:
        """A load finished: the worker now holds its partitions. Raises the load's error if it failed."""
        worker, parts = self.joining.pop(ref)
        ray.get(ref)
        self.holds.setdefault(worker, set()).update(parts)
        return worker, parts

    def remove(self, worker: int, kill: bool = True) -> set[int]:
        """Forget a dead, hung or drained worker (killing its actor); returns the partitions it held."""
        actor = self.actors.pop(worker, None)
        if kill and actor is not None:
            ray.kill(actor, no_restart=True)
        for ref, (w, _) in list(self.joining.items()):
            if w == worker:
                del self.joining[ref]
        self.draining.discard(worker)
        return self.holds.pop(worker, set())

    def next_id(self) -> int:
        return max([*self.started, -1]) + 1

    # ---- queries ------------------------------------------------------------------------------------------------
    def availability(self) -> dict[int, list[int]]:
        """partition -> live, loaded, non-draining workers holding it (every known partition, maybe empty)."""
        av: dict[int, list[int]] = {p: [] for p in self.entries}
        for w, parts in sorted(self.holds.items()):
            if w in self.draining:
                continue
            for p in parts:
                av[p].append(w)
        return av

    def incoming(self) -> set[int]:
        """Partitions being loaded right now."""
        return {p for _, parts in self.joining.values() for p in parts}

    def pid(self, worker: int) -> int:
        return ray.get(self.actors[worker].pid.remote())

    def kill_process(self, worker: int) -> None:
        """SIGKILL the worker's process (chaos testing: a real crash, not a polite `ray.kill`)."""
        os.kill(self.pid(worker), signal.SIGKILL)

    def shutdown(self) -> None:
        for w in list(self.actors):
            self.remove(w)
