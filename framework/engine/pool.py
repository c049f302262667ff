"""The local service's pool of warm workers (`modelhopper up`): `up` starts the service's Ray head
(`framework.cluster.service`) and its keeper, `_PoolKeeper`, a detached actor that holds worker actors of the class
runs use (`framework.engine.ray_backend._RayWorker`), warm, hands them to the runs attached, takes them back clean,
and reclaims those of a driver that died. Apart from `service` (the record, attaching, `down`) so that what
`ensure_ray` imports never imports the workers' module."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any

import ray

from framework.cluster.service import (
    KEEPER,
    NAMESPACE,
    START_TIMEOUT_S,
    STOPPING,
    UP,
    WATCH_S,
    _code_files,
    _connected,
    _ensure_token,
    _locked,
    _start_head,
    _stop_head,
    _write_record,
    live_record,
    status,
)
from framework.engine import ledger, ray_backend

logger = logging.getLogger(__name__)


def up(num_cpus: int | None = None, pool: int | None = None, say: Any = print) -> dict[str, Any]:
    """Start the service (see the module docstring) unless it is up; returns its `status`. `num_cpus`: the head's
    CPUs (None: this machine's); `pool`: warm workers (None: one per CPU). `say`: where progress lines go."""
    for name, value, low in (("num_cpus", num_cpus, 1), ("pool", pool, 0)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise ValueError(f"`{name}` is {value!r}, but must be an int >= {low}")
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        raise ValueError(f"`RAY_AUTH_MODE` is {os.environ['RAY_AUTH_MODE']!r}, but the service takes token "
                         "authentication only (else other users of the machine could run code on it): unset it")
    with _locked():
        record, note = live_record()
        if note:
            say(f"modelhopper: {note}")
        if record is not None:
            say(f"modelhopper: the local service is already up at {record['address']}")
            return status()
        num_cpus = num_cpus or os.cpu_count() or 1
        pool = num_cpus if pool is None else pool
        made = _ensure_token()
        if made:
            say(f"modelhopper: made a Ray token (readable by you only) in {made}")
        record = _start_head(num_cpus, pool)
        _write_record(record)  # before the pool: a failure below leaves a service `down` can stop
        try:
            with _connected(record):
                keeper = _PoolKeeper.options(name=KEEPER, namespace=NAMESPACE, lifetime="detached").remote(pool)
                deadline = time.time() + START_TIMEOUT_S
                while (counts := ray.get(keeper.status.remote()))["warming"] and time.time() < deadline:
                    time.sleep(0.5)
                record["code"] = ray.get(keeper.code_files.remote())
            _write_record(record)
        except BaseException:
            _stop_head()
            raise
    if counts["warming"]:
        say(f"modelhopper: {counts['warming']} of the pool's workers are still warming up")
    say(f"modelhopper: the local service is up at {record['address']} ({num_cpus} CPUs, a pool of {pool} warm "
        "workers): your runs attach to it; `modelhopper down` stops it")
    return status()


# ---- the pool's keeper --------------------------------------------------------------------------------------------
def _actor_id(actor: Any) -> str:
    return actor._actor_id.hex()


@ray.remote(num_cpus=0, max_concurrency=8)
class _PoolKeeper:
    """Hands out the pool's warm workers (`take`), takes them back (`give_back`), and every `WATCH_S` (on a thread
    of its own): reclaims the workers leased to a driver whose Ray job died (killed and replaced, never reused),
    kills idle workers while other actors wait for resources (so an attached run's own actors are placed), and
    tops the pool up to its size while no run is attached. Its state is "up", or "stopping" once `down` asked
    (nothing is handed out then, and attached runs end their sessions). Thread-safe (one lock)."""

    def __init__(self, size: int) -> None:
        from framework.options import RunOptions

        self._rb, self._size, self._state = ray_backend, size, UP
        self._resources, self._queue_depth = {"CPU": 1}, RunOptions.queue_depth  # (a run's defaults)
        self._key = ray_backend.worker_key(self._resources, self._queue_depth)
        self._lock = threading.Lock()
        self._idle: list[Any] = []  # warm workers no run holds, oldest first
        self._warming: dict[Any, Any] = {}  # ref of its pid -> a worker still warming up
        self._pids: dict[str, int] = {}  # actor id -> its process (once warm)
        self._leased: dict[str, tuple[Any, str]] = {}  # actor id -> (actor, the Ray job it is leased to)
        self._runs: dict[str, int] = {}  # Ray jobs attached -> their drivers' pids
        self._reclaimed = 0
        self._waited: set[str] = set()  # actors that were waiting for resources at the last check
        self._ledger = ledger.StartLedger.options(lifetime="detached").remote()  # every attached run's
        self._top_up()
        threading.Thread(target=self._watch, daemon=True, name="pool-keeper").start()

    # -- what drivers call
    def attach(self, job: str, pid: int) -> bool:
        """A driver attaches (`down` waits for it); False: the service is going down, and it may not."""
        with self._lock:
            if self._state == UP:
                self._runs[job] = pid
            return self._state == UP

    def take(self, key: Any, job: str) -> Any:
        """An idle worker made with `key` (`ray_backend.worker_key`), else one of that key still warming up (the
        caller's `rebind` waits for it), leased to `job`; None when there is none, or the service is stopping."""
        with self._lock:
            if self._state != UP or key != self._key:
                return None
            if self._idle:
                actor = self._idle.pop(0)
            elif self._warming:
                actor = self._warming.pop(next(iter(self._warming)))
            else:
                return None
            self._leased[_actor_id(actor)] = (actor, job)
            return actor

    def give_back(self, job: str, actors: list[Any]) -> int:
        """`job`'s run ends: of the workers leased to it, those in `actors` (reset) are idle again, the others are
        killed (lost, or not clean); while stopping, all are. Returns how many are idle again. (`job` stays attached
        until its driver exits: `down` waits for that.)"""
        back = {_actor_id(a) for a in actors}
        unknown = [a for a in actors if _actor_id(a) not in self._pids]  # (taken while still warming up)
        with contextlib.suppress(ray.exceptions.RayError):
            self._pids.update(zip(map(_actor_id, unknown), ray.get([a.pid.remote() for a in unknown])))
        with self._lock:
            mine = [(aid, actor) for aid, (actor, j) in self._leased.items() if j == job]
            kept = 0
            for aid, actor in mine:
                del self._leased[aid]
                if aid in back and self._state == UP:
                    self._idle.append(actor)
                    kept += 1
                else:
                    self._kill(actor)
        return kept

    def state(self) -> str:
        return self._state

    def ledger(self) -> Any:
        """The start ledger attached runs share (`framework.engine.ledger.StartLedger`): warm, unlike one a run
        would make."""
        return self._ledger

    def stop(self) -> dict[str, int]:
        """`down`: hand out nothing more, and tell attached runs to stop (they ask `state`). Returns the runs
        attached (Ray job -> driver pid)."""
        with self._lock:
            self._state = STOPPING
        return self.status()["runs"]

    def status(self) -> dict[str, Any]:
        alive = _alive_jobs()
        with self._lock:
            for job in [j for j in self._runs if j not in alive]:
                del self._runs[job]
            return {"state": self._state, "size": self._size, "idle": len(self._idle),
                    "idle_pids": sorted(self._pids.get(_actor_id(a), -1) for a in self._idle),
                    "leased": len(self._leased), "leased_pids": sorted(self._pids.get(a, -1) for a in self._leased),
                    "warming": len(self._warming), "reclaimed": self._reclaimed, "runs": dict(self._runs)}

    def code_files(self) -> dict[str, list[int]]:
        return _code_files(sys.modules)

    def holds(self) -> list[dict[str, Any]]:
        with self._lock:
            idle = list(self._idle)
        return ray.get([a.holds.remote() for a in idle])

    # -- the watch
    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_S)
            try:
                self._check()
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.exception("the pool's keeper could not check its workers")

    def _check(self) -> None:
        alive = _alive_jobs()
        now_waiting = _waiting_actors()
        waiting, self._waited = now_waiting & self._waited, now_waiting  # (waiting since the last check, too)
        warmed = self._warmed()
        with self._lock:
            self._idle += warmed
            for aid, (actor, job) in list(self._leased.items()):
                if job not in alive:  # its driver died: whatever the worker holds is that run's
                    del self._leased[aid]
                    self._kill(actor)
                    self._reclaimed += 1
            for job in [j for j in self._runs if j not in alive]:
                del self._runs[job]
            ours = {_actor_id(a) for a in self._warming.values()}
            for _ in range(min(len(self._idle), len(waiting - ours))):  # room for actors that wait for resources
                self._kill(self._idle.pop(0))
            if self._state == UP and not self._runs and not self._leased:
                self._top_up()

    def _warmed(self) -> list[Any]:
        """The workers that finished warming up since the last call (those that failed: gone)."""
        with self._lock:
            refs = list(self._warming)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        out = []
        for ref in ready:
            with self._lock:
                actor = self._warming.pop(ref, None)  # (None: `take` handed it out meanwhile)
            if actor is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    self._pids[_actor_id(actor)] = ray.get(ref)
                    out.append(actor)
        return out

    def _top_up(self) -> None:
        """New blank workers until the pool has its size (called holding the lock, or from `__init__`)."""
        for _ in range(self._size - len(self._idle) - len(self._warming) - len(self._leased)):
            actor = self._rb.worker_class(self._queue_depth).options(
                lifetime="detached", **self._rb.actor_options(self._resources)).remote()
            self._warming[actor.pid.remote()] = actor

    def _kill(self, actor: Any) -> None:
        self._pids.pop(_actor_id(actor), None)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


def _alive_jobs() -> set[str]:
    """The Ray jobs whose drivers are alive (the GCS's job table)."""
    from ray._private import state

    return {j["JobID"] for j in state.jobs() if not j["IsDead"]}


def _waiting_actors() -> set[str]:
    """The actors waiting for resources to be placed (the GCS's actor table)."""
    from ray._private import state

    return set(state.state.actor_table(None, actor_state_name="PENDING_CREATION"))
