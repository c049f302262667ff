"""Membership handlers: workers starting, joining and leaving, commands from outside the loop, elastic scale-out.

Every change of the live worker count is told to the procedure (`Procedure.workers_changed`) and logged.
"""

from __future__ import annotations

from collections.abc import Iterable

from framework.driver._state import RunState
from framework.driver.dispatch import Flight
from framework.engine._base import WorkerJoined, WorkerOffered


def start_worker(run: RunState, worker: int, partitions: Iterable[int]) -> None:
    """Start (or restart) `worker` with `partitions`; it joins when the backend reports `WorkerJoined`."""
    parts = sorted(partitions)
    injected = run.faults.on_load(worker)
    for f in injected:
        run.event("fault_injected", action=f.action, worker=worker)
    run.workers.start(worker, parts)
    run.backend.start_worker(worker, parts, fault=injected[0] if injected else None)


def on_joined(run: RunState, ev: WorkerJoined) -> None:
    if ev.worker not in run.workers.loading:
        return  # removed while it loaded
    run.workers.joined(ev.worker, ev.partitions)
    run.workers.info[ev.worker] = dict(ev.info)
    if ev.info.get("fingerprints"):
        run.sources_read(ev.worker, ev.info["fingerprints"])
    if "extraction" in ev.info:
        run.event("features_materialized", worker=ev.worker, **ev.info["extraction"])
    run.dispatch.add_worker(ev.worker, ev.partitions)
    run.event("worker_joined", worker=ev.worker, partitions=sorted(ev.partitions),
              **{k: ev.info[k] for k in ("data_device", "pid") if k in ev.info})
    if run.live_workers is not None:  # after start-up: a restart, a scale-out or a re-load (one line each)
        run.write(f"worker {ev.worker} joined with partitions {sorted(ev.partitions)}")
    count_workers(run)


def count_workers(run: RunState) -> None:
    """Tell the procedure the live worker count whenever it changes (its concurrency follows the pool)."""
    n = len(run.workers.holds)
    if run.live_workers is not None and n != run.live_workers:  # None: the procedure is not bound yet
        run.told_workers(n)
        run.procedure.workers_changed(n * run.config_slots)
        run.event("workers_changed", num_workers=n)


def restart_or_reassign(run: RunState, worker: int, partitions: set[int]) -> None:
    """A worker is gone: start it again while it has restarts left, else re-load its partitions elsewhere."""
    restarts = run.workers.restarts.get(worker, 0)
    if restarts < run.options.max_worker_restarts:
        run.workers.restarts[worker] = restarts + 1
        start_worker(run, worker, partitions)
        run.event("worker_restarting", worker=worker, partitions=sorted(partitions), attempt=restarts + 1)
        run.write(f"worker {worker}: restart {restarts + 1} of {run.options.max_worker_restarts}")
    elif run.options.reassign_partitions:
        ensure_holders(run)


def ensure_holders(run: RunState) -> None:
    """Re-load every partition that no live or incoming worker holds onto the least-loaded live worker."""
    av, incoming = run.workers.availability(), run.workers.incoming()
    live = [w for w in run.workers.holds if w not in run.workers.draining]
    for p, ws in av.items():
        if ws or p in incoming:
            continue
        if not live:
            run.event("waiting_for_holder", partition=p)
            run.write(f"partition {p} has no live worker: waiting for a worker that holds it")
            continue
        target = min(live, key=lambda w: len(run.workers.holds[w]))
        start_worker(run, target, [p])
        run.event("partition_reload", partition=p, worker=target)
        run.write(f"partition {p} lost its last holder: re-loading it on worker {target}")


def end_flight(run: RunState, ticket: int, now: float) -> Flight | None:
    """The one path of a unit that ended on its worker, whatever came of it (done, failed in user code, its state
    lost): its flight lands, so the unit queued behind it starts its hang clock, and a draining worker left with
    nothing leaves. None: the ticket's worker was declared lost meanwhile (its units re-queued)."""
    f = run.dispatch.land(ticket, now)
    if f is not None:
        for w in f.workers:
            finish_drain(run, w)
    return f


def finish_drain(run: RunState, worker: int) -> None:
    """A draining worker with nothing left in flight leaves."""
    if worker in run.workers.draining and not run.dispatch.flights_of(worker):
        run.workers.remove(worker)
        run.backend.stop_worker(worker)
        run.event("worker_drained", worker=worker)
        run.write(f"worker {worker} drained and left")
        count_workers(run)


def add_workers(run: RunState, count: int, partitions: list[int] | None = None,
                worker: int | None = None) -> list[int]:
    """Start `count` new workers (or `worker` itself, when given: a worker that comes back); returns their ids."""
    started = []
    for _ in range(count):
        w = run.workers.next_id() if worker is None else worker
        parts = partitions if partitions is not None else run.workers.least_replicated()
        start_worker(run, w, parts)
        run.event("worker_added", worker=w, partitions=list(parts))
        started.append(w)
    return started


def drain_worker(run: RunState, worker: int) -> None:
    """Give a live worker no new units; it leaves once its units in flight have ended."""
    run.workers.draining.add(worker)
    run.dispatch.drain_worker(worker)
    run.event("worker_draining", worker=worker)
    ensure_holders(run)
    finish_drain(run, worker)


def on_offered(run: RunState, ev: WorkerOffered) -> None:
    """A worker can be started again (a simulated node returned, or joined for the first time)."""
    if ev.worker not in run.workers.holds and ev.worker not in run.workers.loading:
        add_workers(run, 1, list(ev.partitions), ev.worker)


def worker_request(run: RunState) -> dict[str, float]:
    """The resources one worker asks of the cluster: a CPU, and what `worker_resources` adds or overrides."""
    return {"CPU": 1.0, **run.options.worker_resources}


def grow_into_free_resources(run: RunState) -> None:
    """Elastic scale-out: add workers while the backend has room for one and `max_workers` allows (workers still
    loading count as taken)."""
    if run.options.max_workers is None:
        return
    free = run.backend.free_resources()
    need = worker_request(run)
    room = run.options.max_workers - len(run.workers.holds) - len(run.workers.loading)
    while room > 0 and all(free.get(k, 0.0) >= v for k, v in need.items() if v > 0):
        for k, v in need.items():
            free[k] = free.get(k, 0.0) - v
        add_workers(run, 1)
        run.event("autoscale", free={k: free.get(k, 0.0) for k in need})
        run.write(f"scale-out: the cluster has room for another worker ({len(run.workers.holds)} live, "
                  f"max_workers={run.options.max_workers})")
        room -= 1
