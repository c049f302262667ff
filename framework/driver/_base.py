"""The run-log contract: what the driver loop writes about a run, and what it may read back.

`RunState.log` is a `RunLog`. Two implementations keep it: `framework.driver.log.SQLiteRunLog` (the run directory's
catalog and checkpoint store: what resume, replay and `Result` read) and `framework.driver.log.MemoryRunLog` (lists in
memory, for simulations and offline runs). A new store (another database, a remote service) implements these methods
and nothing else; the loop never reaches past them.

What an implementation promises:
- One writer. Only the driver loop writes, from one thread, one call at a time (a run directory admits one driver:
  `framework.store.lock.writer_lock`). An implementation need not be thread-safe for its writes.
- Atomic records. `add_unit`, `add_event`, `fail_config` and `mark_*` each land whole or not at all. `commit` writes a
  round (its epochs' metrics, config statuses, new configs and the procedure's signed state) in one transaction, and
  `record_command` a command's event with what it changed in one: after a crash, a reader sees the round (or the
  command) entirely or not at all. That is what makes a resume re-run nothing that was committed.
- Order. Records are kept in the order they were written; `done_units` gives a config's done units of an epoch in
  that order (replay re-runs them in it).
- Checkpoints off the loop's path. `checkpoint` only queues a state; it may be written later, by another thread, and
  a newer state of the same config may replace one still queued (only the newest must reach the store). `flush`
  waits until every queued state is stored and returns the write errors seen. `load_latest` gives the newest stored
  state that verifies, or raises `framework.store.checkpoint.CorruptCheckpointError` when none does.
- Ownership. The log owns what it stores: the loop passes values (reports, dicts, the procedure to be signed) and keeps
  no reference into the store; a handle given to `checkpoint` stays the backend's.

This module imports no implementation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from framework.scheduling.units import Unit, UnitReport


class RunLog(Protocol):
    """Where the driver loop records a run (see the module docstring for what an implementation promises)."""

    def add_unit(self, round_: int, report: UnitReport, status: str) -> None:
        """A unit's row: its report (unit, worker, times, metrics) and `status` ("done", "failed", "lost", ...)."""

    def mark_lost(self, units: Iterable[Unit]) -> None:
        """The done rows of `units` become "lost": their results were lost with a state (they run again)."""

    def mark_seqs(self, seqs: list[int], status: str) -> None:
        """The rows numbered `seqs` (as `done_units` gives them) get `status`."""

    def add_event(self, kind: str, **detail: Any) -> None:
        """An event of the run (`kind` and its JSON-able detail)."""

    def fail_config(self, config_id: int, error: str) -> None:
        """Config `config_id` failed in user code with `error` (its traceback)."""

    def commit(self, round_: int, epochs: list, statuses: list, new_configs: list, procedure: Any) -> None:
        """Round `round_`, in one transaction: `epochs` [(config, epoch, metrics)], `statuses` [(config, status,
        epochs, outcome)], `new_configs` [(config, config dict, parent, first round)] and the procedure's state."""

    def record_command(self, detail: dict[str, Any], statuses: list, new_configs: list, procedure: Any = None,
                       round_: int = 0) -> None:
        """An applied command's event with what it changed (as `commit`'s lists, and the procedure's state when it
        changed), in one transaction."""

    def done_units(self, config_id: int, epoch: int) -> list[tuple[int, UnitReport]]:
        """`(seq, report)` of the config's units of `epoch` logged done, in log order."""

    def checkpoint(self, config_id: int, epoch: int, units: int, backend: Any, handle: Any,
                   worker: int | None = None) -> None:
        """Queue the state behind the backend's `handle` (made on `worker`), after `units` training units."""

    def flush(self) -> list[str]:
        """Wait until every queued checkpoint is stored; the write errors seen so far."""

    def load_latest(self, config_id: int) -> tuple[dict[str, Any], int, int]:
        """(state, epoch, units) of the config's newest stored checkpoint that verifies."""
