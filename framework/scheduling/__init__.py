"""Scheduling policies shared by the live engine and the simulators (pure Python, no Ray)."""

from __future__ import annotations

from framework.scheduling._base import (
    EVAL,
    KINDS,
    TRAIN,
    Assignment,
    DispatchState,
    Scheduler,
    Unit,
    UnitTimeEstimate,
    greedy_select,
)
from framework.scheduling.randomized import RandomizedScheduler

#: name -> factory(seed) of every online policy the engine accepts as `scheduler=...`.
SCHEDULERS = {
    "randomized": RandomizedScheduler,
}


def make_scheduler(name: str | Scheduler, seed: int = 0) -> Scheduler:
    """A scheduler by name (see `SCHEDULERS`), or `name` itself when it already is a `Scheduler`."""
    if isinstance(name, Scheduler):
        return name
    if name not in SCHEDULERS:
        raise ValueError(f"`scheduler` is {name!r}, but must be one of {sorted(SCHEDULERS)} or a Scheduler instance")
    return SCHEDULERS[name](seed=seed)


__all__ = [
    "EVAL",
    "KINDS",
    "SCHEDULERS",
    "TRAIN",
    "Assignment",
    "DispatchState",
    "RandomizedScheduler",
    "Scheduler",
    "Unit",
    "UnitTimeEstimate",
    "greedy_select",
    "make_scheduler",
]
