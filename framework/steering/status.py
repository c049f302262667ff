"""A run's status from its directory: `finished`, `running`, `crashed`, `running?`, `unknown` or `unreadable`
(`run_status`), and the reading of a run that it rests on (`open_result`). `framework.runs.manage` lists, compares, exports
and resumes runs on top of it; the dashboard and `framework.steering.connect` ask it whether a run is running.

Reading a run never writes into it (`Result.open` opens its catalog read-only). A local run that verifies is read
from its catalog's rows as SQLite returns them, without pandas (`modelhopper list` and `status` start in a fraction of
a second); every other run as a `Result`, which says what it makes of rows that do not verify.

**Status rule.** A run is `finished` when it committed its last decision (`framework.run_record.is_finished`: no
config is active after its last round). Otherwise its driver tells: a run records the pid and host of the process
that writes it (`meta["driver"]` at its start, and every `resumed` event after). The latest of those is its driver,
and the run is

- `running` when a process on this host holds the run's writer lock (a run, or a resume from its first step);
- `crashed` when that driver recorded its end (`meta["end_time"]` after it started: it raised or was interrupted),
  or when it ran on this host and its pid is gone (or belongs to a process that started after the driver did: the
  pid was reused);
- `running` when it ran on this host and its pid is alive;
- `budget_spent` when it would be `crashed`, but its last session ended because its time budget was spent
  (`framework.stoppers.ended_by`): it ended cleanly, and resumes with a larger budget; `service_stopped` when the
  local service it was attached to went down (`modelhopper down`): it ended cleanly, and resumes where it stopped;
- `running?` when the driver cannot be checked from here (another host, or a run from before drivers were recorded,
  or a replay) and the run changed within the last `RECENT_S` seconds, `unknown` when it has not.

A run whose catalog cannot be read at all is `unreadable`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import sqlite3
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.stoppers import ended_by, event_detail
from framework.store.catalog import (
    CATALOG_FILE,
    OUTCOMES,
    CatalogError,
    SQLiteCatalog,
    UnverifiedRunWarning,
    config_outcome,
    records_start,
)
from framework.store.storage import check_utf8, is_uri, not_utf8
from framework.text import printable

if TYPE_CHECKING:  # pandas (with `Result`) is imported where a run is read into DataFrames: `run_status` of a run that
    import pandas as pd  # verifies reads its rows as they are, so `modelhopper list` and `status` start without it

    from framework.result import Result

__all__ = ["RECENT_S", "STATUSES", "DriverInfo", "classify", "driver_of", "open_result", "pid_alive", "run_started",
           "run_status", "wait_for_run"]


STATUSES = ("finished", "running", "crashed", "running?", "unknown", "unreadable", "budget_spent", "service_stopped")


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
    process on this host holds the run's writer lock (`framework.store.lock.writer_lock`; a resume holds it before it records
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
    (a run from before drivers were recorded) or when it is a replay (whose meta is its source run's). `events`: the
    run's events (`Result.events`)."""
    return _latest_driver(meta, _event_rows(events))


def _event_rows(events: pd.DataFrame) -> list[tuple[Any, Any, Any]]:
    """(time, kind, detail) of each event, in the order logged (`SQLiteCatalog.event_rows`' rows)."""
    return list(zip(events.time.tolist(), events.kind.tolist(), events.detail.tolist()))


def _latest_driver(meta: Mapping[str, Any], events: Sequence[tuple[Any, Any, Any]]) -> DriverInfo | None:
    """`driver_of`, of the events as (time, kind, detail) rows."""
    if meta.get("replay_of") is not None:
        return None
    for t, kind, detail in reversed(events):
        if kind == "resumed":
            parsed = event_detail(detail)
            if "pid" in parsed:
                return _driver(parsed, float(t))
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


@dataclass(frozen=True)
class _Reading:
    """What a run's status is made of (`_status_dict`), read from a `Result` (`_reading_of`) or, for a run that
    verifies, from its rows as they are (`_plain_reading`): the same values either way."""

    path: str
    problems: list[str]
    meta: Mapping[str, Any]
    metric: Any
    mode: Any
    last_activity: float
    rounds: int
    num_configs: int
    statuses: list[str]  # each config's, as users read it (`OUTCOMES`)
    epochs_trained: int
    units: Mapping[str, int]  # units done, by kind
    events: list[tuple[Any, Any, Any]]  # (time, kind, detail), in the order logged
    best: dict[str, Any] | None


def _reading_of(result: Result) -> _Reading:
    from framework.result import NoResultError

    db = os.path.join(result.storage_path, CATALOG_FILE)
    last = _last_activity(result, db)
    catalog = SQLiteCatalog(db, readonly=True)
    try:
        rounds = catalog.last_round()[0] + 1
    finally:
        catalog.close()
    try:
        best = result.get_best_result()
        best_row = {"config_id": best.config_id, "config": best.config, "epoch": best.epoch,
                    "value": best.metrics.get(result.metric)}
    except (NoResultError, ValueError):  # none has a value, or the run reported another metric than it ranks by
        best_row = None
    units = result.schedule.kind.value_counts() if not result.schedule.empty else {}
    return _Reading(
        path=result.storage_path, problems=list(result.unverified), meta=result.meta, metric=result.metric,
        mode=result.mode, last_activity=last, rounds=rounds, num_configs=len(result.configs),
        statuses=result.status.status.tolist(),
        epochs_trained=int(result.status.epochs.fillna(0).sum()),
        units={k: int(units.get(k, 0)) for k in ("train", "eval")}, events=_event_rows(result.events), best=best_row)


def _status_dict(r: _Reading, now: float) -> dict[str, Any]:
    from framework.store.lock import is_being_written

    meta = r.meta
    driver = _latest_driver(meta, r.events)
    end_time = meta.get("end_time")
    finished = r.rounds > 0 and "active" not in r.statuses  # `record.is_finished`, from what was read once here
    locked = is_being_written(r.path)
    status = classify(finished, driver, float(end_time) if end_time is not None else None,
                      r.last_activity, host=socket.gethostname(), alive=pid_alive, now=now,
                      locked=locked)
    ended = ended_by([(kind, detail) for _, kind, detail in r.events]) if status == "crashed" else None
    if ended is not None:
        status = "service_stopped" if ended == "service_stopping" else "budget_spent"
    counts = Counter(r.statuses)
    order = [*OUTCOMES, *sorted(set(counts) - set(OUTCOMES))]
    kinds = Counter(kind for _, kind, _ in r.events)
    started = [event_detail(d).get("count") for _, kind, d in r.events if kind == "workers_started"]
    live = _live_workers(r.events)
    return {
        "path": r.path, "status": status, "verified": not r.problems,
        "problems": list(r.problems), "metric": r.metric, "mode": r.mode,
        "num_configs": r.num_configs, "configs": {k: counts[k] for k in order if k in counts},
        "epochs_trained": r.epochs_trained,
        "units_done": {"train": r.units.get("train", 0), "eval": r.units.get("eval", 0)},
        "rounds": int(r.rounds), "procedure": meta.get("procedure"),
        "start_time": meta.get("start_time"), "end_time": end_time, "last_activity": r.last_activity,
        "age_s": now - r.last_activity,
        "best": r.best,
        "workers": {"num_workers": meta.get("num_workers"), "executor": meta.get("executor"),
                    "scheduler": meta.get("scheduler"), "started": started[-1] if started else None,
                    "live": meta.get("num_workers") if live is None else live,
                    "failed": kinds.get("worker_failed", 0), "restarted": kinds.get("worker_restarting", 0)},
        "driver": None if driver is None else {"pid": driver.pid, "host": driver.host, "since": driver.since},
        "pid": driver.pid if status == "running" and driver is not None and driver.host == socket.gethostname()
        and pid_alive(driver.pid, driver.since) else None,
        "locked": locked,
        "resumes": kinds.get("resumed", 0), "functions": meta.get("functions"),
    }


def _live_workers(events: Sequence[tuple[Any, Any, Any]]) -> int | None:
    """How many workers the run has now (or had when it stopped): the count its last session started with (a
    `workers_started` event), changed by every later `workers_changed` event (a worker added, drained, lost or back).
    None when the run logged neither (it has not started its workers yet). `events`: (time, kind, detail) rows."""
    for _, kind, detail in reversed(events):
        if kind in ("workers_started", "workers_changed"):
            n = event_detail(detail).get("count" if kind == "workers_started" else "num_workers")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                return n
    return None


# ---- reading a run that verifies without pandas -----------------------------------------------------------------
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\\udcff" read back: text a DataFrame cannot hold
_METRIC_PREFIXES = ("train_", "valid_")  # the metrics a run records per epoch (`framework.scheduling.units`)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, float) or _is_int(v)


def _plain_reading(path: str) -> _Reading | None:
    """The `_Reading` of the run in the local folder `path` from its catalog's rows as SQLite returns them, without
    pandas: what `_reading_of(Result.open(path))` gives, as fast as SQLite reads (`modelhopper list` and `status`
    import no pandas). Every row is verified first, in the same snapshot as they are read (`Result` does the same);
    None, for the caller to read the run as a `Result` (its errors and its reading of rows that may not fit
    together), for a run that does not verify, a URI, a catalog that cannot be opened, and anything a run does not
    write (text a DataFrame cannot hold, a metric that is not `train_*` or `valid_*` or not a number, ...)."""
    if is_uri(path) or not_utf8(path) is not None:
        return None
    db = os.path.join(path, CATALOG_FILE)
    if not os.path.isfile(db):
        return None
    try:
        catalog = SQLiteCatalog(db, readonly=True)
    except (CatalogError, sqlite3.Error, OSError, ValueError):
        return None
    try:
        with catalog.snapshot():  # what is verified is what is read, also while a writer goes on
            if catalog.verify():
                return None
            meta, rounds = catalog.meta(), catalog.last_round()[0]
            rows = catalog.config_rows(), catalog.epoch_rows(), catalog.unit_kinds("done"), catalog.event_rows()
    except (CatalogError, sqlite3.Error):
        return None
    finally:
        catalog.close()
    return _reading_from_rows(path, meta, rounds, *rows)


def _reading_from_rows(path: str, meta: dict[str, Any], last_round: Any, configs: list[tuple], epochs: list[tuple],
                       unit_kinds: list[tuple], events: list[tuple]) -> _Reading | None:
    """`_plain_reading` of rows read and verified: None where they hold anything a run does not write."""
    t0, end_time = meta.get("start_time", 0.0), meta.get("end_time")
    metric, mode = meta.get("metric", "valid_loss"), meta.get("mode", "min")
    if not _is_number(t0) or not (end_time is None or _is_number(end_time)) or not _is_int(last_round):
        return None
    if not isinstance(metric, str) or not metric.startswith(_METRIC_PREFIXES):
        return None
    statuses, epochs_trained, parsed = [], 0, {}
    for cid, text, status, n, _, _, _, outcome in configs:
        if not isinstance(text, str) or not isinstance(status, str) or not _is_int(n) or \
                not (outcome is None or isinstance(outcome, str)):
            return None
        try:
            config = json.loads(text)
        except ValueError:
            return None
        if not isinstance(config, dict) or any(_LONE_SURROGATE.search(k) or isinstance(v, str) and
                                               _LONE_SURROGATE.search(v) for k, v in config.items()):
            return None  # a DataFrame's `config/<name>` column cannot hold it: `Result` says so
        parsed[cid] = config
        statuses.append(config_outcome(status, outcome))
        epochs_trained += n
    last: dict[int, tuple[int, dict[str, Any]]] = {}  # each config's last epoch and its metrics
    reported: set[str] = set()
    for cid, epoch, _, text in epochs:  # by config, then epoch
        if cid not in parsed or not _is_int(epoch) or not isinstance(text, str):
            return None
        try:
            metrics = json.loads(text)
        except ValueError:
            return None
        if not isinstance(metrics, dict) or not all(
                k.startswith(_METRIC_PREFIXES) and not _LONE_SURROGATE.search(k) and _is_number(v)
                and (isinstance(v, float) or abs(v) <= 2**53) for k, v in metrics.items()):
            return None
        reported.update(metrics)
        last[cid] = (epoch, metrics)
    if any(bad for _, _, _, bad in unit_kinds) or not all(_is_number(t) and isinstance(k, str) for t, k, _ in events):
        return None
    done = {kind: n for kind, n, _, _ in unit_kinds}
    t0 = float(t0)  # what `Result` subtracts from a unit's times
    times = [float(meta.get("start_time", 0.0) or 0.0), float(meta.get("end_time") or 0.0)]
    if events:
        times.append(float(max(t for t, _, _ in events)))
    if unit_kinds:
        times.append(times[0] + (float(max(end for _, _, end, _ in unit_kinds)) - t0))
    latest = max(times)
    return _Reading(
        path=path, problems=[], meta=meta, metric=metric, mode=mode,
        last_activity=latest if latest > 0 else os.path.getmtime(os.path.join(path, CATALOG_FILE)),
        rounds=last_round + 1, num_configs=len(parsed), statuses=statuses, epochs_trained=epochs_trained,
        units={k: done.get(k, 0) for k in ("train", "eval")}, events=events,
        best=_best(metric, mode, last, reported, dict(zip(parsed, statuses)), parsed))


def _best(metric: str, mode: Any, last: dict[int, tuple[int, dict[str, Any]]], reported: set[str],
          statuses: dict[int, str], configs: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """`Result.get_best_result()` (its metric and mode, scope "last") of the rows read: of the configs that did not
    fail, the one whose last epoch's value is the least (`mode` "min") or the greatest ("max"), the first by id
    among equals; NaN is no value. None when none has a value, or when `mode` is neither ("min" or "max") or the
    run reported no `metric` at all (`Result` raises a ValueError for both)."""
    if mode not in ("min", "max") or not isinstance(mode, str) or metric not in reported:
        return None
    values = [(float(m[metric]), cid, epoch) for cid, (epoch, m) in sorted(last.items())
              if statuses[cid] != "failed" and metric in m and m[metric] == m[metric]]
    if not values:
        return None
    pick = min if mode == "min" else max
    value, cid, epoch = pick(values, key=lambda v: v[0])  # the first of equals
    return {"config_id": cid, "config": configs[cid], "epoch": epoch, "value": value}


def run_status(path: str, now: float | None = None) -> dict[str, Any]:
    """One run's state as a JSON-able dict: `status` (see the module docstring), `verified` (and the `problems`
    that did not verify), `metric`/`mode`, `configs` (how many of each status: completed, pruned, failed, active),
    `epochs_trained`, `units_done`, `rounds` committed, `start_time`/`last_activity` (epoch seconds) and `age_s`,
    the `best` config so far (None when none has a value), `workers` (`num_workers` it was started with, `live`: how
    many it has now, after workers were added, drained or lost; its `executor` and `scheduler`, how many workers
    `failed` and were `restarted`), the `driver` (pid, host), for a running
    run whose driver is alive on this host its `pid`, and `locked` (a process on this host holds the run's writer
    lock). Reads only. `path` is a run directory or the URI it was mirrored to.

    A local run that verifies is read from its rows as they are (no pandas: a command line that asks only this
    starts in a fraction of a second); any other (one that does not verify, a URI) as a `Result`, whose reading
    of rows that do not fit together, and whose errors, it then reports. Both give the same dict."""
    reading = _plain_reading(path)
    if reading is not None:
        return {**_status_dict(reading, time.time() if now is None else now), "path": path}
    with opened(path) as result:
        return {**_status_dict(_reading_of(result), time.time() if now is None else now), "path": path}


def run_started(path: str) -> bool:
    """Whether the directory `path` holds a run that has started: its `run.db` exists and, while a process on this
    host writes it (a run that is starting holds its writer lock before it makes `run.db`), holds the run's meta,
    which a new run writes once it has saved its data. A path that does not exist yet has no run. Reads only."""
    from framework.store.lock import is_being_written

    db = os.path.join(path, CATALOG_FILE)
    if not os.path.isfile(db):
        return False
    if not is_being_written(path):
        return True  # a run not being written is what it is: reading it says what is wrong with it, if anything
    return records_start(db)


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
    `ValueError` (`framework.store.storage.not_utf8`)."""
    from framework.result import Result

    check_utf8("storage_path", path)
    try:
        return Result.open(path)
    except sqlite3.OperationalError as e:  # e.g. a path longer than SQLite takes (512 bytes), or no permission
        raise CatalogError(f"the run in {path!r} cannot be opened: SQLite says {e}") from None
    except UnicodeEncodeError as e:
        raise CatalogError(f"the run in {path!r} holds text that is not UTF-8 ({printable(e.object[e.start:e.end])}: "
                           "a lone surrogate, from a JSON escape such as \\udcff in a config or an edited catalog), "
                           "which its tables cannot hold") from None


