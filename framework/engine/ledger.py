"""The start ledger: which unit each worker actor started last, kept outside the workers.

An actor tells the ledger as a unit begins and waits until it knows (`framework.engine.ray_backend._RayWorker`), so
the ledger still knows once the actor's process is gone, whatever replies died with it: the backend then names the
units the dead worker was running or had finished, and those it never started (`WorkerLost.started`), instead of
guessing from the replies that arrived.

Ray only, no torch. (Its actor's process imports neither this module nor torch either way: Ray sends the actor's
class by value. Measured: about 2.5 s of CPU per ledger process, what any Ray worker process takes to start.)
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import ray

from framework.cluster.spares import _job_id

#: how long (seconds) a call to a ledger, or to a spare or pooled actor that is being made a run's, may take
LEDGER_TIMEOUT_S = 10.0
#: the numbers of worker actors' keys in a start ledger: unique in the process (the service's ledger is shared by
#: every run attached to it, several of one process among them)
LEDGER_KEYS = itertools.count()


@ray.remote(num_cpus=0)
class StartLedger:
    """The unit each worker actor started last (see the module docstring). This process's (`PROCESS_LEDGER`, which
    its runs share), or (attached to the local service) the service's, which every attached run shares: an actor's
    key is (its run's Ray job, a number)."""

    def __init__(self) -> None:
        self._last: dict[Any, int] = {}  # actor key -> sequence number of the unit it started last (popped by `last`)

    def started(self, key: Any, seq: int) -> None:
        self._last[key] = seq

    def last(self, key: Any) -> int:
        """The sequence number of the unit actor `key` started last (-1: none); asked once, when it is gone."""
        return self._last.pop(key, -1)


class _ProcessLedger:
    """The start ledger of this process's runs (those not attached to the service, which keeps its own): made by
    the first run of a Ray job and shared by the next ones (keys are unique in the process), instead of a new actor
    process per run. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: str | None = None
        self._ledger: Any = None

    def get(self) -> Any:
        with self._lock:
            job = _job_id()
            if self._ledger is not None and job == self._job:
                try:  # (it may have died with a node; then a new one)
                    ray.get(self._ledger.last.remote(None), timeout=LEDGER_TIMEOUT_S)
                    return self._ledger
                except ray.exceptions.RayError:
                    pass
            self._job, self._ledger = job, StartLedger.remote()
            return self._ledger


PROCESS_LEDGER = _ProcessLedger()
