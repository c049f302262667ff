"""What each command a person or a program may send a running selection is (`COMMAND_ENTRIES`): its name, what it does,
its arguments and their rules, whether it may come from outside the run's process, and how the dashboard and the
command line offer it. How the driver applies one is `framework.driver.commands`, whose `COMMANDS` pairs each entry
here with its handler: adding a command is one entry here plus its handler there.

Standard library only: `modelhopper --help` makes a subcommand of each entry without importing the driver, pandas or
automl (which take a second or more to import).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from framework.registry import Registry

__all__ = ["ARG_TYPES", "COMMAND_ENTRIES", "OUTSIDE_COMMANDS", "Arg", "CommandEntry"]

#: what a command's argument is, as a form or the command line reads it: an int, a list of ints, True/False, or any
#: JSON value (a dict of hyper-parameters)
ARG_TYPES = ("int", "ints", "bool", "json")

# a config's statuses a command's button is enabled in: `automl.ACTIVE` and `automl.STOPPED` (not imported: automl
# imports Optuna; tests/framework/test_cli.py keeps them equal)
_ACTIVE, _STOPPED = "active", "stopped"


@dataclass(frozen=True)
class Arg:
    """One argument of a command: its `name`, `type` (one of `ARG_TYPES`), what it must be (`rule`: what a
    rejection says when a `required` one is missing, and the help of its form field and command-line option), and
    the `default` its handler takes when it is not given (None: the handler's own choice, e.g. the procedure's)."""

    name: str
    type: str
    rule: str
    required: bool = False
    default: Any = None

    def __post_init__(self) -> None:
        if self.type not in ARG_TYPES:
            raise ValueError(f"`type` is {self.type!r}, but must be one of {list(ARG_TYPES)}")


@dataclass(frozen=True)
class CommandEntry:
    """One command (an entry of `COMMAND_ENTRIES`): everything every layer reads of it but its handler. `doc`: what
    it does; `args`: what it takes; `outside`: whether a person may send it from outside the run's process (the inbox:
    `framework.connect`, the CLI, the dashboard); `target`: "config" for a command about one config (its
    `config_id`: the dashboard puts its button on each config's row, enabled while the config's status is one of
    `statuses`), else "run"; `label`: its button (default: the name); `cli`: its subcommand of `python -m framework`
    (default: the name, dashed; one made from this entry unless a hand-written one of that name exists)."""

    name: str
    doc: str
    args: tuple[Arg, ...] = ()
    outside: bool = True
    target: str = "run"
    label: str | None = None
    cli: str | None = None
    statuses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.target not in ("run", "config"):
            raise ValueError(f"`target` is {self.target!r}, but must be 'run' or 'config'")
        if self.target == "config" and "config_id" not in {a.name for a in self.args}:
            raise ValueError(f"command {self.name!r} is about a config, so it must take a `config_id`")

    @property
    def subcommand(self) -> str:
        """Its subcommand of `python -m framework`: `cli`, else the name with `-` for `_`."""
        return self.cli or self.name.replace("_", "-")

    def describe(self) -> dict[str, Any]:
        """The entry as JSON (what `/api/commands` serves and the dashboard builds its forms from)."""
        return {"name": self.name, "doc": self.doc, "target": self.target, "label": self.label or self.name,
                "statuses": list(self.statuses), "args": [dataclasses.asdict(a) for a in self.args]}


_WORKER = "a worker id (an int)"
_CONFIG_ID = Arg("config_id", "int", "a config id (an int)", required=True)
_EPOCHS = Arg("epochs", "int", "an int >= 1, the epochs it trains in all (default: the procedure's per-config budget)")

#: every command, by name: the one definition the driver, the inbox, the dashboard and the command line read
COMMAND_ENTRIES: Registry[CommandEntry] = Registry("command", ((c.name, c) for c in (
    CommandEntry("add_workers", "start more workers (each loads `partitions`, default: those with the fewest "
                 "holders)", (Arg("count", "int", "an int >= 1, how many workers to start", default=1),
                              Arg("partitions", "ints", "a non-empty list of the run's partitions"),
                              Arg("worker", "int", "the id of the one worker to start (an int >= 0)")),
                 label="add workers", cli="workers"),
    CommandEntry("drain_worker", "the worker takes no new units, finishes the one it runs, then leaves",
                 (Arg("worker", "int", _WORKER, required=True),), label="drain", cli="workers"),
    CommandEntry("kill_worker", "kill a worker (default: a random live one): chaos testing, for the driver's own "
                 "process only (`ModelSelection.kill_worker_process`)", (Arg("worker", "int", _WORKER),),
                 outside=False),
    CommandEntry("pause", "pause the run: units running finish, nothing new starts, workers stay"),
    CommandEntry("unpause", "continue a paused run where it paused"),
    CommandEntry("stop_config", "stop the config now: its units not started are dropped, those running finish; it "
                 "keeps its weights and metrics", (_CONFIG_ID,), target="config", label="stop", cli="stop",
                 statuses=(_ACTIVE,)),
    CommandEntry("resume_config", "train a stopped config again from its latest weights (the person's from then on)",
                 (_CONFIG_ID, _EPOCHS), target="config", label="resume", cli="resume-config",
                 statuses=(_STOPPED,)),
    CommandEntry("add_config", "add a config the procedure did not ask for; it trains from model_fn",
                 (Arg("config", "json", "a dict of hyper-parameter name -> value", required=True), _EPOCHS),
                 label="add config", cli="add"),
    CommandEntry("clone_config", "a new config: this one's hyper-parameters with `overrides`, from its latest weights "
                 "(`warm`) or from model_fn", (
                     _CONFIG_ID, Arg("overrides", "json", "a dict of hyper-parameter name -> value", default={}),
                     Arg("warm", "bool", "True (start from the config's weights) or False (from model_fn)",
                         default=True), _EPOCHS), target="config", label="clone", cli="clone"),
    CommandEntry("extend", "grow the procedure's budget, as far as it allows: `epochs` more per config, `samples` "
                 "more configs", (Arg("epochs", "int", "an int >= 1, epochs more per config"),
                                  Arg("samples", "int", "an int >= 1, configs more"))),
    CommandEntry("checkpoint_config", "write the config's latest weights to disk now, whatever the run's checkpoint "
                 "policy (`Result.load_model` loads them)", (_CONFIG_ID,), target="config", label="checkpoint",
                 statuses=(_ACTIVE, _STOPPED)),
)))
#: the commands a person may send from outside the run's process (the inbox: `framework.connect`, the CLI, the
#: dashboard)
OUTSIDE_COMMANDS = frozenset(name for name, c in COMMAND_ENTRIES.items() if c.outside)
