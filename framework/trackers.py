"""Trackers: callbacks that send each config's metrics to TensorBoard or MLflow (optional extras:
`pip install "modelhopper[tensorboard]"` or `"modelhopper[mlflow]"`). Both are `framework.Callback`s built on the
contract in `framework.callbacks`; `framework.TensorBoardCallback` and `framework.MLflowCallback` name them.

Epochs are 0-based everywhere: TensorBoard's and MLflow's `step` is the epoch index of `Result.metrics`.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

from framework.callbacks import Callback, RunInfo

if TYPE_CHECKING:
    from framework.result import Result


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
