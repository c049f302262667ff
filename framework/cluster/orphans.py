"""The Ray processes an embedded Ray leaves behind when its driver is killed: recorded at start, stopped next time.

A driver that starts a local Ray of its own (`framework.cluster.ray_start.ensure_ray`) writes a record of the
processes that start brought up (the pid and start time of each, and of the driver) to `records_dir()`, and removes
it when it exits normally, after Ray's own shutdown. A driver killed with SIGKILL cannot: Ray's dashboard and runtime
agents outlive it (re-parented to init, holding memory and ports). The next start on the machine (`reap()`) reads
every record whose driver is gone and stops what it names, children included. A process is only ever stopped when it
still has the recorded start time and belongs to this user, so a pid the system gave to another process since is
never touched; a record made on another host (a home directory shared over the network) is left to that host. Left
alone, the agents of a killed driver's Ray (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) exit by themselves about
a minute later; `reap()` also cleans up without starting a run (the command line's way). No Ray import: this is
process bookkeeping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
from collections.abc import Iterable

import psutil

__all__ = ["forget", "reap", "record", "records_dir"]

#: seconds a reaped process gets to exit after SIGTERM before it is SIGKILLed
TERM_GRACE_S = 3.0


def records_dir() -> str:
    """Where records live: `$XDG_STATE_HOME/modelhopper/ray`, else `~/.local/state/modelhopper/ray`."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "modelhopper", "ray")


def _identity(proc: psutil.Process) -> list[float] | None:
    try:
        return [proc.pid, proc.create_time()]
    except psutil.Error:
        return None


def _record_path(pid: int) -> str:
    return os.path.join(records_dir(), f"driver-{pid}.json")


def record(since: float) -> str:
    """Record the children (recursively) this process started at or after `since` (`time.time()` before Ray
    started): what a local `ray.init` brought up. Returns the record's path (0600, written atomically)."""
    me = psutil.Process()
    started = [i for p in me.children(recursive=True) if (i := _identity(p)) is not None and i[1] >= since - 1.0]
    body = {"driver": _identity(me), "processes": started, "host": socket.gethostname()}
    os.makedirs(records_dir(), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=records_dir(), prefix=".driver-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
        json.dump(body, f)
    os.replace(tmp, _record_path(me.pid))
    return _record_path(me.pid)


def forget() -> None:
    """Remove this process's record (its Ray has shut down)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(_record_path(os.getpid()))


def _alive(identity: object) -> psutil.Process | None:
    """The process `identity` ([pid, start time]) names, if it still runs, as this user, with that start time."""
    if not (isinstance(identity, list) and len(identity) == 2 and isinstance(identity[0], int)
            and isinstance(identity[1], (int, float))):
        return None
    try:
        proc = psutil.Process(identity[0])
        if abs(proc.create_time() - identity[1]) > 0.01 or proc.uids().real != os.getuid():
            return None
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def reap(dry_run: bool = False) -> list[int]:
    """Stop the processes of every record (of this host) whose driver no longer runs (SIGTERM, then SIGKILL after
    `TERM_GRACE_S`), remove those records, and return the pids stopped, sorted. A record that cannot be read is
    removed. `dry_run`: stop and remove nothing, only return the pids that would be stopped (a caller may name them
    first: `psutil.Process(pid).name()`)."""
    try:
        names = [n for n in os.listdir(records_dir()) if n.startswith("driver-") and n.endswith(".json")]
    except OSError:
        return []
    victims: dict[int, psutil.Process] = {}
    for name in names:
        path = os.path.join(records_dir(), name)
        try:
            with open(path) as f:
                body = json.load(f)
            driver, listed = body["driver"], body["processes"]
            assert isinstance(listed, list)
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            if not dry_run:
                with contextlib.suppress(OSError):
                    os.remove(path)
            continue
        if body.get("host", socket.gethostname()) != socket.gethostname() or _alive(driver) is not None:
            continue  # another host's record (its pids mean nothing here), or a driver that still runs its Ray
        for identity in listed:
            proc = _alive(identity)
            if proc is None:
                continue
            add_tree(victims, proc)  # with Ray's workers, started after the record was made
        if not dry_run:
            with contextlib.suppress(OSError):
                os.remove(path)
    victims.pop(os.getpid(), None)
    if dry_run:
        return sorted(victims)
    terminate(victims.values())
    return sorted(victims)


def add_tree(victims: dict[int, psutil.Process], proc: psutil.Process) -> None:
    """Add `proc` and its children (recursively) to `victims` (pid -> process)."""
    with contextlib.suppress(psutil.Error):
        for child in proc.children(recursive=True):
            victims.setdefault(child.pid, child)
    victims.setdefault(proc.pid, proc)


def terminate(procs: Iterable[psutil.Process], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM each of `procs`, then SIGKILL those still running after `grace_s`; waits for them."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, left = psutil.wait_procs(procs, timeout=grace_s)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=grace_s)
