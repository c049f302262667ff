"""Steer a running selection from another process: `framework.connect(run)` (this module is `framework.steering.connect`).

    handle = framework.connect("~/modelhopper_runs/gridsearch-20260101-120000-000000")
    handle.status()["status"]          # "running"
    handle.add_workers(2)              # CommandOutcome(name='add_workers', applied=True, outcome='started ...')
    handle.stop(3)                     # config 3 stops at the next unit boundary
    handle.clone(0, lr=0.001)          # a new config from config 0's weights, with lr changed
    handle.leaderboard()               # a DataFrame, best first

A command goes through the run's inbox (`framework.store.inbox`): the driver applies it at its next look between
events (within `framework.driver.loop.COMMAND_WAIT_S` on an idle loop) with the rules every command follows, and
records what it did as a `command` event in `run.db`, which is what a call here waits for and returns. It works from
any process of this machine that can write into the run directory and holds its signing key, and from another
machine through a shared file system (the same key there).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from framework.result import CATALOG_FILE, Result
from framework.store.catalog import SQLiteCatalog
from framework.store.inbox import send_request

__all__ = ["CommandOutcome", "NotRunningError", "RunHandle", "connect"]


class NotRunningError(RuntimeError):
    """The run is not running (finished, crashed, or it stopped while a command waited): commands cannot reach it."""


@dataclass(frozen=True)
class CommandOutcome:
    """What the driver did with a command: `applied`, and `outcome` (what it did, or why it rejected it)."""

    name: str
    args: dict[str, Any]
    applied: bool
    outcome: str


class RunHandle:
    """A running selection, steered from this process (see the module docstring; made by `connect`)."""

    def __init__(self, path: str, source: str = "connect") -> None:
        self.path, self.source = path, source
        catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE), readonly=True)
        try:
            self.run_id = catalog.meta()["run_id"]
        finally:
            catalog.close()

    def status(self) -> dict[str, Any]:
        """The run's state (`framework.steering.status.run_status`): status, configs, progress, best config, driver."""
        from framework.steering.status import run_status

        return run_status(self.path)

    def leaderboard(self, **kwargs: Any) -> pd.DataFrame:
        """The configs so far, best first (`Result.get_dataframe(**kwargs)` of the run as it is now)."""
        with Result.open(self.path) as result:
            return result.get_dataframe(**kwargs)

    def add_workers(self, count: int = 1, partitions: list[int] | None = None, timeout: float = 60.0) -> CommandOutcome:
        """Start `count` more workers (each loads `partitions`, default: those with the fewest holders)."""
        args: dict[str, Any] = {"count": count}
        if partitions is not None:
            args["partitions"] = list(partitions)
        return self.send("add_workers", timeout=timeout, **args)

    def drain(self, worker: int, timeout: float = 60.0) -> CommandOutcome:
        """Worker `worker` takes no new units, finishes the one it runs, then leaves."""
        return self.send("drain_worker", timeout=timeout, worker=worker)

    def stop(self, config_id: int, timeout: float = 60.0) -> CommandOutcome:
        """Stop config `config_id` now: its units not started are dropped, those running finish, and it keeps its
        weights and metrics (an epoch it was in the middle of stays open: `resume` finishes it)."""
        return self.send("stop_config", timeout=timeout, config_id=config_id)

    def resume(self, config_id: int, epochs: int | None = None, timeout: float = 60.0) -> CommandOutcome:
        """Train a stopped config again from its latest weights, to `epochs` epochs in all (default: the
        procedure's per-config budget). It is the person's from then on: the procedure leaves it alone."""
        return self.send("resume_config", timeout=timeout, **_given(config_id=config_id, epochs=epochs))

    def add(self, config: dict[str, Any], epochs: int | None = None, timeout: float = 60.0) -> CommandOutcome:
        """Add a config the procedure did not ask for; it trains from `model_fn` for `epochs` epochs (default: the
        procedure's per-config budget). The outcome names its id."""
        return self.send("add_config", timeout=timeout, **_given(config=config, epochs=epochs))

    def clone(self, config_id: int, warm: bool = True, epochs: int | None = None, timeout: float = 60.0,
              **overrides: Any) -> CommandOutcome:
        """A new config: config `config_id`'s hyper-parameters with `overrides`, starting from its latest weights
        (`warm`, as PBT's exploit step) or from `model_fn` (`warm=False`); it trains `epochs` epochs of its own."""
        return self.send("clone_config", timeout=timeout,
                         **_given(config_id=config_id, overrides=overrides, warm=warm, epochs=epochs))

    def extend(self, epochs: int | None = None, samples: int | None = None, timeout: float = 60.0) -> CommandOutcome:
        """Grow the procedure's budget: `epochs` more per config, `samples` more configs, as far as the procedure
        allows (the outcome says what changed, or why it cannot)."""
        return self.send("extend", timeout=timeout, **_given(epochs=epochs, samples=samples))

    def pause(self, timeout: float = 60.0) -> CommandOutcome:
        """Pause the run: the units running finish, nothing new starts, workers stay (and keep their data)."""
        return self.send("pause", timeout=timeout)

    def unpause(self, timeout: float = 60.0) -> CommandOutcome:
        """Continue a paused run where it paused."""
        return self.send("unpause", timeout=timeout)

    def send(self, name: str, /, timeout: float = 60.0, **args: Any) -> CommandOutcome:
        """Send command `name` with `args` and wait (at most `timeout` seconds) until the driver has applied or
        rejected it. A run that is not running, or stops in the meantime, raises `NotRunningError`; no answer in time,
        `TimeoutError` (the command stays in the inbox: a resume applies it)."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ValueError(f"`timeout` is {timeout!r}, but must be a number of seconds > 0")
        try:
            json.dumps(args)
        except (TypeError, ValueError, RecursionError) as e:
            raise ValueError(f"the arguments of {name!r} must be JSON values nested less deeply: "
                             f"{type(e).__name__}: {e}") from None
        self._check_running()
        nonce = send_request(self.path, self.run_id, name, args, source=self.source)
        deadline, pause = time.monotonic() + timeout, 0.02
        while True:
            found = self._answer(nonce)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"command {name!r} to the run in {self.path!r} got no answer within {timeout:g} s: "
                                   "the run may be busy or stopped (`status()`); it stays in the run's inbox")
            if not self._running():
                found = self._answer(nonce)  # it may have answered, then ended
                if found is not None:
                    return found
                raise NotRunningError(f"the run in {self.path!r} stopped before it applied command {name!r}; it "
                                   "stays in the run's inbox, and a resume applies it")
            time.sleep(pause)  # (each look reads the run's verified command events: at most 4 a second after 1 s)
            pause = min(2 * pause, 0.25)

    def _answer(self, nonce: str) -> CommandOutcome | None:
        catalog = SQLiteCatalog(os.path.join(self.path, CATALOG_FILE), readonly=True)
        try:
            events = catalog.events("command", verified=True)  # an answer planted without the key is no answer
        finally:
            catalog.close()
        for detail in reversed(events.detail.tolist()):
            d = json.loads(detail)
            if d.get("request") == nonce:
                return CommandOutcome(d["name"], d.get("args", {}), bool(d["applied"]), str(d["outcome"]))
        return None

    def _running(self) -> bool:
        from framework.store.lock import is_being_written

        return is_being_written(self.path)

    def _check_running(self) -> None:
        if self._running():
            return
        status = self.status()["status"]
        if status != "running?":  # a driver on another host, through a shared file system
            raise NotRunningError(f"the run in {self.path!r} is {status}, not running: commands reach only a running "
                               "run (resume it first: `modelhopper resume RUN`)")


def _given(**args: Any) -> dict[str, Any]:
    """The arguments a caller gave (None: the driver's default)."""
    return {k: v for k, v in args.items() if v is not None}


def connect(run: str, source: str = "connect") -> RunHandle:
    """A handle on the run in directory `run` to steer it while it runs (see the module docstring); `source` names
    the sender in the run's record of commands (`Result.commands`). Raises `FileNotFoundError` when `run` holds no
    run."""
    path = os.path.abspath(os.path.expanduser(run))
    if not os.path.isfile(os.path.join(path, CATALOG_FILE)):
        raise FileNotFoundError(f"`run` {run!r} holds no {CATALOG_FILE}: not a run directory")
    return RunHandle(path, source)
