"""One table per extension point: `Registry`, a name -> entry dict that refuses a name twice and says what a lookup
of an unknown name should have been.

Every extension point of `framework` that is found by name uses it: schedulers and solvers
(`framework.scheduling.SCHEDULERS`, `SOLVERS`), stoppers (`framework.stoppers.STOPPERS`), data sources
(`framework.sources.Source.registry`: a subclass with a `kind` adds itself), fault kinds
(`framework.engine.faults.FAULT_KINDS`) and commands (`framework.command_specs.COMMAND_ENTRIES`, whose handlers the
driver registers in `framework.driver.commands._HANDLERS` where it defines them). Procedures are `automl`'s, which
imports nothing of ours: `automl.plugins` keeps its built-ins in a dict beside the `modelhopper.procedures` entry
points. Adding one is one entry (or one decorated definition) in its table; the error for a name that is not there
reads the same everywhere:

    >>> colours = Registry("colour", {"red": 1, "green": 2})
    >>> colours.lookup("blue", "colour")
    Traceback (most recent call last):
    ...
    ValueError: `colour` is 'blue', but must be one of ['red', 'green']

Nothing of ours is imported here: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(dict[str, T]):
    """The entries of one extension point by name, in the order they were added. `what` names an entry in errors
    ("scheduler", "fault kind"). A plain dict otherwise (`name in r`, `r[name]`, `sorted(r)`), except that a name
    is added once (`add`, `register`): a second entry of one name raises `ValueError`."""

    def __init__(self, what: str, entries: Mapping[str, T] | Iterable[tuple[str, T]] = ()) -> None:
        super().__init__()
        self.what = what
        for name, entry in entries.items() if isinstance(entries, Mapping) else entries:
            self.add(name, entry)

    def add(self, name: str, entry: T) -> T:
        """Add `entry` as `name`; returns it. A name already in the table raises `ValueError`."""
        if name in self:
            raise ValueError(f"{self.what} {name!r} is defined twice")
        self[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """`@registry.register(name)` over a definition: adds it as `name` and leaves it as it was."""
        return lambda entry: self.add(name, entry)

    def lookup(self, name: Any, parameter: str, otherwise: str = "") -> T:
        """The entry `name`, else `ValueError` naming the parameter, its value and the names there are, with
        `otherwise` after them (" or a Scheduler instance")."""
        if isinstance(name, str) and name in self:
            return self[name]
        raise ValueError(f"`{parameter}` is {name!r}, but must be one of {list(self)}{otherwise}")
