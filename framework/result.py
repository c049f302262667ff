"""What a model-selection run returns: DataFrames read from the run's catalog, and the trained weights."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from framework import stoppers
from framework.store.catalog import (  # noqa: F401 - CATALOG_FILE, CHECKPOINT_DIR, OUTCOMES: callers import them here
    CATALOG_FILE,
    CHECKPOINT_DIR,
    OUTCOMES,
    CatalogError,
    SQLiteCatalog,
    UnverifiedRunWarning,
    config_outcome,
    describe_problems,
)
from framework.store.checkpoint import load_latest_verified

if TYPE_CHECKING:  # torch is imported where a model is built (the command line's reading of runs does not pay for it)
    import torch

SCOPES = ("last", "all", "avg", "last-5-avg", "last-10-avg")  # and any "last-N-avg"
logger = logging.getLogger(__name__)


def _scope_window(scope: str) -> int | None:
    """How many last epochs a scope averages (0: all), or None for a scope that ranks one epoch. An N in
    "last-N-avg" beyond a config's epochs averages all of them, as "avg" does; so does any N of more than 9 digits
    (no config trains a billion epochs, and pandas takes no N beyond a C long)."""
    if not isinstance(scope, str):
        raise TypeError(f"`scope` is {scope!r}, but must be a str: one of {list(SCOPES)} or 'last-N-avg'")
    if scope in ("last", "all"):
        return None
    if scope == "avg":
        return 0
    parts = scope.split("-")
    if len(parts) == 3 and parts[0] == "last" and parts[2] == "avg" and parts[1].isascii() and parts[1].isdigit():
        digits = parts[1].lstrip("0")
        if digits:
            return int(digits) if len(digits) <= 9 else 0
    raise ValueError(f"`scope` is {scope!r}, but must be one of {list(SCOPES)} or 'last-N-avg' with N >= 1 (in "
                     "digits 0-9)")


def pareto_ranks(values: np.ndarray) -> np.ndarray:
    """Non-dominated sorting (NSGA-II's): for an `(n, k)` array of objectives to minimise, each row's front, 0 for the
    Pareto front (no other row is at least as good in every objective and better in one), 1 for the front once
    those are removed, and so on."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    ranks = np.full(n, -1, dtype=int)
    if n == 0:
        return ranks
    le = (values[:, None, :] <= values[None, :, :]).all(axis=2)
    lt = (values[:, None, :] < values[None, :, :]).any(axis=2)
    dominates = le & lt  # [i, j]: row i dominates row j
    beaten_by = dominates.sum(axis=0)
    front, rank = np.flatnonzero(beaten_by == 0), 0
    while front.size:
        ranks[front] = rank
        beaten_by = beaten_by - dominates[front].sum(axis=0)
        beaten_by[ranks >= 0] = -1
        front, rank = np.flatnonzero(beaten_by == 0), rank + 1
    return ranks


class NoResultError(LookupError):
    """The run has no config to pick: every config failed, or none reported the metric."""


@dataclass
class ConfigResult:
    """One config of a run: what `Result.get_best_result` returns.

    Attributes:
        config_id, config, status: the config and how it ended (`completed`, `pruned`, `failed`, `active`).
        epoch: the epoch (0-based) whose metrics `metrics` holds.
        metrics: that epoch's metrics (`train_*`, `valid_*`).
        epochs: how many epochs it trained.
    """

    config_id: int
    config: dict[str, Any]
    status: str
    epoch: int
    metrics: dict[str, float]
    epochs: int
    _result: Result | None = field(default=None, repr=False)

    def load_model(self, model_fn: Callable | None = None) -> torch.nn.Module:
        """This config's model with its latest weights (see `Result.load_model`)."""
        return self._result.load_model(self.config_id, model_fn)

class Result:
    """The outcome of a run, derived from its storage directory (so it can be re-opened later with `Result.open`).

    Epochs are numbered from 0 everywhere (`metrics`, `schedule`, the CLI, trackers and Optuna's trial steps): epoch e
    is a config's (e + 1)-th pass over the data, and `epochs` counts them.

    Attributes:
        storage_path: the run's directory.
        metrics: long DataFrame, one row per (config_id, epoch): `train_*` and `valid_*` metric columns, then one
            `config/<name>` column per hyper-parameter (a nested config's flattened: `config/optim/lr`).
        schedule: one row per executed unit: config_id, epoch, partition, worker, kind (train/eval), start, end
            (seconds since the run started), plus round, num_examples (what that row's worker trained or evaluated:
            a gang's workers that shared a partition's pass count their own share), state_bytes.
        configs: id -> config dict.
        status: DataFrame of config_id, status (one of `OUTCOMES`), epochs, parent, error (tracebacks of failed
            configs).
        events: failures, restarts, joins, drains, resumes: time, t (seconds since the run started), kind, detail.
        metric, mode: what `best_config_id` ranks by (the latest epoch of each non-failed config).
        meta: the run's settings as recorded at its start (executor, scheduler, workers, seed, functions, ...).

    A Result opened from a URI reads a temporary local copy of the run (checkpoints included, for `load_model`): it
    is removed by `close()`, at the end of a `with Result.open(uri) as result:` block, when the Result is garbage
    collected, or at interpreter exit, whichever comes first. A Result of a local directory holds nothing to remove.
    """

    def __init__(self, storage_path: str, model_fn: Callable | None = None) -> None:
        self.storage_path = storage_path
        self._model_fn = model_fn
        self._copy: weakref.finalize | None = None  # removes a temporary copy this Result reads (see `open`)
        catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE), readonly=True)
        try:
            with catalog.snapshot():  # what is read is what was verified, also while a writer goes on
                self._verify_and_read(catalog)
        finally:
            catalog.close()

    def _verify_and_read(self, catalog: SQLiteCatalog) -> None:
        self.unverified: list[str] = catalog.verify()
        if self.unverified:
            warnings.warn(UnverifiedRunWarning(
                f"the run in {self.storage_path!r} is not verified: {describe_problems(self.unverified)}. Its "
                "numbers may not be what it computed; resume and replay refuse it unless trust_unverified=True "
                "(see the threat model in docs/security.md)"), stacklevel=3)
        try:
            self._read(catalog)
        except (CatalogError, ValueError, TypeError, KeyError, AttributeError) as e:
            if not self.unverified:
                raise
            raise CatalogError(f"the run in {self.storage_path!r} is not verified and cannot be read: {e}") from e

    @property
    def verified(self) -> bool:
        """Whether every row of the run's catalog verified under this machine's key (see `unverified`)."""
        return not self.unverified

    @property
    def ended_by(self) -> str | None:
        """Why the run's last session ended before the run finished: its time budget was spent (e.g.
        `"time_budget_s=60"`; resume it with a larger one), else None (`framework.stoppers.ended_by`)."""
        return stoppers.ended_by(list(zip(self.events.kind, self.events.detail)))

    @property
    def stop_reasons(self) -> pd.DataFrame:
        """config_id, epochs, reason of every config the run's stopper stopped (config_id None: a run-wide stop)."""
        rows = stoppers.stop_reasons(list(zip(self.events.kind, self.events.detail)))
        return pd.DataFrame(rows, columns=["config_id", "epochs", "reason"])

    def _read(self, catalog: SQLiteCatalog) -> None:
        meta = self.meta = catalog.meta()
        if not meta:
            warnings.warn(f"the run in {self.storage_path!r} has no meta (its run.db meta table is empty: emptied, or "
                          "the run never started): its settings are unknown and `metric`/`mode` default to "
                          "'valid_loss'/'min'", stacklevel=4)
        self.metric: str = meta.get("metric", "valid_loss")
        self.mode: str = meta.get("mode", "min")
        t0 = float(meta.get("start_time", 0.0))
        configs = catalog.configs()
        self.configs: dict[int, dict[str, Any]] = dict(zip(configs.config_id, configs.config))
        configs["status"] = [config_outcome(s, o) for s, o in zip(configs.status, configs.outcome)]
        self.status = configs.drop(columns=["config", "outcome"])
        self.metrics = self._with_config_columns(catalog.epochs())
        units = catalog.units(status="done")
        units["start"] -= t0
        units["end"] -= t0
        self.schedule = units.drop(columns=["seq", "status", "error", "metrics"]).reset_index(drop=True)
        self.events = catalog.events()
        self.events.insert(1, "t", self.events.time - t0)

    @classmethod
    def open(cls, storage_path: str, model_fn: Callable | None = None) -> Result:
        """Re-open a finished (or crashed) run's results from its directory (also one copied or moved elsewhere), or
        from the URI it was mirrored to (fetched into its local working copy first). Opening reads only: nothing is
        written into the run."""
        from framework.store.storage import RunStorage, is_uri

        if not is_uri(storage_path):
            if not os.path.exists(os.path.join(storage_path, CATALOG_FILE)):
                raise FileNotFoundError(f"`storage_path` {storage_path!r} holds no {CATALOG_FILE}: not a run directory")
            return cls(storage_path, model_fn)
        copy = RunStorage(storage_path, "opened").fetch()  # a fresh copy: never a working copy in use
        try:
            result = cls(copy, model_fn)
        except BaseException:
            shutil.rmtree(copy, ignore_errors=True)
            raise
        result._copy = weakref.finalize(result, shutil.rmtree, copy, ignore_errors=True)
        return result

    def close(self) -> None:
        """Remove the temporary copy of a run opened from a URI (a no-op otherwise, and when called again). The
        DataFrames stay readable; loading weights needs the run opened again."""
        if self._copy is not None:
            self._copy()

    def __enter__(self) -> Result:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _with_config_columns(self, metrics: pd.DataFrame) -> pd.DataFrame:
        """`metrics` with one `config/<name>` column per hyper-parameter (as Ray Tune's `get_dataframe`); a nested
        config's are flattened, `config/optim/lr`."""
        flat = {cid: _flat_config(c) for cid, c in self.configs.items()}
        names = sorted({k for c in flat.values() for k in c})
        if metrics.empty:
            return metrics.reindex(columns=[*metrics.columns, *(f"config/{k}" for k in names)])
        cols = {f"config/{k}": metrics.config_id.map(lambda cid, k=k: _cell(flat[cid].get(k))) for k in names}
        return pd.concat([metrics, pd.DataFrame(cols, index=metrics.index)], axis=1)

    # ---- ranking ------------------------------------------------------------------------------------------------
    def _check_ranking(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        given = metric
        metric = metric or self.metric
        if not self.metrics.empty and metric not in self.metrics:
            reported = sorted(c for c in self.metrics.columns if c.startswith(("train_", "valid_")))
            raise ValueError(f"`metric` is {metric!r}, but the run reported only {reported}")
        if given is not None and given != self.metric and mode is None:  # the run's mode belongs to its metric
            raise ValueError(f"`metric` is {given!r}, but `mode` is not given: the run ranks {self.metric!r} with "
                             f"mode {self.mode!r}, which says nothing of {given!r}; pass mode='min' or mode='max'")
        mode = mode or self.mode
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
        return metric, mode

    def _check_objectives(self, metric: list[str], mode: Any) -> tuple[list[str], list[str]]:
        if not isinstance(mode, (list, tuple)) or len(mode) != len(metric):
            raise ValueError(f"`mode` is {mode!r}, but `metric` is a list of {len(metric)} metrics: pass a list of as "
                             "many modes ('min' or 'max'), one per metric")
        if not metric:
            raise ValueError("`metric` is [], but a list of metrics must name at least one")
        pairs = [self._check_ranking(m, d) for m, d in zip(metric, mode)]
        return [m for m, _ in pairs], [d for _, d in pairs]

    def get_dataframe(self, metric: str | list[str] | None = None, mode: str | list[str] | None = None,
                      scope: str = "last") -> pd.DataFrame:
        """One row per config, best first (failed configs last): its last epoch (`scope="last"`), its best epoch
        by `metric` (`scope="all"`), or its last epoch ranked by the mean of `metric` over all its epochs
        (`scope="avg"`) or over its last N (`scope="last-N-avg"`, as in Ray Tune), that mean in a `score` column;
        with its metrics, `config/<name>` columns, status and epochs trained. `metric`/`mode` default to the run's.

        Several objectives: `metric` and `mode` lists of equal length (e.g. `["valid_loss", "valid_time_s"]`,
        `["min", "min"]`) rank by Pareto dominance instead: a `pareto_rank` column holds each config's front (0: the
        Pareto front, no other config is at least as good in every metric and better in one; 1: the front once
        those are removed; ...), rows sorted by it (then by the first metric); with an averaging scope the means
        are `score/<metric>` columns. Failed configs and configs missing a value have no rank and come last."""
        if isinstance(metric, (list, tuple)):
            return self._pareto_dataframe(*self._check_objectives(list(metric), mode), scope)
        if isinstance(mode, (list, tuple)):
            raise ValueError(f"`mode` is {mode!r}, a list, but `metric` is {metric!r}: pass a list of metrics too")
        metric, mode = self._check_ranking(metric, mode)
        window = _scope_window(scope)
        status = self.status.set_index("config_id")[["status", "epochs"]].rename(columns={"epochs": "epochs_trained"})
        if self.metrics.empty:
            return pd.DataFrame(columns=["config_id", "epoch", metric, "status", "epochs_trained"])
        m = self.metrics.sort_values(["config_id", "epoch"])
        key = metric
        if scope == "all":
            ranked = m.sort_values(metric, ascending=mode == "min", na_position="last", kind="stable")
            rows = ranked.groupby("config_id").head(1)
        else:
            rows = m.groupby("config_id").tail(1)
        if window is not None:  # the mean of the last `window` epochs (0: all of them), NaNs left out
            tail = m.groupby("config_id").tail(window) if window else m
            rows = rows.assign(score=rows.config_id.map(tail.groupby("config_id")[metric].mean()))
            key = "score"
        rows = rows.set_index("config_id").join(status)
        ok = rows[rows.status != "failed"].sort_values(key, ascending=mode == "min", na_position="last",
                                                       kind="stable")
        return pd.concat([ok, rows[rows.status == "failed"]]).reset_index()

    def _pareto_dataframe(self, metrics: list[str], modes: list[str], scope: str) -> pd.DataFrame:
        if scope == "all":
            raise ValueError("`scope` is 'all', but with several metrics a config has no single best epoch: use "
                             "'last', 'avg' or 'last-N-avg'")
        window = _scope_window(scope)
        status = self.status.set_index("config_id")[["status", "epochs"]].rename(columns={"epochs": "epochs_trained"})
        if self.metrics.empty:
            return pd.DataFrame(columns=["config_id", "epoch", *metrics, "pareto_rank", "status", "epochs_trained"])
        m = self.metrics.sort_values(["config_id", "epoch"])
        rows = m.groupby("config_id").tail(1)
        keys = list(metrics)
        if window is not None:
            tail = m.groupby("config_id").tail(window) if window else m
            means = tail.groupby("config_id")[metrics].mean()
            keys = [f"score/{k}" for k in metrics]
            rows = rows.assign(**{key: rows.config_id.map(means[k]) for key, k in zip(keys, metrics)})
        rows = rows.set_index("config_id").join(status)
        signs = np.array([1.0 if d == "min" else -1.0 for d in modes])
        values = rows[keys].to_numpy(dtype=float) * signs
        ranked = (rows.status != "failed").to_numpy() & np.isfinite(values).all(axis=1)
        rank = pd.Series(pd.NA, index=rows.index, dtype="Int64")
        rank[ranked] = pareto_ranks(values[ranked])
        rows.insert(rows.columns.get_loc("status"), "pareto_rank", rank)
        first = values[:, 0]
        order = np.lexsort((rows.index.to_numpy(), np.where(np.isnan(first), np.inf, first),
                            rank.fillna(np.iinfo(np.int64).max).to_numpy()))
        return rows.iloc[order].reset_index()

    def leaderboard(self) -> pd.DataFrame:
        """Latest epoch of every config, best first by the run's metric (failed configs last)."""
        return self.get_dataframe()

    def get_best_result(self, metric: str | None = None, mode: str | None = None, scope: str = "last") -> ConfigResult:
        """The best config by `metric`/`mode` (default: the run's) at its last epoch (`scope="last"`), its best
        epoch (`scope="all"`), or by the mean over all or its last N epochs (`scope="avg"`, `"last-N-avg"`). A `metric` other than the run's needs its `mode` (a `ValueError` otherwise: the run's
        mode would silently rank it the wrong way round). Raises `NoResultError` when no config has a finite value
        of the metric. Several metrics have no single best: `get_best_results` returns their Pareto front."""
        if isinstance(metric, (list, tuple)) or isinstance(mode, (list, tuple)):
            raise ValueError(f"`metric` is {metric!r}, but several metrics have no single best config: "
                             "get_best_results(metric=[...], mode=[...]) returns their Pareto front")
        metric, mode = self._check_ranking(metric, mode)
        board = self.get_dataframe(metric, mode, scope)
        board = board[(board.status != "failed") & board[metric].notna()] if metric in board else board.iloc[:0]
        if board.empty:
            failed = int((self.status.status == "failed").sum())
            raise NoResultError(
                f"no config of the run in {self.storage_path!r} has a value of {metric!r}: {len(self.configs)} "
                f"configs, {failed} failed (see `result.failures` for their tracebacks)")
        return self._config_result(board.iloc[0], board.columns)

    def get_best_results(self, metric: list[str], mode: list[str], scope: str = "last") -> list[ConfigResult]:
        """The Pareto front of several metrics (`get_dataframe(metric, mode, scope)`'s rows of `pareto_rank` 0), in
        that order: the configs no other config beats in every metric. Raises `NoResultError` when no config has a
        finite value of every metric."""
        if not isinstance(metric, (list, tuple)):
            raise ValueError(f"`metric` is {metric!r}, but must be a list of metrics (one metric: get_best_result)")
        board = self.get_dataframe(list(metric), mode, scope)
        front = board[board.pareto_rank == 0] if "pareto_rank" in board else board.iloc[:0]
        if front.empty:
            raise NoResultError(f"no config of the run in {self.storage_path!r} has a value of every one of "
                                f"{list(metric)}: {len(self.configs)} configs (see `result.failures`)")
        return [self._config_result(row, board.columns) for _, row in front.iterrows()]

    def _config_result(self, row: pd.Series, columns: pd.Index) -> ConfigResult:
        cid = int(row.config_id)
        metrics = {k: float(row[k]) for k in columns if k.startswith(("train_", "valid_")) and pd.notna(row[k])}
        return ConfigResult(cid, self.configs[cid], str(row.status), int(row.epoch), metrics,
                            int(row.epochs_trained), self)

    @property
    def best_config_id(self) -> int | None:
        """The best config's id by the run's metric (its last epoch), or None when none has a value."""
        try:
            return self.get_best_result().config_id
        except NoResultError:
            return None

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The best config (the dict it was trained with) by the run's metric, or None when none has a value."""
        cid = self.best_config_id
        return None if cid is None else self.configs[cid]

    @property
    def all_failed(self) -> bool:
        """Whether every config of the run failed (a run with configs, none of which trained to a result): its
        summary line says so, and the command line exits with 1 (`failures` holds the tracebacks)."""
        return bool(len(self.status)) and bool((self.status.status == "failed").all())

    @property
    def failures(self) -> pd.DataFrame:
        """Failed configs with their tracebacks."""
        return self.status[self.status.status == "failed"][["config_id", "error"]].reset_index(drop=True)

    @property
    def commands(self) -> pd.DataFrame:
        """Every command the run received (from this process or another: `framework.connect`), in the order it
        applied them: time `t` (seconds since the run started), `name`, `args`, `source`, `applied` and `outcome`
        (what it did, or why it rejected the command)."""
        given = self.events[self.events.kind == "command"] if not self.events.empty else self.events
        rows = [{"t": t, **{k: d.get(k) for k in ("name", "args", "source", "applied", "outcome")}}
                for t, d in zip(given.t, map(json.loads, given.detail))]
        return pd.DataFrame(rows, columns=["t", "name", "args", "source", "applied", "outcome"])

    # ---- weights ------------------------------------------------------------------------------------------------
    def load_state(self, config_id: int) -> dict[str, Any]:
        """The latest verified checkpoint of a config: {"model": state_dict, "optimizer": ..., "visited": ...,
        "checkpoint": {"path", "epoch", "units", "latest"}}, the last saying which file was loaded.

        A newer checkpoint that fails its checksum or the safe loader is skipped with a `UserWarning` naming it
        and the checkpoint loaded instead (`latest` is then False). Reads only: nothing is written into the run."""
        if config_id not in self.configs:
            raise KeyError(f"`config_id` is {config_id!r}, but the run has configs {sorted(self.configs)}")
        if self._copy is not None and not self._copy.alive:
            raise ValueError(f"this Result was closed: its copy of the run ({self.storage_path!r}) is removed; open "
                             "the run again with Result.open to load weights")
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE), readonly=True)
        try:
            state, epoch, units, skipped = load_latest_verified(catalog, config_id)
        finally:
            catalog.close()
        if skipped:
            warnings.warn(
                f"config {config_id}: loaded its checkpoint after {units} training units (epoch {epoch}), not its "
                f"latest: {'; '.join(reason for _, reason in skipped)}", stacklevel=2)
        else:
            logger.info("config %d: loaded its latest checkpoint %s (epoch %d, after %d training units)",
                        config_id, state["checkpoint"]["path"], epoch, units)
        return state

    # ---- the completeness proof ---------------------------------------------------------------------------------
    def check_completeness(self) -> pd.DataFrame:
        """Every config's completeness proof, checked: the visit record (`visited`) of its latest verified
        checkpoint against the schedule log (its done training units, a gang's step counted once per partition)
        and the epochs the run committed for it. One row per problem (config_id, epoch, rule, detail; empty: the
        proof holds), by the rules of `framework.completeness`: each finished epoch absorbed every partition
        exactly once, in the logged order; no visit that the log lacks (inherited), no done unit that the state
        lacks (lost); nothing after the epoch in progress. What may differ legitimately (a partial last epoch of a
        stopped or active config, a failed config's lagging state, re-run units, evaluation units) is described
        there. Reads every config's checkpoint (checksummed, weights-only); writes nothing."""
        from framework.completeness import as_frame

        return as_frame(self._completeness_problems())

    def _completeness_problems(self) -> list:
        """`check_completeness`'s problems, as `framework.completeness.CompletenessProblem`s."""
        from framework.completeness import CompletenessProblem, logged_visits, run_partitions, visit_problems
        from framework.store.checkpoint import CorruptCheckpointError

        if self._copy is not None and not self._copy.alive:
            raise ValueError(f"this Result was closed: its copy of the run ({self.storage_path!r}) is removed; open "
                             "the run again with Result.open to check its checkpoints")
        partitions = run_partitions(self.meta, self.schedule)
        logged = logged_visits(self.schedule)
        committed = ({} if self.metrics.empty else
                     {int(c): list(g) for c, g in self.metrics.groupby("config_id").epoch})
        problems = []
        catalog = SQLiteCatalog(os.path.join(self.storage_path, CATALOG_FILE), readonly=True)
        try:
            for cid, status, epochs in zip(self.status.config_id, self.status.status, self.status.epochs):
                cid = int(cid)
                try:
                    state, _, units, skipped = load_latest_verified(catalog, cid)
                    visited = state.get("visited") or {}
                except CorruptCheckpointError:  # none verifies, or none was written
                    visited, units, skipped = None, None, []
                if skipped and status != "failed":
                    problems.append(CompletenessProblem(cid, None, "stale", "its newest checkpoint does not verify, "
                                                        f"the proof read is older: {skipped[0][1]}"))
                problems += visit_problems(cid, status=status, epochs=int(epochs), partitions=partitions,
                                           visited=visited, units=units, logged=logged.get(cid, []),
                                           metric_epochs=committed.get(cid, []))
        finally:
            catalog.close()
        return problems

    def assert_complete(self) -> None:
        """Raise `IncompleteRunError` listing the problems `check_completeness` finds; return None when the run's
        completeness proof holds."""
        from framework.completeness import IncompleteRunError, describe

        problems = self._completeness_problems()
        if problems:
            raise IncompleteRunError(f"the run in {self.storage_path!r} fails its completeness check "
                                     f"({len(problems)} problems):\n{describe(problems)}")

    def load_model(self, config_id: int | None = None, model_fn: Callable | None = None) -> torch.nn.Module:
        """A config's model (default: the best) with its latest weights, built by `model_fn(config)`.

        Which file was loaded is logged (logger `framework.result`, INFO), or warned about when it is not the latest
        (see `load_state`, whose `["checkpoint"]` entry says the same)."""
        from framework.trainable import Trainable

        config_id = self.get_best_result().config_id if config_id is None else config_id
        model_fn = model_fn or self._model_fn or self._recorded_model_fn()
        model = Trainable.of(model_fn(self.configs[config_id])).model
        model.load_state_dict(self.load_state(config_id)["model"])
        return model

    def _recorded_model_fn(self) -> Callable:
        """The model_fn the run recorded (signed), imported: only when the run verifies."""
        ref = (self.meta.get("functions") or {}).get("model_fn")
        if ref is None:
            raise ValueError("`model_fn` is None and the run records none: pass the model_fn used for the run")
        if not self.verified:
            raise ValueError(f"`model_fn` is None and the run in {self.storage_path!r} does not verify, so the "
                             f"model_fn it names ({ref}) is not imported: pass model_fn=")
        from framework.trainable import import_ref

        return import_ref(ref, "model_fn", "load_model()")

    # ---- files --------------------------------------------------------------------------------------------------
    def write(self) -> dict[str, str]:
        """Write metrics, schedule, configs and leaderboard as CSV (and Parquet), and `learning_curves.png`, next to
        the run; return the paths."""
        from framework.plots import plot_learning_curves

        paths = {}
        for name, df in (("metrics", self.metrics), ("schedule", self.schedule), ("leaderboard", self.leaderboard())):
            with _replacing(self.storage_path, f"{name}.csv") as (tmp, paths[name]):
                df.to_csv(tmp, index=False)
            try:
                with _replacing(self.storage_path, f"{name}.parquet") as (tmp, _):
                    df.to_parquet(tmp, index=False)
            except (ImportError, ValueError):  # pyarrow missing or a column type it cannot store: CSV is enough
                pass
        with _replacing(self.storage_path, "configs.json") as (tmp, paths["configs"]), open(tmp, "w") as f:
            json.dump({str(k): v for k, v in self.configs.items()}, f, indent=1, default=str)
        with _replacing(self.storage_path, "learning_curves.png") as (tmp, paths["learning_curves"]):
            plot_learning_curves(self.metrics, tmp, self.metric, mode=self.mode, configs=self.configs,
                                 best=self.best_config_id)
        return paths

    def __repr__(self) -> str:
        return (
            f"Result(storage_path={self.storage_path!r}, configs={len(self.configs)}, "
            f"best_config_id={self.best_config_id}, metric={self.metric!r}, mode={self.mode!r})"
        )


@contextlib.contextmanager
def _replacing(folder: str, name: str) -> Iterator[tuple[str, str]]:
    """(a new temporary file, `folder/name`): what is written to the first replaces the second when the block ends,
    so a `name` planted as a link out of the run is replaced, never written through."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=os.path.splitext(name)[1], dir=folder)
    os.close(fd)
    try:
        yield tmp, os.path.join(folder, name)
        os.replace(tmp, os.path.join(folder, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's hyper-parameters by column name: a nested dict's joined with '/' (Ray Tune's `flatten_dict`, the
    names a nested space gives them); an empty dict stays one value."""
    flat: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            flat.update(_flat_config(v, f"{prefix}{k}/"))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def _cell(v: Any) -> Any:
    """A hyper-parameter as a DataFrame cell: scalars as they are, anything else as its JSON text."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
