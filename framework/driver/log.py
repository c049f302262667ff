"""Where the driver writes what happened: the schedule log, events, commits and checkpoints.

`SQLiteRunLog` is a run directory (the catalog `run.db` and the checkpoint store): it survives a crash and is what
resume, replay and `Result` read. `MemoryRunLog` keeps the same records in lists, for simulations and offline runs
that want a thousand unit events per millisecond and no files; its checkpoints are the states themselves. Both keep
the run-log contract, `framework.driver._base.RunLog` (what is atomic, who writes, what a checkpoint promises).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from framework.scheduling import Unit
from framework.scheduling.units import UnitReport
from framework.store.catalog import SQLiteCatalog
from framework.store.checkpoint import CheckpointStore, CorruptCheckpointError
from framework.store.signing import dumps_signed

UNIT_COLUMNS = ["config_id", "epoch", "partition", "worker", "kind", "start", "end", "group"]


class SQLiteRunLog:
    """The run directory's catalog and checkpoint store behind the driver's calls."""

    def __init__(self, catalog: SQLiteCatalog, checkpoints: CheckpointStore) -> None:
        self.catalog, self.checkpoints = catalog, checkpoints

    def add_unit(self, round_: int, report: UnitReport, status: str) -> None:
        self.catalog.add_unit(round_, report, status=status)

    def mark_lost(self, units: Iterable[Unit]) -> None:
        self.catalog.mark_units(self.catalog.unit_seqs(list(units)), "lost")

    def mark_seqs(self, seqs: list[int], status: str) -> None:
        self.catalog.mark_units(seqs, status)

    def add_event(self, kind: str, **detail: Any) -> None:
        self.catalog.add_event(kind, **detail)

    def fail_config(self, config_id: int, error: str) -> None:
        self.catalog.update_config(config_id, status="failed", error=error)

    def commit(self, round_: int, epochs: list, statuses: list, new_configs: list, procedure: Any) -> None:
        self.catalog.commit_round(round_, epochs=epochs, statuses=statuses, new_configs=new_configs,
                                  procedure=dumps_signed(procedure))

    def record_command(self, detail: dict[str, Any], statuses: list, new_configs: list, procedure: Any = None,
                       round_: int = 0) -> None:
        """An applied command's event with what it changed (config rows, the procedure's state), in one transaction."""
        signed = (round_, dumps_signed(procedure)) if procedure is not None else None
        self.catalog.record_command(detail, statuses=statuses, new_configs=new_configs, procedure=signed)

    def done_units(self, config_id: int, epoch: int) -> list[tuple[int, UnitReport]]:
        """`(seq, report)` of the config's units of `epoch` logged done, in log order."""
        rows = self.catalog.units(status="done")
        rows = rows[(rows.config_id == config_id) & (rows.epoch == epoch)]
        return [(int(r.seq), UnitReport(Unit(config_id, epoch, int(r.partition), r.kind), int(r.worker), r.start,
                                        r.end, json.loads(r.metrics) if r.metrics else {}, int(r.num_examples),
                                        int(r.state_bytes))) for r in rows.itertuples()]

    def checkpoint(self, config_id: int, epoch: int, units: int, backend: Any, handle: Any,
                   worker: int | None = None) -> None:
        """Queue the state behind `handle` (produced on `worker`) to be written by the backend."""
        path = self.checkpoints.path(config_id, units)
        self.checkpoints.submit(config_id, epoch, units, started=backend.save(handle, path, worker))

    def flush(self) -> list[str]:
        return self.checkpoints.flush()

    def load_latest(self, config_id: int) -> tuple[dict[str, Any], int, int]:
        return self.checkpoints.load_latest(config_id)


@dataclass
class MemoryRunLog:
    """The same records in memory. `schedule()` gives the done units in the validator's columns."""

    units: list[tuple[int, UnitReport, str]] = field(default_factory=list)  # (round, report, status)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    epochs: list[tuple[int, int, int, dict[str, float]]] = field(default_factory=list)  # (config, epoch, round, m)
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    rounds: int = 0
    record_events: bool = True
    _ckpts: dict[int, tuple[int, int, Callable[[], dict]]] = field(default_factory=dict)

    def add_unit(self, round_: int, report: UnitReport, status: str) -> None:
        self.units.append((round_, report, status))

    def mark_lost(self, units: Iterable[Unit]) -> None:
        gone = set(units)
        self.units = [(r, rep, "lost" if st == "done" and rep.unit in gone else st) for r, rep, st in self.units]

    def mark_seqs(self, seqs: list[int], status: str) -> None:
        for i in seqs:
            r, rep, _ = self.units[i]
            self.units[i] = (r, rep, status)

    def add_event(self, kind: str, **detail: Any) -> None:
        if self.record_events:
            self.events.append((kind, detail))

    def fail_config(self, config_id: int, error: str) -> None:
        self.configs.setdefault(config_id, {}).update(status="failed", error=error)

    def commit(self, round_: int, epochs: list, statuses: list, new_configs: list, procedure: Any) -> None:
        for cid, epoch, metrics in epochs:
            self.epochs.append((cid, epoch, round_, metrics))
        for cid, status, n, outcome in statuses:
            self.configs.setdefault(cid, {}).update(status=status, epochs=n, outcome=outcome)
        for cid, config, parent, first in new_configs:
            self.configs[cid] = {"config": config, "parent": parent, "first_round": first, "status": "active",
                                 "epochs": 0}
        self.rounds += 1

    def record_command(self, detail: dict[str, Any], statuses: list, new_configs: list, procedure: Any = None,
                       round_: int = 0) -> None:
        self.commit(round_, [], statuses, new_configs, None)
        self.rounds -= 1  # not a round
        self.add_event("command", **detail)

    def done_units(self, config_id: int, epoch: int) -> list[tuple[int, UnitReport]]:
        return [(i, rep) for i, (_, rep, st) in enumerate(self.units)
                if st == "done" and rep.unit.config_id == config_id and rep.unit.epoch == epoch]

    def checkpoint(self, config_id: int, epoch: int, units: int, backend: Any, handle: Any,
                   worker: int | None = None) -> None:
        self._ckpts[config_id] = (epoch, units, lambda: backend.get(handle, self_contained=True))

    def flush(self) -> list[str]:
        return []

    def load_latest(self, config_id: int) -> tuple[dict[str, Any], int, int]:
        if config_id not in self._ckpts:
            raise CorruptCheckpointError(f"no valid checkpoint for config {config_id}: none written")
        epoch, units, fetch = self._ckpts[config_id]
        return fetch(), epoch, units

    def schedule(self, status: str = "done") -> pd.DataFrame:
        rows = [(r.unit.config_id, r.unit.epoch, r.unit.partition, r.worker, r.unit.kind, r.start, r.end, r.group)
                for _, r, st in self.units if st == status]
        return pd.DataFrame(rows, columns=UNIT_COLUMNS)
