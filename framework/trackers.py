"""Trackers: callbacks that send each config's metrics to TensorBoard, MLflow or Weights & Biases (optional extras:
`pip install "modelhopper[tensorboard]"`, `"modelhopper[mlflow]"` or `"modelhopper[wandb]"`). All are
`framework.Callback`s built on the contract in `framework.callbacks`; `framework.TensorBoardCallback`,
`framework.MLflowCallback` and `framework.WandbCallback` name them.

Epochs are 0-based everywhere: TensorBoard's, MLflow's and W&B's `step` is the epoch index of `Result.metrics`.
"""

from __future__ import annotations

import inspect
import math
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


#: what `WandbCallback` sets on every run itself (the rest of `wandb.init`'s keywords pass through `**init_kwargs`)
_WANDB_OWN = ("project", "mode", "dir", "group", "tags", "name", "id", "config", "reinit", "resume")
_WANDB_MODES = ("online", "offline", "disabled", "shared")


class WandbCallback(Callback):
    """Weights & Biases runs: one per config, in a group named after the selection run (as Ray Tune's
    `WandbLoggerCallback` groups its trials by experiment). A config's run is named `config_<id>`, holds the config
    as its W&B config (nested dicts kept: W&B shows `optim.lr`), a point per epoch with `step=epoch`, and its outcome
    in the summary (`modelhopper/outcome`: completed, pruned, failed, stopped); it is finished once its config ends,
    a failed config's with exit code 1 (W&B marks it failed), like the MLflow runs' FAILED status.

    A config ends at the procedure's decision to stop it (completed or pruned; a stop in the middle of an epoch
    after that epoch is logged), when it fails, or at the end of the run (the rest: a person's stop, the run's
    budget). A config trained again after its run finished (a procedure's `resume`) logs into the same W&B id.
    Run ids are `<run_id>-<config_id>`, stable across a resume of the selection run (`RunInfo.meta["run_id"]`), so
    online runs continue where a crashed driver left them.

    Args:
        project: the W&B project (default: W&B's, from `WANDB_PROJECT` or its own).
        mode: "online", "offline" (files only: `wandb sync <dir>/wandb/offline-run-*` uploads them later),
            "disabled" or "shared" (default: W&B's, from `WANDB_MODE` or online).
        dir: where W&B writes (it adds `wandb/`; default: the run's storage directory).
        group: the runs' group (default: the selection run's name, `RunInfo.name`).
        tags: tags of every run.
        **init_kwargs: more keywords of `wandb.init` (`entity`, `notes`, `job_type`, `settings`, ...). `settings`
            default to `{"console": "off", "silent": True}`: the driver's output is not copied into every config's
            run, and W&B prints nothing (its "syncing is set to offline" and "Run data is saved locally" lines would
            come once per config); pass `settings={"silent": False}` to see them. Online, `wandb.init` waits up to `settings.init_timeout` (90 s) and a finish until the config's data
            is uploaded (`settings.finish_timeout` bounds it).

    A W&B error switches the tracker off for the rest of the run (a warning and a `callback_failed` event, as for
    any callback) after finishing the runs it holds open; the selection goes on. Needs `wandb`
    (`pip install "modelhopper[wandb]"`).
    """

    def __init__(self, project: str | None = None, mode: str | None = None, dir: str | None = None,
                 group: str | None = None, tags: Sequence[str] | None = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError("WandbCallback needs Weights & Biases: pip install 'modelhopper[wandb]'") from e
        if mode is not None and mode not in _WANDB_MODES:
            raise ValueError(f"`mode` is {mode!r}, but must be one of {list(_WANDB_MODES)} (or None: W&B's default)")
        for name, value in (("project", project), ("dir", dir), ("group", group)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"`{name}` is {value!r}, but must be a str (or None)")
        if tags is not None and (isinstance(tags, str) or not all(isinstance(t, str) for t in tags)):
            raise TypeError(f"`tags` is {tags!r}, but must be a list of str (or None)")
        accepted = set(inspect.signature(wandb.init).parameters) - set(_WANDB_OWN)
        for key in init_kwargs:
            if key in _WANDB_OWN:
                raise TypeError(f"`{key}` is set by WandbCallback for each config's run: it cannot be passed on to "
                                "wandb.init")
            if key not in accepted:
                raise TypeError(f"`{key}` is not a keyword of wandb.init: pass one of {sorted(accepted)}")
        self._wandb = wandb
        self.project, self.mode, self.tags = project, mode, list(tags) if tags is not None else None
        self._dir_arg, self._group_arg = dir, group
        self.dir, self.group = dir, group
        self.init_kwargs = init_kwargs
        self.runs: dict[int, Any] = {}  # config_id -> its open W&B run
        self.outcomes: dict[int, str] = {}  # config_id -> the outcome its finished run was given
        self._prefix = ""
        self._ended: set[int] = set()  # configs whose epoch ended since the last decision (between epochs now)
        self._pending: dict[int, str] = {}  # stopped in the middle of an epoch: finished after that epoch

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """A W&B error finishes the runs held open (the callback list then switches the tracker off) and goes on up."""
        try:
            yield
        except Exception:
            for cid in list(self.runs):
                try:
                    self.runs.pop(cid).finish(exit_code=1)
                except Exception:  # noqa: BLE001, S110 - the first error is the one reported
                    pass
            raise

    def on_run_start(self, run: RunInfo) -> None:
        self.dir = os.fspath(self._dir_arg) if self._dir_arg is not None else run.storage_path
        self.group = self._group_arg or run.name or os.path.basename(run.storage_path.rstrip(os.sep))
        self._prefix = str(run.meta.get("run_id") or secrets.token_hex(8))
        self.runs, self.outcomes, self._ended, self._pending = {}, {}, set(), {}  # an instance may serve several runs

    def _run(self, config_id: int, config: dict[str, Any]) -> Any:
        if config_id not in self.runs:
            kwargs = dict(self.init_kwargs)
            settings = kwargs.pop("settings", None)
            if settings is None or isinstance(settings, dict):
                settings = {"console": "off", "silent": True, **(settings or {})}
            os.makedirs(self.dir, exist_ok=True)
            self.runs[config_id] = self._wandb.init(
                project=self.project, mode=self.mode, dir=self.dir, group=self.group, tags=self.tags,
                name=f"config_{config_id}", id=f"{self._prefix}-{config_id}", resume="allow", config=dict(config),
                reinit="create_new", settings=settings, **kwargs)
            self.outcomes.pop(config_id, None)
        return self.runs[config_id]

    def _finish(self, config_id: int, outcome: str) -> None:
        run = self.runs.pop(config_id)
        self._pending.pop(config_id, None)
        self.outcomes[config_id] = outcome
        run.summary["modelhopper/outcome"] = outcome
        run.finish(exit_code=1 if outcome == "failed" else 0)

    def on_epoch_end(self, config_id: int, epoch: int, metrics: dict[str, float], config: dict[str, Any]) -> None:
        with self._guard():
            self._run(config_id, config).log(_finite(metrics), step=epoch)
            self._ended.add(config_id)
            if config_id in self._pending:
                self._finish(config_id, self._pending[config_id])

    def on_decision(self, round: int, decision: Any) -> None:
        with self._guard():
            pruned = set(decision.pruned)
            for cid in decision.stop:
                if cid not in self.runs:
                    continue  # it failed (finished already) or ended before its first epoch (it has no run)
                outcome = "pruned" if cid in pruned else "completed"
                if cid in self._ended:
                    self._finish(cid, outcome)
                else:
                    self._pending[cid] = outcome
            for cid in decision.resume:
                self._pending.pop(cid, None)
            self._ended.clear()

    def on_event(self, kind: str, detail: dict[str, Any]) -> None:
        if kind == "config_failed" and detail.get("config_id") in self.runs:
            with self._guard():
                self._finish(detail["config_id"], "failed")

    def on_run_end(self, result: Result) -> None:
        with self._guard():
            status = result.status.set_index("config_id").status.to_dict()
            for cid in sorted(self.runs):
                self._finish(cid, status.get(cid, "unknown"))
