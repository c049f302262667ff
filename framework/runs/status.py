"""A run's status from its directory: `finished`, `running`, `crashed`, `running?`, `unknown` or `unreadable`
(`run_status`), and the reading of a run that it rests on (`open_result`). `framework.runs.manage` lists, compares, exports
and resumes runs on top of it; the dashboard and `framework.runs.steering` ask it whether a run is running.

Reading a run never writes into it (`Result.open` opens its catalog read-only).

**Status rule.** A run is `finished` when it committed its last decision (`framework.run_record.is_finished`: no
config is active after its last round). Otherwise its driver tells: a run records the pid and host of the process
that writes it (`meta["driver"]` at its start, and every `resumed` event after). The latest of those is its driver,
and the run is

- `running` when a process on this host holds the run's writer lock (a run, or a resume from its first step);
- `crashed` when that driver recorded its end (`meta["end_time"]` after it started: it raised or was interrupted),
  or when it ran on this host and its pid is gone (or belongs to a process that started after the driver did: the
  pid was reused);
- `running` when it ran on this host and its pid is alive;
- `running?` when the driver cannot be checked from here (another host, or a run from before drivers were recorded,
  or a replay) and the run changed within the last `RECENT_S` seconds, `unknown` when it has not.

A run whose catalog cannot be read at all is `unreadable`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sqlite3
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from framework.cli import printable
from framework.engine.catalog import CatalogError, SQLiteCatalog, UnverifiedRunWarning
from framework.engine.storage import check_utf8
from framework.result import CATALOG_FILE, OUTCOMES, NoResultError, Result

__all__ = ["RECENT_S", "STATUSES", "DriverInfo", "classify", "driver_of", "open_result", "pid_alive", "run_started",
           "run_status", "wait_for_run"]


STATUSES = ("finished", "running", "crashed", "running?", "unknown", "unreadable")


#: a run whose driver cannot be checked counts as maybe running (`running?`) while it changed this recently (seconds)
RECENT_S = 600.0


@dataclass(frozen=True)
class DriverInfo:
    """The process that writes a run: its pid and host (None where not recorded) and when it started writing (the
    run's start, or the resume)."""

    pid: int | None
    host: str | None
    since: float

    def __post_init__(self) -> None:
        if self.pid is not None and (not isinstance(self.pid, int) or self.pid < 1):
            raise ValueError(f"`pid` is {self.pid!r}, but must be an int >= 1 or None")


def classify(finished: bool, driver: DriverInfo | None, end_time: float | None, last_activity: float, *,
             host: str, alive: Callable[[int, float], bool], now: float, locked: bool = False) -> str:
    """A run's status by the rule in the module docstring. `alive(pid, since)`: whether that pid on this `host` is
    still the driver that started writing at `since`; `now` and `last_activity` are epoch seconds; `locked`: a
    process on this host holds the run's writer lock (`framework.run_record.writer_lock`; a resume holds it before it records
    itself as the driver)."""
    if finished:
        return "finished"
    if locked:
        return "running"
    if driver is not None:
        if end_time is not None and end_time >= driver.since:
            return "crashed"
        if driver.host == host and driver.pid is not None:
            return "running" if alive(driver.pid, driver.since) else "crashed"
    return "running?" if now - last_activity < RECENT_S else "unknown"


def driver_of(meta: Mapping[str, Any], events: pd.DataFrame) -> DriverInfo | None:
    """The latest driver a run recorded: its last `resumed` event, else `meta["driver"]`; None when it recorded none
    (a run from before drivers were recorded) or when it is a replay (whose meta is its source run's)."""
    if meta.get("replay_of") is not None:
        return None
    resumed = events[events.kind == "resumed"] if not events.empty else events
    for row in reversed(list(resumed.itertuples())):
        detail = json_dict(row.detail)
        if "pid" in detail:
            return _driver(detail, float(row.time))
    recorded = meta.get("driver")
    if isinstance(recorded, Mapping) and "start_time" in meta:
        return _driver(recorded, float(meta["start_time"]))
    return None


def _driver(detail: Mapping[str, Any], since: float) -> DriverInfo | None:
    pid, host = detail.get("pid"), detail.get("host")
    try:
        return DriverInfo(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                          host if isinstance(host, str) else None, since)
    except ValueError:  # a pid of 0 or below: not a process this machine can check
        return DriverInfo(None, host if isinstance(host, str) else None, since)


def pid_alive(pid: int, since: float) -> bool:
    """Whether process `pid` on this machine exists and could be the driver that started writing at `since` (where
    `/proc` says when it started, a process younger than that reuses a dead driver's pid; a zombie is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    started, state = _proc_start(pid)
    if state == "Z":
        return False
    return started is None or started <= since + 2.0  # /proc's boot time is whole seconds


def _proc_start(pid: int) -> tuple[float | None, str | None]:
    """(when the process started, its state letter) from Linux's `/proc`; (None, None) elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        with open("/proc/stat") as f:
            btime = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + int(rest[19]) / os.sysconf("SC_CLK_TCK"), rest[0]
    except (OSError, ValueError, IndexError, StopIteration):
        return None, None


@contextlib.contextmanager
def opened(path: str) -> Iterator[Result]:
    """`Result.open(path)` without its warning about an unverified run (callers report `verified` themselves); the
    rows of an unverified run that do not fit together raise `CatalogError`, as every unreadable run does."""
    result = open_quietly(path)
    with result:
        try:
            yield result
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            if result.verified:
                raise
            raise CatalogError(f"the run in {path!r} is not verified and its rows do not fit together "
                               f"({type(e).__name__}: {e})") from e


def _last_activity(result: Result, db: str) -> float:
    """The latest time the run recorded: its start and end, an event (a committed round is one), a unit's end; the
    catalog file's modification time for a run that recorded none."""
    t0 = float(result.meta.get("start_time", 0.0) or 0.0)
    times = [t0, float(result.meta.get("end_time") or 0.0)]
    if not result.events.empty:
        times.append(float(result.events.time.max()))
    if not result.schedule.empty:
        times.append(t0 + float(result.schedule.end.max()))
    latest = max(times)
    return latest if latest > 0 else os.path.getmtime(db)


def _status_of(result: Result, now: float) -> dict[str, Any]:
    from framework.run_record import is_being_written

    meta = result.meta
    db = os.path.join(result.storage_path, CATALOG_FILE)
    last = _last_activity(result, db)
    driver = driver_of(meta, result.events)
    end_time = meta.get("end_time")
    catalog = SQLiteCatalog(db, readonly=True)
    try:
        rounds = catalog.last_round()[0] + 1
    finally:
        catalog.close()
    # finished: `record.is_finished`, from what was read once here
    finished = rounds > 0 and not (result.status.status == "active").any()
    locked = is_being_written(result.storage_path)
    status = classify(finished, driver, float(end_time) if end_time is not None else None,
                      last, host=socket.gethostname(), alive=pid_alive, now=now,
                      locked=locked)
    try:
        best = result.get_best_result()
        best_row = {"config_id": best.config_id, "config": best.config, "epoch": best.epoch,
                    "value": best.metrics.get(result.metric)}
    except (NoResultError, ValueError):  # none has a value, or the run reported another metric than it ranks by
        best_row = None
    counts = result.status.status.value_counts()
    order = [*OUTCOMES, *sorted(set(counts.index) - set(OUTCOMES))]
    kinds = result.events.kind.value_counts() if not result.events.empty else pd.Series(dtype=int)
    started = [json_dict(d).get("count") for d in result.events[result.events.kind == "workers_started"].detail]
    live = _live_workers(result.events)
    units = result.schedule.kind.value_counts() if not result.schedule.empty else pd.Series(dtype=int)
    return {
        "path": result.storage_path, "status": status, "verified": result.verified,
        "problems": list(result.unverified), "metric": result.metric, "mode": result.mode,
        "num_configs": len(result.configs), "configs": {k: int(counts[k]) for k in order if k in counts},
        "epochs_trained": int(result.status.epochs.fillna(0).sum()),
        "units_done": {"train": int(units.get("train", 0)), "eval": int(units.get("eval", 0))},
        "rounds": int(rounds), "procedure": meta.get("procedure"),
        "start_time": meta.get("start_time"), "end_time": end_time, "last_activity": last, "age_s": now - last,
        "best": best_row,
        "workers": {"num_workers": meta.get("num_workers"), "executor": meta.get("executor"),
                    "scheduler": meta.get("scheduler"), "started": started[-1] if started else None,
                    "live": meta.get("num_workers") if live is None else live,
                    "failed": int(kinds.get("worker_failed", 0)), "restarted": int(kinds.get("worker_restarting", 0))},
        "driver": None if driver is None else {"pid": driver.pid, "host": driver.host, "since": driver.since},
        "pid": driver.pid if status == "running" and driver is not None and driver.host == socket.gethostname()
        and pid_alive(driver.pid, driver.since) else None,
        "locked": locked,
        "resumes": int(kinds.get("resumed", 0)), "functions": meta.get("functions"),
    }


def _live_workers(events: pd.DataFrame) -> int | None:
    """How many workers the run has now (or had when it stopped): the count its last session started with (a
    `workers_started` event), changed by every later `workers_changed` event (a worker added, drained, lost or back).
    None when the run logged neither (it has not started its workers yet)."""
    if events.empty:
        return None
    for kind, detail in zip(reversed(events.kind.tolist()), reversed(events.detail.tolist())):
        if kind in ("workers_started", "workers_changed"):
            n = json_dict(detail).get("count" if kind == "workers_started" else "num_workers")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                return n
    return None


def run_status(path: str, now: float | None = None) -> dict[str, Any]:
    """One run's state as a JSON-able dict: `status` (see the module docstring), `verified` (and the `problems`
    that did not verify), `metric`/`mode`, `configs` (how many of each status: completed, pruned, failed, active),
    `epochs_trained`, `units_done`, `rounds` committed, `start_time`/`last_activity` (epoch seconds) and `age_s`,
    the `best` config so far (None when none has a value), `workers` (`num_workers` it was started with, `live`: how
    many it has now, after workers were added, drained or lost; its `executor` and `scheduler`, how many workers
    `failed` and were `restarted`), the `driver` (pid, host), for a running
    run whose driver is alive on this host its `pid`, and `locked` (a process on this host holds the run's writer
    lock). Reads only. `path` is a run directory or the URI it was mirrored to."""
    with opened(path) as result:
        return {**_status_of(result, time.time() if now is None else now), "path": path}


def run_started(path: str) -> bool:
    """Whether the directory `path` holds a run that has started: its `run.db` exists and, while a process on this
    host writes it (a run that is starting holds its writer lock before it makes `run.db`), holds the run's meta,
    which a new run writes once it has saved its data. A path that does not exist yet has no run. Reads only."""
    from framework.run_record import is_being_written

    db = os.path.join(path, CATALOG_FILE)
    if not os.path.isfile(db):
        return False
    if not is_being_written(path):
        return True  # a run not being written is what it is: reading it says what is wrong with it, if anything
    try:
        uri = f"file:{urllib.parse.quote(os.fsencode(os.path.abspath(db)))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True)
        try:
            return conn.execute("SELECT 1 FROM meta WHERE key = 'start_time'").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:  # its tables are not there yet, or the writer holds the file a moment
        return False


def wait_for_run(path: str, timeout: float, poll_s: float = 0.1) -> bool:
    """Wait until the directory `path` holds a run that has started (`run_started`), at most `timeout` seconds;
    returns whether it does. For a run just launched, whose directory (or `run.db`, or meta) is not there yet."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout < math.inf:
        raise ValueError(f"`timeout` is {timeout!r}, but must be a finite number of seconds >= 0")
    deadline = time.monotonic() + timeout
    while not run_started(path):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll_s, left))
    return True


def open_quietly(path: str) -> Result:
    """`Result.open(path)`, quiet about an unverified run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedRunWarning)
        return open_result(path)


def open_result(path: str) -> Result:
    """`Result.open(path)`; a run whose catalog holds text that is not UTF-8 (a lone surrogate such as JSON's
    `"\\udcff"` in a config or its meta, which a run's tables cannot hold) raises `CatalogError` naming it, as it
    does for a catalog SQLite cannot open (a path of more than 512 bytes); a `path` that is not UTF-8 text raises a
    `ValueError` (`framework.engine.storage.not_utf8`)."""
    check_utf8("storage_path", path)
    try:
        return Result.open(path)
    except sqlite3.OperationalError as e:  # e.g. a path longer than SQLite takes (512 bytes), or no permission
        raise CatalogError(f"the run in {path!r} cannot be opened: SQLite says {e}") from None
    except UnicodeEncodeError as e:
        raise CatalogError(f"the run in {path!r} holds text that is not UTF-8 ({printable(e.object[e.start:e.end])}: "
                           "a lone surrogate, from a JSON escape such as \\udcff in a config or an edited catalog), "
                           "which its tables cannot hold") from None


def json_dict(text: Any) -> dict[str, Any]:
    """An event's detail as a dict ({} for one that is not a JSON object: an unverified run's rows may be anything)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
