"""Callbacks: hooks the driver loop calls as a run goes on, and the trackers built on them (TensorBoard, MLflow).

    class Printer(framework.Callback):
        def on_epoch_end(self, config_id, epoch, metrics, config):
            print(config_id, epoch, metrics["valid_loss"])

    framework.ModelSelection(..., callbacks=[Printer(), framework.TensorBoardCallback()])

Every hook runs on the driver's thread: keep it short (a tracker's write), or hand the work to a thread of your own.
`on_epoch_end` fires once an epoch's metrics are committed (the same numbers `Result.metrics` holds), so a resumed
run does not repeat it for the epochs committed before the crash. A callback that raises is reported (a warning
and a `callback_failed` event with the traceback) and not called again; the run goes on.

Epochs are 0-based everywhere: TensorBoard's and MLflow's `step` is the epoch index of `Result.metrics`.
"""

from __future__ import annotations

import math
import os
import time
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


def check_callbacks(callbacks: Any) -> list[Callback]:
    """`callbacks` as a list, or a `TypeError` naming the entry that is not a `Callback`."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` is {callbacks!r}, but must be a list of framework.Callback instances")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"`callbacks` holds {cb!r}, but every entry must be a framework.Callback instance")
    return list(callbacks)


def dashboard_callbacks(dashboard: Any) -> list[Callback]:
    """`ModelSelection(dashboard=...)`: False (none), True (127.0.0.1, a free port), or a dict of
    `framework.dashboard.serve`'s `host`, `port` and `token`: a `framework.dashboard.DashboardCallback`."""
    if dashboard is False or dashboard is None:
        return []
    if not (dashboard is True or isinstance(dashboard, dict) and set(dashboard) <= {"host", "port", "token"}):
        raise ValueError(f"`dashboard` is {dashboard!r}, but must be True, False or a dict with keys among 'host', "
                         "'port' and 'token'")
    from framework.dashboard import DashboardCallback  # (aiohttp is imported only by those who serve a page)

    return [DashboardCallback(**({} if dashboard is True else dashboard))]


def _scalar(v: Any) -> Any:
    """A hyper-parameter as trackers take it: numbers, strings and bools as they are, the rest as text."""
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardCallback(Callback):
    """TensorBoard event files: one writer per config (`<log_dir>/config_<id>`), a scalar per metric and epoch,
    and at the end each config's hyper-parameters with its final metrics (the HParams plugin's table).

    Args:
        log_dir: where to write (default: `<storage_path>/tensorboard`); view with `tensorboard --logdir <log_dir>`.

    Needs the `tensorboard` package (`pip install "modelhopper[tensorboard]"`).
    """

    def __init__(self, log_dir: str | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("TensorBoardCallback needs the tensorboard package: "
                              "pip install 'modelhopper[tensorboard]'") from e
        self._writer_cls = SummaryWriter
        self._log_dir_arg = self.log_dir = log_dir
        self._writers: dict[int, Any] = {}
        self._configs: dict[int, dict[str, Any]] = {}
        self._last: dict[int, dict[str, float]] = {}

    def on_run_start(self, run: RunInfo) -> None:
        self.log_dir = self._log_dir_arg or os.path.join(run.storage_path, "tensorboard")
        self._writers, self._configs, self._last = {}, {}, {}  # an instance may serve several runs

    def _writer(self, config_id: int) -> Any:
        if config_id not in self._writers:
            self._writers[config_id] = self._writer_cls(os.path.join(self.log_dir, f"config_{config_id}"))
        return self._writers[config_id]

    def on_epoch_end(self, config_id: int, epoch: int, metrics: dict[str, float], config: dict[str, Any]) -> None:
        w = self._writer(config_id)
        for k, v in _finite(metrics).items():
            w.add_scalar(k, v, epoch)
        w.flush()
        self._configs[config_id] = config
        self._last[config_id] = _finite(metrics)

    def on_run_end(self, result: Result) -> None:
        status = result.status.set_index("config_id").status.to_dict()
        for cid, w in self._writers.items():
            hparams = {k: _scalar(v) for k, v in self._configs.get(cid, {}).items()}
            hparams["status"] = status.get(cid, "unknown")
            w.add_hparams(hparams, {f"hparam/{k}": v for k, v in self._last.get(cid, {}).items()}, run_name=".")
            w.close()
        self._writers.clear()


class MLflowCallback(Callback):
    """MLflow runs: a parent run for the selection (its settings as params, the best config's metrics at the end)
    and one nested run per config (its hyper-parameters as params, a metric per epoch with `step=epoch`, its
    outcome as a tag).

    Args:
        tracking_uri: where to track (default: `sqlite:///<storage_path>/mlflow.db`, local and serverless; view
            with `mlflow ui --backend-store-uri <uri>`).
        experiment_name: the MLflow experiment (default: the run's name, `RunInfo.name`).

    Needs MLflow (`pip install "modelhopper[mlflow]"`: mlflow-skinny is enough).
    """

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ImportError("MLflowCallback needs MLflow: pip install 'modelhopper[mlflow]'") from e
        self._client_cls = MlflowClient
        self._tracking_uri_arg = self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.client: Any = None
        self.parent_run_id: str | None = None
        self.run_ids: dict[int, str] = {}  # config_id -> its nested run

    def on_run_start(self, run: RunInfo) -> None:
        self.tracking_uri = self._tracking_uri_arg or f"sqlite:///{os.path.join(run.storage_path, 'mlflow.db')}"
        self.run_ids = {}  # an instance may serve several runs
        self.client = self._client_cls(tracking_uri=self.tracking_uri)
        name = self.experiment_name or run.name or os.path.basename(run.storage_path.rstrip(os.sep))
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        self._experiment_id = exp_id
        parent = self.client.create_run(exp_id, run_name=name, tags={"modelhopper.storage_path": run.storage_path})
        self.parent_run_id = parent.info.run_id
        for k in ("executor", "scheduler", "num_workers", "seed", "procedure", "metric", "mode", "queue_depth"):
            if k in run.meta:
                self.client.log_param(self.parent_run_id, k, _scalar(run.meta[k]))

    def _run_id(self, config_id: int, config: dict[str, Any]) -> str:
        if config_id not in self.run_ids:
            r = self.client.create_run(self._experiment_id, run_name=f"config_{config_id}", tags={
                "mlflow.parentRunId": self.parent_run_id, "modelhopper.config_id": str(config_id)})
            self.run_ids[config_id] = r.info.run_id
            for k, v in config.items():
                self.client.log_param(r.info.run_id, k, _scalar(v))
        return self.run_ids[config_id]

    def on_epoch_end(self, config_id: int, epoch: int, metrics: dict[str, float], config: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        run_id = self._run_id(config_id, config)
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, epoch) for k, v in _finite(metrics).items()])

    def on_run_end(self, result: Result) -> None:
        status = result.status.set_index("config_id").status.to_dict()
        for cid, run_id in self.run_ids.items():
            outcome = status.get(cid, "unknown")
            self.client.set_tag(run_id, "modelhopper.outcome", outcome)
            self.client.set_terminated(run_id, "FAILED" if outcome == "failed" else "FINISHED")
        try:
            best = result.get_best_result()
            self.client.set_tag(self.parent_run_id, "modelhopper.best_config_id", str(best.config_id))
            for k, v in _finite(best.metrics).items():
                self.client.log_metric(self.parent_run_id, f"best_{k}", v)
        except LookupError:
            pass  # no config succeeded: the parent run says so through its children's outcomes
        self.client.set_terminated(self.parent_run_id, "FINISHED")
