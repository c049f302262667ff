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

A `ConfigRecord` owns its state: every change of it is one of its methods, named after the transition (open an epoch,
absorb a unit, close the epoch, stop, resume, fail, start from a clone's weights, reload or rewind to a checkpoint).
Handlers, commands and recovery call them and never assign its fields (`tests/framework/driver/test_state_owners.py`
keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from automl import ACTIVE, FAILED, PERSON, PROCEDURE, STOPPED, ConfigState, Decision
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitReport, epoch_metrics

#: the `outcome` of a config a person stopped (a procedure's stops say "completed" or "pruned"; the run's stopper's say
#: "stopped" too: `framework.driver.stopping`)
BY_PERSON = "stopped"


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
    outcome: str | None = None  # why it stopped: "completed" (its budget), "pruned" (its results) or "stopped" (a
    # person or the run's stopper); None: active
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

    # ---- transitions: the only places its fields change --------------------------------------------------------
    def open_epoch(self, units: int) -> bool:
        """Its next epoch (or the rest of one it was cut in) opens with `units` to complete, those still running
        included. True when none is left: the epoch ends at once."""
        self.open = units
        return units == 0

    def absorb(self, unit: Unit, report: UnitReport, handle: Any, barrier: bool) -> None:
        """A unit of its epoch is done: the report joins the epoch's; a training unit's state (`handle`) becomes its
        latest and its partition is visited. Under a `barrier` no older state is kept alive for a clone (a decision
        sees every config at an epoch end, where its latest state is the epoch's)."""
        self.reports.append(report)
        if unit.kind == TRAIN:
            self.state, self.units = handle, self.units + 1
            if barrier:
                self.epoch_state = None
            self.visited.setdefault(unit.epoch, []).append(unit.partition)

    def complete_unit(self) -> bool:
        """One unit of its open epoch completed; True when that was the last (the epoch has ended)."""
        self.open -= 1
        return self.open == 0

    def release_unit(self) -> bool:
        """A unit of a config a person stopped ended (with a result or without): one fewer runs, never below none.
        True when none runs."""
        self.open = max(self.open - 1, 0)
        return self.open == 0

    def close_epoch(self) -> None:
        """It finished an epoch: its metrics join the history and its latest state becomes the epoch's (what a clone
        copies); a pending stop takes effect, and a person's config that reached its `budget` stops, completed."""
        self.history.append(epoch_metrics(self.reports))
        self.reports, self.epoch_state, self.open = [], self.state, 0
        if self.stopping:
            self.status, self.stopping = STOPPED, False
        elif self.owner == PERSON and self.budget is not None and len(self.history) >= self.budget:
            self.status, self.outcome = STOPPED, "completed"

    def stop(self, outcome: str) -> None:
        """The procedure stops it (`outcome`: "completed" or "pruned"), or the run's stopper ("stopped"): at once
        between epochs, else when its open epoch ends (an epoch is never cut short)."""
        self.outcome = outcome
        if self.open:
            self.stopping = True
        else:
            self.status = STOPPED

    def stop_by_person(self, running: int) -> None:
        """A person stops it now: nothing more of it starts; its `running` units finish (`release_unit`)."""
        self.outcome, self.open = BY_PERSON, running
        self.status, self.stopping = STOPPED, False

    def stop_by_person_at_barrier(self) -> None:
        """A person stops it after its epoch ended, while the epoch waits for the round's barrier: it stops when the
        epoch closes (active until then, with the outcome "stopped": a resume of the run keeps the stop)."""
        self.outcome, self.stopping = BY_PERSON, True

    def resume(self, budget: int | None = None, owner: str = PROCEDURE) -> None:
        """It trains again (the caller opens its units), or a stop that has not taken effect is cancelled: by the
        procedure's decision, or a person's (`owner` PERSON, who steers it from now on, for `budget` epochs)."""
        self.status, self.outcome, self.stopping = ACTIVE, None, False
        if owner == PERSON:
            self.owner, self.budget = PERSON, budget

    def fail(self) -> None:
        """It fails for good: nothing of it is open or stops any more."""
        self.status, self.stopping, self.open = FAILED, False, 0

    def count_failure(self) -> int:
        """Its user code failed once more; returns its failures so far."""
        self.failures += 1
        return self.failures

    def start_from(self, handle: Any) -> None:
        """A clone starts from `handle` (its source's weights with an empty visit record): its latest state and the
        one its first epoch starts from."""
        self.state = self.epoch_state = handle

    def reload(self, handle: Any, units: int, visited: dict[int, list[int]], reports: list[UnitReport]) -> None:
        """Its newest checkpoint (`handle`, after `units` training units, with its visit record) is read back
        where the driver held no state of it (it stopped before this process resumed the run, or the run resumes);
        `reports`: the units of its unfinished epoch that checkpoint holds."""
        self.state = self.epoch_state = handle
        self.units, self.visited, self.reports = units, visited, reports

    def rewind(self, handle: Any, units: int, visited: dict[int, list[int]], reopened: int,
               gone: list[UnitReport], on_disk: bool) -> None:
        """Its latest state was lost: it goes back to `handle` (a checkpoint after `units` training units that
        visited `visited`, or its starting point); the reports of units that state lacks (`gone`) leave its epoch
        and `reopened` units of the epoch are open again. `on_disk`: `handle` is its newest checkpoint (else it has
        none on disk)."""
        self.open += reopened
        self.reports = [r for r in self.reports if r not in gone]
        self.state, self.units, self.visited = handle, units, visited
        self.checkpointed = (units if on_disk else -1, self.checkpointed[1])

    def drop_state(self) -> None:
        """Its state object was lost while it was stopped: the driver holds none (a resume reloads its newest
        checkpoint)."""
        self.state = self.epoch_state = None

    def start_checkpoint_clock(self, now: float) -> None:
        """The seconds between its checkpoints count from `now` (its first training unit)."""
        self.checkpointed = (self.checkpointed[0], now)

    def checkpointed_at(self, units: int, now: float) -> None:
        """Its state after `units` training units was queued for the disk at `now`."""
        self.checkpointed = (units, now)


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
            c.stop("pruned" if cid in pruned else "completed")
        for cid in decision.resume:
            self.configs[cid].resume()
        new = []
        for source, cfg in [(None, cfg) for cfg in decision.add] + list(decision.clone):
            c = ConfigRecord(len(self.configs), dict(cfg), parent=source)
            self.configs[c.id] = c
            new.append(c)
        return new
