"""The Ray a run uses: started by the run itself, or the cluster it was told of, never one it merely finds.

`ensure_ray` is the engine's Ray check, run before a run (or a source that needs Ray, `from_ray_dataset`) touches
Ray, and by Ray's own implicit start once `framework` is imported (`framework.cluster.implicit_ray`). It starts an
embedded local Ray of the run's own (no dashboard; its processes recorded for `modelhopper cleanup`,
`framework.cluster.orphans`), attaches to the cluster `address`/`$RAY_ADDRESS` names, and refuses a connection that a
plain `ray.init()` made to the cluster `ray start` started on this machine. Besides `framework.engine.ray_backend`,
the one module of the engine that imports Ray; it imports nothing of the engine's workers (a data source may use it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping

import ray

from framework.cluster import orphans

__all__ = ["ensure_ray", "start_implicitly", "token_auth_notice"]

logger = logging.getLogger(__name__)

#: the GCS address of the Ray this process's `ensure_ray` started or attached to (None: it has not)
_made: str | None = None


def ensure_ray(min_cpus: float = 1.0, address: str | None = None) -> bool:
    """Attach to the cluster this process was told of, or start a local Ray of its own.

    Told of a cluster means `address` (e.g. "10.0.0.5:6379", or "auto" to take the one `ray start` last started
    here) or `$RAY_ADDRESS` (which `ray job submit` sets). Otherwise it attaches to the local service this user
    started with `modelhopper up` when that is up (`framework.cluster.service.attach`: one line on stderr says so),
    or the run starts its own embedded Ray
    (`address="local"`), never a cluster another process or user started on this machine, which Ray's plain
    `ray.init()` would attach to. Before that, the Ray processes of an earlier driver of this user that was killed
    are stopped (`framework.cluster.orphans`); after it, those this start brought up are recorded for
    `modelhopper cleanup`. Ray's dashboard is never started. Returns True when this call started or attached to
    Ray. A local instance gets at least `min_cpus` logical CPUs so the workers a run asks for can be placed even on
    a small machine (they then share the cores). Where Ray would log its token-authentication warning (a local start
    with `RAY_AUTH_MODE` unset), that warning is left out and one short line of ours on stderr says what it means
    here (`token_auth_notice`).

    Ray already initialised in this process is taken as it is when this function made it, when this process
    started it (the program's own `ray.init(address="local")`, a test session's), or when it is a cluster the
    program named (`ray.init(address=...)` of another cluster than `ray start`'s on this machine); attached to the
    cluster that `ray start` started on this machine without `address`/`$RAY_ADDRESS` naming it (what a plain
    `ray.init()` does, e.g. Ray Data's implicit one before `framework` was imported), it raises a `RuntimeError`.
    """
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise ValueError(f"`address` is {address!r}, but must be None (a Ray of the run's own, or $RAY_ADDRESS), "
                         "'auto' or a cluster's 'host:port'")
    if ray.is_initialized():
        _check_connection(address)
        return False
    global _made
    named = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    if named is not None and named != "local":  # ("local": a Ray of the run's own, recorded, as below)
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        _made = _connection()[0]
        return True
    if named is None:  # the local service this user started (`modelhopper up`), when it is up and fits the run
        from framework.cluster import service

        with _without_token_warning():
            _made = service.attach(min_cpus)
        if _made is not None:
            return True
    orphans.reap()
    since = time.time()
    atexit.register(orphans.forget)  # before ray.init: runs after Ray's own shutdown (atexit is last-in, first-out)
    auth_mode = os.environ.get("RAY_AUTH_MODE")  # (a local ray.init sets it to "token" when it is unset)
    with _without_token_warning():  # Ray's note on token authentication; ours, shorter, follows where it applies
        ray.init(address="local", num_cpus=max(int(min_cpus + 0.999), os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=True)
    _made = _connection()[0]
    if (notice := token_auth_notice(auth_mode)) is not None:
        print(notice, file=sys.stderr, flush=True)
    if (other := _ray_start_cluster()) is not None:
        print(f"modelhopper: started this run's own local Ray, not the cluster at {other} that `ray start` started "
              "on this machine (set RAY_ADDRESS=auto to run there)", file=sys.stderr, flush=True)
    try:
        orphans.record(since)
    except OSError as e:  # a read-only home: the run goes on; a killed driver's agents are then left to the user
        logger.warning("could not record this driver's Ray processes in %s: %s", orphans.records_dir(), e)
    return True


def start_implicitly() -> None:
    """Ray's implicit start (its `auto_init_ray`, which `framework.cluster.implicit_ray` replaces) as `ensure_ray()`
    instead of a plain `ray.init()`; `RAY_ENABLE_AUTO_CONNECT=0` still turns it off, as it does Ray's."""
    from ray._private import auto_init_hook

    if auto_init_hook.enable_auto_connect and not ray.is_initialized():
        with auto_init_hook.auto_init_lock:
            if not ray.is_initialized():
                ensure_ray()


def _connection() -> tuple[str | None, bool]:
    """The GCS address of the Ray this process is connected to, and whether this process started that Ray (its
    head runs here); (None, False) in Ray Client mode, where there is no node."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return None, False
    return node.gcs_address, bool(node.head)


def _ray_start_cluster() -> str | None:
    """The address of the cluster a plain `ray.init()` here would attach to (the one `ray start` last started on
    this machine, from Ray's `ray_current_cluster` file), canonical as a connected node names it; None: none."""
    from ray._private import services

    try:
        found = services.find_bootstrap_address(None)
        return services.canonicalize_bootstrap_address(found) if found else None
    except (OSError, ValueError):
        return None


def _check_connection(address: str | None) -> None:
    """Refuse the Ray this process is connected to when it is the `ray start` cluster of this machine and neither
    this module attached to it nor `address`/`$RAY_ADDRESS` named it (see `ensure_ray`)."""
    gcs, started_here = _connection()
    if gcs is None or started_here or gcs == _made or address is not None or os.environ.get("RAY_ADDRESS"):
        return
    if gcs == _ray_start_cluster():
        raise RuntimeError(f"this process is attached to the Ray cluster at {gcs} that `ray start` started on this "
                           "machine, which modelhopper did not start and nobody named (a plain ray.init(), e.g. "
                           "Ray Data's before `import framework`): import framework before using Ray to get the "
                           f"run's own, or set RAY_ADDRESS={gcs} to run there")


#: the logger of Ray's token-authentication warnings, and the start of the one a local `ray.init` logs when
#: `RAY_AUTH_MODE` is unset (`ray._private.authentication.authentication_token_setup`)
_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_RAY_AUTH_WARNING = "Token authentication is enabled for this Ray cluster"


class _DropTokenWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_RAY_AUTH_WARNING)


@contextlib.contextmanager
def _without_token_warning() -> Iterator[None]:
    """Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out. ..."
    warning left out while the block runs (a filter on its logger, removed after; Ray's other messages pass):
    `token_auth_notice` says what it means for the run in one line of ours."""
    logger_ = logging.getLogger(_RAY_AUTH_LOGGER)
    drop = _DropTokenWarning()
    logger_.addFilter(drop)
    try:
        yield
    finally:
        logger_.removeFilter(drop)


def token_auth_notice(auth_mode: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Our one short line in place of Ray's "Token authentication is enabled for this Ray cluster" warning, which a
    local `ray.init` logs when `RAY_AUTH_MODE` is unset (`auth_mode`: its value before the call; Ray then sets it to
    "token" in this process, so a later start in it says nothing) and `ensure_ray` leaves out: the run's own Ray
    takes only processes that hold Ray's token, where that token is, and (when it is so) that others can read its
    file. None when the mode was set (Ray says nothing then, and neither do we). The token is Ray's:
    `$RAY_AUTH_TOKEN`, else the file `$RAY_AUTH_TOKEN_PATH` names, else `~/.ray/auth_token` (which Ray writes on
    first use, with the process's umask, and every later local Ray of this user reuses)."""
    if auth_mode is not None:
        return None
    default = os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    path = None if environ.get("RAY_AUTH_TOKEN") else environ.get("RAY_AUTH_TOKEN_PATH") or default
    where = "$RAY_AUTH_TOKEN" if path is None else path
    shared = path is not None and _readable_by_others(path)
    return (f"modelhopper: this run's Ray takes only processes holding the token in {where}, so other users of this "
            "machine cannot attach" + (f" (but {path} is readable by others: chmod 600 it)" if shared else "")
            + "; set RAY_AUTH_MODE=token to keep it on without the warning")


def _readable_by_others(path: str) -> bool:
    """Whether the group or other users can read `path`: it has their read bit and every folder above it their
    search bit."""
    try:
        modes = [os.stat(path).st_mode] + [os.stat(d).st_mode for d in _parents(os.path.abspath(path))]
    except OSError:
        return False
    group, others = (0o040, 0o010), (0o004, 0o001)  # (read bit, search bit)
    return any(modes[0] & read and all(m & search for m in modes[1:]) for read, search in (group, others))


def _parents(path: str) -> list[str]:
    parents = []
    while (parent := os.path.dirname(path)) != path:
        parents.append(path := parent)
    return parents
