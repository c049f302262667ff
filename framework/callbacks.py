"""The callback contract: the hooks the driver loop calls as a run goes on (`Callback`), what a callback learns at the
start (`RunInfo`), and the run's one observer channel (`CallbackList`). The trackers built on it are
`framework.trackers` (TensorBoard, MLflow); the dashboard's is `framework.dashboard.DashboardCallback`.

    class Printer(framework.Callback):
        def on_epoch_end(self, config_id, epoch, metrics, config):
            print(config_id, epoch, metrics["valid_loss"])

    framework.ModelSelection(..., callbacks=[Printer(), framework.TensorBoardCallback()])

What the driver promises a callback:
- Thread: every hook runs on the driver's thread, one at a time, in the order the callbacks were given. Keep a hook
  short (a tracker's write), or hand the work to a thread of your own.
- Order: `on_run_start` first and `on_run_end` last, once each. `on_epoch_end` fires once an epoch's metrics are
  committed to the run's catalog (the same numbers `Result.metrics` holds), so a resumed run does not repeat it for
  the epochs committed before the crash. A unit that fails gives `on_unit_failed`, and its re-run `on_unit_end`.
- Isolation: a callback that raises is reported (a warning and a `callback_failed` event with the traceback) and not
  called again; the run goes on. Treat what a hook receives as read-only.

Epochs are 0-based everywhere: TensorBoard's and MLflow's `step` is the epoch index of `Result.metrics`.

This module imports no implementation (nothing of the driver, the engine or Ray).
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framework.result import Result

HOOKS = ("on_run_start", "on_units_opened", "on_unit_end", "on_unit_failed", "on_round_end", "on_epoch_end",
         "on_decision", "on_event", "on_notice", "on_run_end")


@dataclass
class RunInfo:
    """What a callback learns when the run starts.

    Attributes:
        storage_path: the run's directory (local working copy).
        metric, mode: what ranks configs.
        meta: the run's recorded settings (executor, scheduler, workers, seed, functions, ...).
        resumed: whether this start continues a crashed run.
        name: the run's name (its folder's, or its URI's last part).
    """

    storage_path: str
    metric: str
    mode: str
    meta: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    name: str = ""


class Callback:
    """Base class of run callbacks: override the hooks you need (each does nothing by default)."""

    def on_run_start(self, run: RunInfo) -> None:
        """Once, after the workers started and before the first unit."""

    def on_unit_end(self, config_id: int, epoch: int, partition: int, kind: str, worker: int, seconds: float,
                    metrics: dict[str, float]) -> None:
        """After every unit that completed (`kind` "train" or "eval"; `metrics` as the user's fn returned them)."""

    def on_units_opened(self, count: int) -> None:
        """`count` more units are open: the next epoch of some configs (a progress bar's total grows)."""

    def on_unit_failed(self, config_id: int, epoch: int, partition: int, kind: str, worker: int, error: str) -> None:
        """After a unit whose user code raised and that will not be retried (`error`: the traceback)."""

    def on_round_end(self, round: int) -> None:
        """Every active config finished its epoch of the round (an epoch barrier), before the procedure decides."""

    def on_epoch_end(self, config_id: int, epoch: int, metrics: dict[str, float], config: dict[str, Any]) -> None:
        """After a config's epoch is committed: its `train_*` / `valid_*` metrics, example-weighted."""

    def on_decision(self, round: int, decision: Any) -> None:
        """After each committed decision of the procedure (an `automl.Decision`); `round` -1 is the first one (the
        initial configs), round r the one after the r-th epoch barrier (or epoch end, without a barrier)."""

    def on_event(self, kind: str, detail: dict[str, Any]) -> None:
        """Every event the run logs (`worker_joined`, `round_committed`, `command`, ...), as it is logged."""

    def on_notice(self, line: str) -> None:
        """A one-line notice for a person watching (a worker lost, a config failed, a command rejected)."""

    def on_run_end(self, result: Result) -> None:
        """Once, with the run's `Result`, after its files are written."""


class CallbackList:
    """The run's one observer channel: its callbacks, called in list order, behind one call that keeps the run
    alive when one of them raises. A hook no callback overrides costs nothing."""

    def __init__(self, callbacks: Sequence[Callback] = (), on_error: Any = None) -> None:
        self.callbacks: list[Callback] = []
        self.on_error = on_error  # on_error(kind, **detail): the run's event log
        self._broken: set[int] = set()
        self._hooks: dict[str, list[int]] = {}  # hook -> callbacks that override it
        self._propagate: set[int] = set()  # callbacks whose errors end the run (the fault plan's observer)
        for cb in callbacks:
            self.add(cb)

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def add(self, callback: Callback, propagate: bool = False) -> None:
        """Call `callback` after the ones added before it. `propagate`: what it raises ends the run (a test
        harness's observer), instead of switching it off with a warning."""
        i = len(self.callbacks)
        self.callbacks.append(callback)
        if propagate:
            self._propagate.add(i)
        for hook in HOOKS:
            if getattr(type(callback), hook, None) is not getattr(Callback, hook):
                self._hooks.setdefault(hook, []).append(i)

    def listens(self, hook: str) -> bool:
        """Whether a callback overrides `hook` (a caller may skip building its arguments otherwise)."""
        return hook in self._hooks

    def call(self, hook: str, *args: Any) -> None:
        for i in self._hooks.get(hook, ()):
            if i in self._broken:
                continue
            cb = self.callbacks[i]
            try:
                getattr(cb, hook)(*args)
            except Exception:  # noqa: BLE001 - a tracker's failure must not end the run
                if i in self._propagate:
                    raise
                self._broken.add(i)
                tb = traceback.format_exc()
                warnings.warn(f"callback {type(cb).__name__}.{hook} raised and is switched off for this run:\n{tb}",
                              stacklevel=2)
                if self.on_error is not None:
                    self.on_error("callback_failed", callback=type(cb).__name__, hook=hook, error=tb)
