"""What a model-selection run returns: DataFrames read from the run's catalog, and the trained weights."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from framework.engine.catalog import SQLiteCatalog
from framework.engine.checkpoint import CheckpointStore
from framework.trainable import Trainable

CATALOG_FILE = "run.db"
CHECKPOINT_DIR = "checkpoints"


class Result:
    """The outcome of a run, derived from its storage directory (so it can be re-opened later with `Result.open`).

    Attributes:
        storage_path: the run's directory.
        metrics: long DataFrame, one row per (config_id, epoch): `train_*` and `valid_*` metric columns.
        schedule: one row per executed unit: config_id, epoch, partition, worker, kind (train/eval), start, end
            (seconds since the run started), plus round, num_examples, state_bytes.
        configs: id -> config dict.
        status: DataFrame of config_id, status, epochs, parent, error (tracebacks of failed configs).
        events: failures, restarts, joins, drains, resumes: time, t (seconds since the run started), kind, detail.
        metric, mode: what `best_config_id` ranks by (the latest epoch of each non-failed config).
        meta: the run's settings as recorded at its start (executor, scheduler, workers, seed, functions, ...).
    """

    def __init__(self, storage_path: str, model_fn: Callable | None = None) -> None:
        self.storage_path = storage_path
        self._model_fn = model_fn
        catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE))
        try:
            meta = self.meta = catalog.meta()
            self.metric: str = meta.get("metric", "valid_loss")
            self.mode: str = meta.get("mode", "min")
            t0 = float(meta.get("start_time", 0.0))
            self.status = catalog.configs()
            self.configs: dict[int, dict[str, Any]] = dict(zip(self.status.config_id, self.status.config))
            self.metrics = catalog.epochs()
            units = catalog.units(status="done")
            units["start"] -= t0
            units["end"] -= t0
            self.schedule = units.drop(columns=["seq", "status", "error", "metrics"]).reset_index(drop=True)
            self.events = catalog.events()
            self.events.insert(1, "t", self.events.time - t0)
            self._checkpoints = {cid: catalog.checkpoints(cid) for cid in self.configs}
        finally:
            catalog.close()

    @classmethod
    def open(cls, storage_path: str, model_fn: Callable | None = None) -> Result:
        """Re-open a finished (or crashed) run's results from its directory."""
        if not os.path.exists(os.path.join(storage_path, CATALOG_FILE)):
            raise FileNotFoundError(f"`storage_path` {storage_path!r} holds no {CATALOG_FILE}: not a run directory")
        return cls(storage_path, model_fn)

    # ---- ranking ------------------------------------------------------------------------------------------------
    def leaderboard(self) -> pd.DataFrame:
        """Latest epoch of every config, best first (failed configs last)."""
        if self.metrics.empty:
            return pd.DataFrame(columns=["config_id", "epoch", self.metric, "status"])
        last = self.metrics.sort_values("epoch").groupby("config_id").tail(1).set_index("config_id")
        last = last.join(self.status.set_index("config_id")[["status"]])
        if self.metric not in last:
            raise ValueError(f"`metric` is {self.metric!r}, but the run reported only {sorted(self.metrics.columns)}")
        ok = last[last.status != "failed"].sort_values(self.metric, ascending=self.mode == "min", na_position="last")
        return pd.concat([ok, last[last.status == "failed"]]).reset_index()

    @property
    def best_config_id(self) -> int | None:
        board = self.leaderboard()
        board = board[board.status != "failed"]
        if board.empty or (isinstance(v := board.iloc[0][self.metric], float) and math.isnan(v)):
            return None
        return int(board.iloc[0]["config_id"])

    @property
    def best_config(self) -> dict[str, Any] | None:
        cid = self.best_config_id
        return None if cid is None else self.configs[cid]

    @property
    def failures(self) -> pd.DataFrame:
        """Failed configs with their tracebacks."""
        return self.status[self.status.status == "failed"][["config_id", "error"]].reset_index(drop=True)

    # ---- weights ------------------------------------------------------------------------------------------------
    def load_state(self, config_id: int) -> dict[str, Any]:
        """The latest verified checkpoint of a config: {"model": state_dict, "optimizer": ..., "visited": ...}."""
        if config_id not in self.configs:
            raise KeyError(f"`config_id` is {config_id!r}, but the run has configs {sorted(self.configs)}")
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE))
        try:
            state, _, _ = CheckpointStore(os.path.join(self.storage_path, CHECKPOINT_DIR), catalog).load_latest(config_id)
        finally:
            catalog.close()
        return state

    def load_model(self, config_id: int | None = None, model_fn: Callable | None = None) -> torch.nn.Module:
        """A config's model (default: the best) with its latest weights, built by `model_fn(config)`."""
        config_id = self.best_config_id if config_id is None else config_id
        model_fn = model_fn or self._model_fn
        if model_fn is None:
            raise ValueError("`model_fn` is None: pass the model_fn used for the run to build the model")
        model = Trainable.of(model_fn(self.configs[config_id])).model
        model.load_state_dict(self.load_state(config_id)["model"])
        return model

    # ---- files --------------------------------------------------------------------------------------------------
    def write(self) -> dict[str, str]:
        """Write metrics, schedule, configs and leaderboard as CSV (and Parquet) next to the run; return the paths."""
        paths = {}
        for name, df in (("metrics", self.metrics), ("schedule", self.schedule), ("leaderboard", self.leaderboard())):
            paths[name] = os.path.join(self.storage_path, f"{name}.csv")
            df.to_csv(paths[name], index=False)
            try:
                df.to_parquet(os.path.join(self.storage_path, f"{name}.parquet"), index=False)
            except (ImportError, ValueError):  # pyarrow missing or a column type it cannot store: CSV is enough
                pass
        paths["configs"] = os.path.join(self.storage_path, "configs.json")
        with open(paths["configs"], "w") as f:
            json.dump({str(k): v for k, v in self.configs.items()}, f, indent=1, default=str)
        return paths

    def __repr__(self) -> str:
        return (
            f"Result(storage_path={self.storage_path!r}, configs={len(self.configs)}, "
            f"best_config_id={self.best_config_id}, metric={self.metric!r}, mode={self.mode!r})"
        )
