"""The scheduler contract: what a dispatch policy is promised, and what it must do.

A policy (`framework.scheduling.SCHEDULERS`, or your own subclass of `Scheduler`) reads a
`framework.scheduling.dispatch_state.DispatchState` (the round's units, idle workers, busy configs, availability,
time estimates) and chooses which eligible unit each idle worker runs next. The live engine, replay and the simulators
call it the same way, so a policy is written once.

This module imports no implementation: the state it reads is named for type checking only.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from framework.scheduling.units import Assignment

if TYPE_CHECKING:
    from framework.scheduling.dispatch_state import DispatchState


class Scheduler(abc.ABC):
    """A dispatch policy: picks which eligible unit each idle worker runs next.

    Contract:
        * `start_round(state)` is called once when a round's units are known, before any `select`. Plan-based
          policies solve their plan here (using `state.estimate`).
        * `select(state)` is called whenever a worker or a config becomes idle (start of round, every completion,
          failure, worker joining). It returns assignments whose units are eligible on their workers at the moment
          of the call (`state.is_eligible`), at most one per worker and per config. It must not mutate `state`; the
          caller applies the assignments with `state.start`.
        * Policies are deterministic given their seed and the sequence of calls, hold no Ray objects, and pickle.
        * `order(config_id, epoch, partitions)` says whether the policy fixes each config's visit order (None: no);
          a policy that returns one must only ever select a config's training unit at the first partition of its
          order still pending.
    """

    name: str = "base"

    def start_round(self, state: DispatchState) -> None:  # noqa: B027 - optional hook
        """Called once per round before the first `select`."""

    @abc.abstractmethod
    def select(self, state: DispatchState) -> list[Assignment]:
        """Assignments to start now (see the class docstring)."""

    def order(self, config_id: int, epoch: int, partitions: list[int]) -> list[int] | None:
        """The partitions `config_id` visits in `epoch`, in order, where the policy fixes that order whatever the
        timing (`SeededOrderScheduler`); None (the default): it fixes none, and any eligible unit may be a config's
        next. The packer (`framework.scheduling.packing`) reads it: under a fixed order, a config joins a pack only
        at its own next unit, so packing never moves it off its order."""
        return None
