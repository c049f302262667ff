"""The warm local service (`modelhopper up` / `down`): a Ray of this user's that outlives runs, and a pool of warm
workers that runs attach to, so a run's first unit starts in seconds instead of after a cold start.

`up` (`framework.engine.pool.up`) starts a Ray head as a daemon (`ray start --head` on 127.0.0.1, a free port, no dashboard, token
authentication, a temp dir of its own) and records it in `service_dir()` (a file only this user can read: its
address, temp dir, the head's processes, uid, Python, start time, pool size). Then a small detached keeper actor
(`framework.engine.pool._PoolKeeper`, no CPU) makes the pool: detached worker actors of the class runs use
(`framework.engine.ray_backend._RayWorker`), made blank, with torch imported. A run that is told of no cluster
(`framework.cluster.ray_start.ensure_ray`) attaches to the service when this user's record names a live one
(`attach`); its backend takes the pool's workers of its key (`_PoolKeeper.take`), makes them its own
(`_RayWorker.rebind`), and at its end resets and gives back those it may (`_PoolKeeper.give_back`). Every
`WATCH_S` the keeper reclaims the workers leased to a driver whose Ray job died (killed, never reused, and replaced
by fresh ones), frees idle workers for actors waiting for resources, and tops the pool up while no run is
attached. `down` puts the keeper in "stopping" (an attached run ends its session as a spent time budget does:
cleanly, resumable), waits for attached runs, then stops the head's processes (those the record names, found by
the temp dir in their command lines, and their children) and removes the record. A record whose processes are gone
is stale: `up`, `down`, `status` and `attach` remove it.

Only this module's record counts: a cluster someone else (or another user) started is never adopted. No torch here
(the command line imports this module); the keeper imports the worker class in its own process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psutil
import ray

from framework.cluster import orphans

__all__ = ["attach", "attached_pool", "down", "live_record", "pool_holds", "service_dir", "status"]

logger = logging.getLogger(__name__)

#: the Ray namespace of the keeper (and of the processes attached to the service)
NAMESPACE = "modelhopper"
#: the keeper's actor name
KEEPER = "modelhopper-pool"
#: the keeper's states: runs attach and take workers; `down` asked attached runs to stop
UP, STOPPING = "up", "stopping"
#: seconds between the keeper's checks of drivers' jobs, waiting actors and the pool's size
WATCH_S = 2.0
#: seconds `down` gives the head's processes after SIGTERM before SIGKILL
TERM_GRACE_S = 5.0
#: seconds `up` waits for `ray start` and for the pool to warm up
START_TIMEOUT_S = 300.0
#: the longest temp dir Ray takes: its sockets (`<temp>/session_<date>_<pid>/sockets/plasma_store`) must fit in
#: an AF_UNIX path of 107 bytes
MAX_TEMP_DIR = 44
_RECORD = "service.json"
#: the head's processes that must run for the service to be up
ESSENTIAL = ("gcs_server", "raylet")
#: the GCS address of the service `attach` attached this process to (None: it did not)
_attached: str | None = None


# ---- the record ---------------------------------------------------------------------------------------------------
def service_dir() -> str:
    """Where the service's record lives: `$MODELHOPPER_SERVICE_DIR`, else `modelhopper/service` in
    `$XDG_STATE_HOME` (default `~/.local/state`), beside `modelhopper cleanup`'s records."""
    if os.environ.get("MODELHOPPER_SERVICE_DIR"):
        return os.path.abspath(os.environ["MODELHOPPER_SERVICE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "modelhopper", "service")


def _temp_dir() -> str:
    """Ray's temp dir for the service: `ray` in `service_dir()`, or (a path too long for Ray's sockets) a folder of
    this user's in the system's temp dir named after it."""
    inside = os.path.join(service_dir(), "ray")
    if len(inside) <= MAX_TEMP_DIR:
        return inside
    digest = hashlib.sha256(service_dir().encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"modelhopper-{os.getuid()}-{digest}")


def _record_path() -> str:
    return os.path.join(service_dir(), _RECORD)


def _read_record() -> dict[str, Any] | None:
    """The record as written (None: there is none; a record that cannot be read, or names another temp dir than
    this folder's, is removed), if it is this user's (its file and its `uid`). (What it names is stopped and
    removed by the temp dir: only ever this folder's.)"""
    path = _record_path()
    try:
        with open(path) as f:
            owner = os.fstat(f.fileno()).st_uid
            record = json.load(f)
        assert isinstance(record, dict) and isinstance(record["processes"], list)
        assert record["temp_dir"] == _temp_dir()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        with contextlib.suppress(OSError):
            os.remove(path)
        return None
    return record if owner == os.getuid() and record.get("uid") == os.getuid() else None


def _write_record(record: dict[str, Any]) -> None:
    os.makedirs(service_dir(), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=service_dir(), prefix=".service-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
        json.dump(record, f, indent=1)
    os.replace(tmp, _record_path())


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One `up` or `down` at a time (of this service dir)."""
    os.makedirs(service_dir(), mode=0o700, exist_ok=True)
    with open(os.path.join(service_dir(), ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _names(args: list[str], temp_dir: str) -> bool:
    """Whether a command line (`args`) names `temp_dir` or a path in it."""
    return any(a.endswith(temp_dir) or temp_dir + os.sep in a for a in args)


def _head_processes(temp_dir: str) -> list[psutil.Process]:
    """This user's processes whose command line names `temp_dir`: the head's (its GCS, raylet, log monitor, ...)."""
    found = []
    for proc in psutil.process_iter(["uids", "cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if proc.info["uids"].real == os.getuid() and _names(proc.info["cmdline"] or [], temp_dir):
                found.append(proc)
    return found


def _alive(record: dict[str, Any]) -> bool:
    """Whether the head's GCS and raylet the record names run: same pid and start time, this user's, `temp_dir` in
    the command line (Ray's other processes may come and go)."""
    essential = [(pid, started) for pid, started, name in record["processes"] if name in ESSENTIAL]
    for pid, started in essential:
        try:
            proc = psutil.Process(pid)
            if (abs(proc.create_time() - started) > 0.01 or proc.uids().real != os.getuid()
                    or proc.status() == psutil.STATUS_ZOMBIE
                    or not _names(proc.cmdline(), record["temp_dir"])):
                return False
        except psutil.Error:
            return False
    return {name for _, _, name in record["processes"]} >= set(ESSENTIAL)


def live_record() -> tuple[dict[str, Any] | None, str | None]:
    """This user's service record when its processes all run, and a note when a stale one was removed (its
    processes gone: what is left of them is stopped)."""
    record = _read_record()
    if record is None or record.get("host") != socket.gethostname():  # (another host's: its pids mean nothing here)
        return None, None
    try:
        if _alive(record):
            return record, None
    except (TypeError, ValueError, KeyError):
        pass
    _stop_head()
    return None, f"removed the record of a service that is gone (was at {record.get('address')})"


def _stop_head() -> int:
    """Stop what runs of the service: the processes with its temp dir in their command line and their children
    (its workers, Ray's agents); SIGTERM, then SIGKILL after `TERM_GRACE_S`. Removes the record and the temp dir.
    Returns how many processes were stopped."""
    temp_dir = _temp_dir()  # (the record's: `_read_record`)
    victims: dict[int, psutil.Process] = {}
    for proc in _head_processes(temp_dir):
        orphans.add_tree(victims, proc)
    victims.pop(os.getpid(), None)
    orphans.terminate(victims.values(), TERM_GRACE_S)
    with contextlib.suppress(OSError):
        os.remove(_record_path())
    shutil.rmtree(temp_dir, ignore_errors=True)
    return len(victims)


# ---- what a driver must share with the service -------------------------------------------------------------------
def _token_digest() -> str | None:
    """sha256 of the Ray token this process would send (`$RAY_AUTH_TOKEN`, else the file `$RAY_AUTH_TOKEN_PATH`
    names, else `~/.ray/auth_token`); None: it has none."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token:
        path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
        try:
            with open(path) as f:
                token = f.read()
        except OSError:
            return None
    return hashlib.sha256(token.strip().encode()).hexdigest()


def _ensure_token() -> str | None:
    """Make the Ray token `ray start` will take when this user has none (a new random one, readable by this user
    only, where Ray looks for it); returns its path, or None when there was one already."""
    if _token_digest() is not None:
        return None
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    return path


def _token_auth() -> None:
    """Send the token to the service: Ray's token mode on in this process (as Ray's own local start turns it on,
    without its warning) unless `RAY_AUTH_MODE` says otherwise (then connecting fails, and says why)."""
    if os.environ.get("RAY_AUTH_MODE") is None:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _code_files(modules: dict[str, Any]) -> dict[str, list[int]]:
    """(size, mtime) of the source file of each of our modules in `modules` (`sys.modules`): what the pool's
    workers run, which a later edit would leave them running stale."""
    files = {getattr(m, "__file__", None) for name, m in list(modules.items())
             if name.split(".")[0] in ("framework", "automl", "simulators")}
    return {f: stat for f in files if isinstance(f, str) and (stat := _stat(f)) is not None}


def _unusable(record: dict[str, Any], min_cpus: float) -> str | None:
    """Why this process cannot run on the service (None: it can): another Python, too few CPUs, another token, or
    our code changed since the pool's workers imported it."""
    if record.get("python") != sys.executable:
        return f"it runs {record.get('python')}, this process {sys.executable}"
    if float(record.get("num_cpus", 0)) < min_cpus:
        return f"it has {record.get('num_cpus')} CPUs, the run needs {min_cpus:g}"
    if record.get("token") != _token_digest():
        return "it takes another Ray token than this process holds ($RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH)"
    changed = [f for f, stat in (record.get("code") or {}).items() if _stat(f) != stat]
    if changed:
        return (f"{len(changed)} of modelhopper's files changed since it started ({os.path.basename(changed[0])}, "
                "...): `modelhopper down` and `modelhopper up` to load them")
    return None


# ---- a driver attaches --------------------------------------------------------------------------------------------
def attach(min_cpus: float = 1.0) -> str | None:
    """Attach this process to the service when this user's record names a live one it can use (`_unusable`):
    `ray.init` to it, tell the keeper (`down` waits for this process), and say so in one line on stderr. Returns
    the service's GCS address, or None (no service; or a line on stderr says why not, and the caller starts a Ray
    of its own)."""
    global _attached
    record, _ = live_record()
    if record is None:
        return None
    address = record["address"]
    why = _unusable(record, min_cpus)
    if why is None:
        try:
            _token_auth()
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=True)
            keeper = ray.get_actor(KEEPER, namespace=NAMESPACE)
            if not ray.get(keeper.attach.remote(ray.get_runtime_context().get_job_id(), os.getpid()), timeout=60):
                raise RuntimeError("it is going down (`modelhopper down`)")
        except Exception as e:  # noqa: BLE001 - the service went away, or refused us: the run starts its own Ray
            if ray.is_initialized():
                ray.shutdown()
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if why is not None:
        print(f"modelhopper: not attached to the local service at {address} ({why}); starting this run's own Ray",
              file=sys.stderr, flush=True)
        return None
    _attached = ray._private.worker._global_node.gcs_address
    print(f"modelhopper: attached to the local service at {address} (`modelhopper down` stops it)",
          file=sys.stderr, flush=True)
    return _attached


def attached_pool() -> Any:
    """The pool's keeper when this process is attached to the service (and still connected to it), else None."""
    node = getattr(ray._private.worker, "_global_node", None)
    if _attached is None or not ray.is_initialized() or node is None or node.gcs_address != _attached:
        return None
    try:
        return ray.get_actor(KEEPER, namespace=NAMESPACE)
    except ValueError:  # gone: the service is going down
        return None


# ---- up, down, status ---------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _connected(record: dict[str, Any]) -> Iterator[None]:
    """This (command-line) process connected to the service while the block runs."""
    _token_auth()
    ray.init(address=record["address"], namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def _start_head(num_cpus: int, pool: int) -> dict[str, Any]:
    """`ray start --head` for the service (its own temp dir and ports, token authentication); its record."""
    temp_dir, port = _temp_dir(), _free_port()
    os.makedirs(temp_dir, mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "token"
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    started = time.time()
    done = subprocess.run(
        [ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp_dir}",
         f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats",
         f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
         f"--ray-client-server-port={_free_port()}"],
        env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    record = {"address": f"127.0.0.1:{port}", "temp_dir": temp_dir, "uid": os.getuid(),
              "host": socket.gethostname(), "python": sys.executable, "start_time": started,
              "num_cpus": num_cpus, "pool": pool, "token": _token_digest(),
              "processes": [[p.pid, p.create_time(), p.name()] for p in _head_processes(temp_dir)]}
    if done.returncode != 0:
        _stop_head()
        raise RuntimeError(f"`ray start --head` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return record


def down(timeout_s: float = 60.0, say: Any = print) -> bool:
    """Stop the service: attached runs are told to stop (they end their sessions cleanly, resumable) and get
    `timeout_s` seconds to end, then the head's processes are stopped and the record removed. Returns whether
    it was up."""
    if not (isinstance(timeout_s, (int, float)) and timeout_s >= 0):
        raise ValueError(f"`timeout_s` is {timeout_s!r}, but must be a number >= 0")
    with _locked():
        record, note = live_record()
        if note:
            say(f"modelhopper: {note}")
        if record is None:
            say("modelhopper: the local service is not up")
            return False
        try:
            with _connected(record):
                keeper = ray.get_actor(KEEPER, namespace=NAMESPACE)
                runs = ray.get(keeper.stop.remote())
                if runs:
                    say(f"modelhopper: asked {len(runs)} attached run(s) to stop (drivers {sorted(runs.values())}); "
                        f"waiting up to {timeout_s:g} s")
                deadline = time.time() + timeout_s
                while runs and time.time() < deadline:
                    time.sleep(0.5)
                    runs = ray.get(keeper.status.remote())["runs"]
                if runs:
                    say(f"modelhopper: {len(runs)} attached run(s) still running after {timeout_s:g} s: stopping "
                        "the service under them")
        except Exception as e:  # noqa: BLE001 - a broken service is stopped all the same
            say(f"modelhopper: could not reach the service's pool ({type(e).__name__}); stopping it")
        stopped = _stop_head()
    say(f"modelhopper: the local service at {record['address']} is down ({stopped} processes stopped)")
    return True


def status() -> dict[str, Any]:
    """Whether the service is up; when it is, its address, CPUs, start time, temp dir, and its pool: workers idle
    (with their pids), leased, warming, reclaimed, and the attached runs (Ray job -> driver pid)."""
    record, note = live_record()
    if record is None:
        return {"up": False, "note": note}
    out = {"up": True, **{k: record[k] for k in ("address", "num_cpus", "start_time", "temp_dir", "pool")}}
    try:
        with _connected(record):
            out.update(ray.get(ray.get_actor(KEEPER, namespace=NAMESPACE).status.remote(), timeout=60))
    except Exception as e:  # noqa: BLE001
        out["error"] = f"the pool's keeper does not answer ({type(e).__name__}: {e})"
    return out


def pool_holds() -> list[dict[str, Any]]:
    """What each idle worker of the pool holds (`_RayWorker.holds`): a check that a worker given back forgot its
    run."""
    record, _ = live_record()
    if record is None:
        return []
    with _connected(record):
        return ray.get(ray.get_actor(KEEPER, namespace=NAMESPACE).holds.remote(), timeout=120)
