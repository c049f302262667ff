"""The config table: every config of the run, and the one set of rules that applies a procedure's `Decision`.

Rules (the same for the engine, the simulator, replay and offline runs):
- `stop` of an ACTIVE config stops it (at the end of the epoch it is in, when it is in the middle of one: an epoch
  is never cut short); of a failed config, or of one a person stopped, does nothing (it may fail or be stopped
  between the procedure's look and its decision); of an unknown or already stopped id is an error
  (`DecisionError`): the procedure lost track.
- `add` entries get the next ids in order, then `clone` entries. A clone of an unknown id is an error. A clone
  starts from its source's state at the end of the source's last completed epoch, with an empty visit record: its
  own epochs count from 0.
- `resume` of a STOPPED config makes it ACTIVE again (the caller opens its units); of anything else is an error.
- A config a person steers (`owner == PERSON`: added, cloned or resumed by a command) is not the procedure's: its
  `stop` is ignored; the config stops at its own `budget` of epochs (or when a person stops it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from automl import ACTIVE, FAILED, PERSON, PROCEDURE, STOPPED, ConfigState, Decision
from framework.scheduling.units import UnitReport


@dataclass
class ConfigRecord:
    """The driver's view of one config."""

    id: int
    config: dict[str, Any]
    parent: int | None = None
    status: str = ACTIVE
    history: list[dict[str, float]] = field(default_factory=list)
    state: Any = None  # backend handle of the latest state (None before the first training unit)
    epoch_state: Any = None  # handle of the state at the end of the last completed epoch (what a clone copies)
    units: int = 0  # training units absorbed so far (all epochs)
    visited: dict[int, list[int]] = field(default_factory=dict)  # epoch -> partitions absorbed (the driver's mirror)
    failures: int = 0  # failures of user code so far
    open: int = 0  # units of the current epoch not completed yet (0: between epochs)
    stopping: bool = False  # the procedure stopped it while an epoch was open: it stops when that epoch ends
    outcome: str | None = None  # why it stopped: "completed" (its budget) or "pruned" (its results); None: active
    reports: list[UnitReport] = field(default_factory=list)  # the current epoch's completed units
    # (units, backend time) of its last checkpoint queued; the time starts at its first training unit
    checkpointed: tuple[int, float | None] = (-1, None)
    origin: str = PROCEDURE  # who added it: the procedure or a person (a command)
    owner: str = PROCEDURE  # who decides about it now (a person, once they added, cloned or resumed it)
    budget: int | None = None  # the epochs a config a person steers trains at most (None: the procedure decides)

    @property
    def epoch(self) -> int:
        """The epoch it trains now (or next)."""
        return len(self.history)

    def view(self) -> ConfigState:
        return ConfigState(self.id, dict(self.config), len(self.history), tuple(self.history), self.status, self.parent,
                           self.origin, self.owner)


#: the `outcome` of a config a person stopped (a procedure's stops say "completed" or "pruned")
BY_PERSON = "stopped"


class DecisionError(RuntimeError, ValueError):
    """A procedure's decision breaks the contract (see the module docstring)."""


class ConfigTable:
    """Every config ever added, by id."""

    def __init__(self) -> None:
        self.configs: dict[int, ConfigRecord] = {}

    def __getitem__(self, config_id: int) -> ConfigRecord:
        return self.configs[config_id]

    def __len__(self) -> int:
        return len(self.configs)

    def __iter__(self):
        return iter(self.configs.values())

    def add(self, record: ConfigRecord) -> None:
        self.configs[record.id] = record

    def active(self) -> list[ConfigRecord]:
        return [c for c in self.configs.values() if c.status == ACTIVE]

    def views(self) -> list[ConfigState]:
        return [self.configs[i].view() for i in sorted(self.configs)]

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.configs.values())

    def apply(self, decision: Decision, who: str) -> list[ConfigRecord]:
        """Apply `decision` (from procedure `who`) by the module's rules; returns the new configs, clones last
        (their `parent` names the source; the caller gives them the source's state)."""
        if not isinstance(decision, Decision):
            raise TypeError(f"{who}.step returned {decision!r}, but must return a Decision")
        for cid in decision.stop:
            status = self.configs[cid].status if cid in self.configs else "unknown"
            if status not in (ACTIVE, FAILED) and not (status == STOPPED and self.configs[cid].outcome == BY_PERSON):
                raise DecisionError(f"{who}: `stop` holds {cid!r}, but only ACTIVE ids can be stopped (it is {status})")
        for cid in decision.resume:
            status = self.configs[cid].status if cid in self.configs else "unknown"
            if status != STOPPED:
                raise DecisionError(f"{who}: `resume` holds {cid!r}, but only STOPPED ids can be resumed (it is "
                                    f"{status})")
        for source, _ in decision.clone:
            if source not in self.configs:
                raise DecisionError(f"{who}: `clone` names the source {source!r}, but no config has that id")
        pruned = set(decision.pruned)
        for cid in decision.stop:
            c = self.configs[cid]
            if c.status != ACTIVE or c.owner == PERSON:
                continue
            c.outcome = "pruned" if cid in pruned else "completed"
            if c.open:
                c.stopping = True
            else:
                c.status = STOPPED
        for cid in decision.resume:
            self.resume(self.configs[cid])
        new = []
        for source, cfg in [(None, cfg) for cfg in decision.add] + list(decision.clone):
            c = ConfigRecord(len(self.configs), dict(cfg), parent=source)
            self.configs[c.id] = c
            new.append(c)
        return new

    def resume(self, c: ConfigRecord, budget: int | None = None, owner: str = PROCEDURE) -> None:
        """A STOPPED config trains again (the caller opens its units): by the procedure's decision, or a person's
        (`owner` PERSON, with its `budget` of epochs)."""
        c.status, c.outcome, c.stopping = ACTIVE, None, False
        if owner == PERSON:
            c.owner, c.budget = PERSON, budget

    def fail(self, config_id: int) -> None:
        c = self.configs[config_id]
        c.status, c.stopping, c.open = FAILED, False, 0
