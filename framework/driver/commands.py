"""Commands from outside the loop: where they come from (`CommandSource`) and how they are applied.

A command is a request a person or another program makes of a running selection: about workers (add workers,
drain one, kill one for chaos testing), about the run (pause it: units running finish, nothing new starts, a
wall-clock run only; unpause it; extend the procedure's budget), and about configs (stop one now, resume a stopped
one, add one, clone one with changes, warm from its weights or cold from `model_fn`). It enters through a
`CommandSource`, which the driver loop polls between events (never in the middle of handling one), so a command
acts at a well-defined point: a unit boundary, before the next dispatch. `QueueCommands` is an
in-process, thread-safe queue (`ModelSelection.add_workers` puts into it, from any thread, before or during
`run()`); `InboxCommands` reads the requests other processes append to the run's inbox (`framework.connect`).

Applying a command follows the same rule as applying a procedure's `Decision`: what cannot be applied (an unknown
command, a worker that does not live, a count below 1, a config that is not stopped) is rejected with its reason
and the run goes on. Every command and its outcome is logged as a `command` event, in one transaction with what it
changed (config rows, the procedure's state), so a resume neither loses nor repeats it. A config a person added,
cloned or resumed is the person's (`automl.PERSON`): see `automl._base` for what the procedure does with it.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import math
import queue
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from automl import ACTIVE, PERSON, STOPPED, json_exact
from automl._checks import show
from framework.command_specs import (  # (ARG_TYPES and Arg re-exported: a command's arguments)
    ARG_TYPES,  # noqa: F401
    COMMAND_ENTRIES,
    OUTSIDE_COMMANDS,
    Arg,  # noqa: F401
    CommandEntry,
)
from framework.driver import commit
from framework.driver._state import RunState
from framework.driver.configs import BY_PERSON, ConfigRecord
from framework.driver.control import add_workers, drain_worker, worker_request
from framework.registry import Registry
from framework.store.checkpoint import CorruptCheckpointError
from framework.store.inbox import InboxError
from framework.text import printable


@dataclass(frozen=True)
class Command:
    """`name` (see `COMMANDS`) with its `args`; `source` says who gave it, `id` numbers it in its source."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    source: str = "api"
    id: int | None = None
    request: str | None = None  # the nonce of an inbox request (what its sender waits for), None from this process
    problem: str | None = None  # why the command cannot be trusted (an inbox request that does not verify)


class CommandSource(abc.ABC):
    """Where the driver loop reads commands from, between events."""

    @abc.abstractmethod
    def poll(self) -> list[Command]:
        """Commands given since the last call, in order (non-blocking)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """The run ended (the driver calls it): release what the source holds."""


class QueueCommands(CommandSource):
    """Commands put from any thread of this process (`put`), read by the loop in the order they were put."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._ids = itertools.count()

    def put(self, name: str, source: str = "api", **args: Any) -> Command:
        """Queue a command (thread-safe); it is applied before the loop's next dispatch. Returns it, numbered."""
        command = Command(name, dict(args), source, next(self._ids))
        self._queue.put(command)
        return command

    def poll(self) -> list[Command]:
        out: list[Command] = []
        while not self._queue.empty():
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return out


#: the `source` of every command read from the inbox (`inbox:<sender's source>`): from outside the run's process
INBOX_SOURCE = "inbox"


@dataclass(frozen=True)
class InboxNotice(Command):
    """News about the inbox, not a request (`InboxCommands` makes it): `apply` logs `args` as an `inbox` event and
    shows `line` on the console; nothing is applied."""

    line: str = ""


class InboxCommands(CommandSource):
    """Requests other processes appended to the run's inbox (`framework.store.inbox`), each applied once: `read(
    after)` returns the requests with an id above `after` (at most a bounded number per call) or raises `InboxError`;
    `seen` holds the nonces already applied (a resume passes those its `command` events name, so a request sent while
    the run was down is applied when it resumes, and none twice).

    The inbox is untrusted input, so what it makes the driver log is bounded: an inbox that cannot be read is read as
    empty and reported once per kind of breakage (one `InboxNotice`); of the requests that cannot be trusted
    (unsigned, edited, malformed), the first `one_by_one` of every `report_s` seconds are rejected one by one (a
    `command` event each, which a sender waiting on its nonce reads), the rest are counted, and the count (how many,
    and why) is one `InboxNotice` at the first read after the window ends (a run that ends within a window does not
    report its count; the rows stay in the inbox). A signed request is always applied or rejected on its own.
    `clock` gives the time in seconds (`time.monotonic`)."""

    BROKEN_S = 1.0  # the least time between two reads of an inbox that could not be read (each may cost a whole file)

    def __init__(self, read: Callable[[int], list[Any]], seen: set[str] = frozenset(), interval_s: float = 0.05,
                 report_s: float = 60.0, one_by_one: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        # `interval_s`: the least time between two reads (one opens a SQLite file, about 0.4 ms: too much for every
        # turn of a busy loop), well inside the loop's `COMMAND_WAIT_S`
        self._read, self._after, self._seen, self._interval = read, 0, set(seen), interval_s
        self._last, self._clock = -math.inf, clock
        self._report_s, self._one_by_one = report_s, one_by_one
        self._window, self._shown = -math.inf, 0  # when this report window began; rejections logged one by one in it
        self._held: Counter[str] = Counter()  # reason -> rejections in this window not logged one by one
        self._broken: str | None = None  # the kind of the inbox's breakage at the last read (None: it read)
        self._told: set[str] = set()  # the kinds of breakage reported

    def poll(self) -> list[Command]:
        now = self._clock()
        if now - self._last < (self._interval if self._broken is None else max(self._interval, self.BROKEN_S)):
            return []
        self._last = now
        out: list[Command] = []
        try:
            requests = self._read(self._after)
        except InboxError as e:
            requests = []
            if e.kind != self._broken and e.kind in self._told:  # broken again, the same way: counted
                self._reject(now, f"the inbox could not be read ({e.kind})", None, out)
            elif e.kind != self._broken:
                self._told.add(e.kind)
                out.append(InboxNotice("inbox", {"what": "unreadable", "problem": e.kind, "error": str(e)}, "inbox",
                                       line=f"inbox: {e}. Read as empty: the run goes on"))
            self._broken = e.kind
        else:
            self._broken = None
        for r in requests:
            self._after = r.id  # in id order; lower than before when the inbox was made anew
            if r.nonce in self._seen:
                continue
            name = r.name if isinstance(r.name, str) else ""
            source = f"{INBOX_SOURCE}:{r.source}" if isinstance(r.source, str) else INBOX_SOURCE
            nonce = r.nonce if isinstance(r.nonce, str) else None
            if r.problem is None:
                self._seen.add(nonce)
                out.append(Command(name, r.args, source, r.id, nonce))
            else:
                self._reject(now, r.problem, Command(name, {}, source, r.id, nonce, r.problem), out)
        self._roll(now, out)
        return out

    def _reject(self, now: float, reason: str, command: Command | None, out: list[Command]) -> None:
        """An untrusted request (`command`) or a breakage seen again (None): logged one by one, or counted."""
        self._roll(now, out)
        if command is not None and self._shown < self._one_by_one:
            self._shown += 1
            if command.request is not None:  # its `command` event names it: a resume skips it too
                self._seen.add(command.request)
            out.append(command)
        else:
            self._held[reason] += 1

    def _roll(self, now: float, out: list[Command]) -> None:
        """At the end of a report window: the count of what it held (if anything), and a new window."""
        if now - self._window <= self._report_s:
            return
        if self._held:
            count, seconds = sum(self._held.values()), round(now - self._window, 1)
            reasons = dict(self._held.most_common())
            out.append(InboxNotice("inbox", {"what": "rejected", "count": count, "reasons": reasons,
                                             "seconds": seconds}, "inbox",
                                   line=f"inbox: {count} more untrusted request(s) rejected in {seconds:g} s, not "
                                        "logged one by one: " + "; ".join(f"{n} x {r}" for r, n in reasons.items())))
            self._held.clear()
        self._window, self._shown = now, 0


class Sources(CommandSource):
    """Several sources read as one, each in its order, the first source's commands first."""

    def __init__(self, *sources: CommandSource) -> None:
        self.sources = sources

    def poll(self) -> list[Command]:
        return [c for s in self.sources for c in s.poll()]

    def close(self) -> None:
        for s in self.sources:
            s.close()


class CommandRejected(ValueError):
    """A command that cannot be applied; its message is the reason (logged, never raised out of the loop)."""


def _worker_arg(run: RunState, args: Mapping[str, Any], *, live: bool = True) -> int:
    w = args.get("worker")
    if isinstance(w, bool) or not isinstance(w, int):
        raise CommandRejected(f"`worker` is {w!r}, but must be a worker id (an int)")
    if live and w not in run.workers.holds:
        raise CommandRejected(f"worker {w} does not live (live workers: {run.workers.live()})")
    return w


#: the most workers one `add_workers` starts where the backend cannot tell what fits (each start takes the loop ~45 ms)
MAX_ADD_WORKERS = 64


def _room(run: RunState, free: Mapping[str, float]) -> int | None:
    """How many more workers fit in the cluster's `free` resources (over one worker's request), or None when the
    backend cannot tell (`free` is empty)."""
    if not free:
        return None
    return min(int(free.get(k, 0.0) / v + 1e-9) for k, v in worker_request(run).items() if v > 0)


#: command name -> its handler (each registered where it is defined): what `apply` runs for a command of
#: `COMMAND_ENTRIES`, the entries the inbox, the dashboard and the command line read without this module
_HANDLERS: Registry[Callable[[RunState, Mapping[str, Any]], str | Effect]] = Registry("command handler")


@_HANDLERS.register("add_workers")
def _add(run: RunState, args: Mapping[str, Any]) -> str:
    count, parts, worker = args.get("count", 1), args.get("partitions"), args.get("worker")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CommandRejected(f"`count` is {count!r}, but must be an int >= 1")
    free = run.backend.free_resources()
    room = _room(run, free)
    if count > (MAX_ADD_WORKERS if room is None else room):
        where = (f"the cluster has room for {room} more (free: {free}, one worker asks for {worker_request(run)})"
                 if room is not None else f"one command starts at most {MAX_ADD_WORKERS}")
        raise CommandRejected(f"`count` is {count}, but {where}; add a node (ray start --address=...) first")
    if parts is not None:
        known = set(run.workers.partitions) | set(run.workers.eval_partitions)
        unknown = sorted(set(parts) - known) if isinstance(parts, (list, tuple, set)) else parts
        if unknown or not parts:
            raise CommandRejected(f"`partitions` is {parts!r}, but must be a non-empty list of the run's partitions "
                                  f"{sorted(known)}")
    if worker is not None:
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise CommandRejected(f"`worker` is {worker!r}, but must be a worker id (an int >= 0)")
        if count != 1:
            raise CommandRejected(f"`count` is {count!r}, but must be 1 when `worker` names the worker to start")
        if worker in run.workers.holds or worker in run.workers.loading:
            raise CommandRejected(f"worker {worker} lives already")
    started = add_workers(run, count, list(parts) if parts is not None else None, worker)
    return f"started workers {started}"


@_HANDLERS.register("drain_worker")
def _drain(run: RunState, args: Mapping[str, Any]) -> str:
    w = _worker_arg(run, args)
    if w in run.workers.draining:
        raise CommandRejected(f"worker {w} is draining already")
    drain_worker(run, w)
    return f"worker {w} draining"


@_HANDLERS.register("kill_worker")
def _kill(run: RunState, args: Mapping[str, Any]) -> str:
    live = run.workers.live()
    if args.get("worker") is None:
        if not live:
            raise CommandRejected("no worker lives")
        w = random.choice(live)
    else:
        w = _worker_arg(run, args)
    run.event("worker_killed", worker=w)
    run.backend.kill(w)
    return f"worker {w} killed"


@_HANDLERS.register("pause")
def _pause(run: RunState, args: Mapping[str, Any]) -> str:
    if not run.backend.wall_clock:
        raise CommandRejected("a run on a simulated clock cannot wait for a person: it has no time to pause in")
    if run.paused:
        raise CommandRejected("the run is paused already")
    run.pause()
    running = len(run.dispatch.flights)
    return f"paused: nothing new is dispatched; {running} running unit(s) finish"


@_HANDLERS.register("unpause")
def _unpause(run: RunState, args: Mapping[str, Any]) -> str:
    if not run.paused:
        raise CommandRejected("the run is not paused")
    run.unpause()
    return "dispatching again"


# ---- configs ---------------------------------------------------------------------------------------------------
@dataclass
class Effect:
    """What an applied command changed that must be durable with its `command` event (one transaction)."""

    outcome: str
    statuses: list[ConfigRecord] = field(default_factory=list)  # configs whose status changed
    new: list[ConfigRecord] = field(default_factory=list)  # configs it added
    procedure: bool = False  # the procedure's state changed (its budget)
    detail: dict[str, Any] = field(default_factory=dict)  # more for the event (what a replay needs to repeat it)

    def steered(self) -> list[dict[str, Any]]:
        """The configs a person steers now, as a resume rebuilds them (`commit.restore`)."""
        return [{"id": c.id, "origin": c.origin, "owner": c.owner, "budget": c.budget}
                for c in [*self.statuses, *self.new] if c.owner == PERSON]


def _config_arg(run: RunState, args: Mapping[str, Any], key: str = "config_id") -> ConfigRecord:
    cid = args.get(key)
    if isinstance(cid, bool) or not isinstance(cid, int):
        raise CommandRejected(f"`{key}` is {cid!r}, but must be a config id (an int)")
    if cid not in run.configs.configs:
        raise CommandRejected(f"`{key}` is {cid}, but no config has that id (ids 0..{len(run.configs) - 1})")
    return run.configs[cid]


def _budget(run: RunState, args: Mapping[str, Any], trained: int, what: str) -> int:
    """The epochs a config a person steers trains in all: `epochs`, by default the procedure's per-config budget."""
    epochs = args.get("epochs")
    if epochs is None:
        epochs = run.procedure.epochs_per_config()
        if epochs is None:
            raise CommandRejected(f"`epochs` is None, and {type(run.procedure).__name__} has no per-config budget: "
                                  f"say how many epochs {what} trains")
    elif isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise CommandRejected(f"`epochs` is {epochs!r}, but must be an int >= 1 (the epochs {what} trains in all)")
    if epochs <= trained:
        raise CommandRejected(f"`epochs` is {epochs}, but {what} has trained {trained} epochs already: pass more "
                              f"(its epochs in all)")
    return epochs


def _config_dict(value: Any, key: str) -> dict[str, Any]:
    """`value` as a config holds it (`automl.json_exact`, the rule every procedure's configs follow), or the reason
    it cannot be one."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise CommandRejected(f"`{key}` is {show(value)}, but must be a dict of hyper-parameter name -> value")
    try:
        return json_exact(key, value)
    except (TypeError, ValueError) as e:
        raise CommandRejected(str(e)) from None


@_HANDLERS.register("stop_config")
def _stop_config(run: RunState, args: Mapping[str, Any]) -> Effect:
    c = _config_arg(run, args)
    if c.status != ACTIVE:
        raise CommandRejected(f"config {c.id} is {c.outcome or c.status}: only an active config can be stopped")
    if c.open == 0 and c.id in run.ended:  # its epoch ended and waits for the round's barrier: it stops there
        c.stop_by_person_at_barrier()
        return Effect(f"config {c.id} stops: its epoch {c.epoch} has ended and closes with the round",
                      statuses=[c])
    run.dispatch.drop_config(c.id)  # its units not started are gone; those running finish
    state = run.dispatch.state
    c.stop_by_person(sum(u.config_id == c.id for u in state.running) if state is not None else 0)
    run.config_stopped_by_person()
    if c.open == 0:  # after the checkpoint of its last unit, whose log row may still be deferred
        run.defer(lambda: run.checkpoint_final(c))
    done = sorted(c.visited.get(c.epoch, ()))
    return Effect(f"config {c.id} stopped in epoch {c.epoch} ({len(done)} of {len(run.workers.partitions)} "
                  f"partitions trained, {c.open} unit(s) running finish)", statuses=[c])


def _latest(run: RunState, c: ConfigRecord) -> Any:
    """The config's latest weights (`commit.latest_state`), or the reason they cannot be read, as a rejection."""
    try:
        return commit.latest_state(run, c)
    except CorruptCheckpointError as e:
        raise CommandRejected(f"config {c.id} has no readable weights: {e}") from None


@_HANDLERS.register("resume_config")
def _resume_config(run: RunState, args: Mapping[str, Any]) -> Effect:
    c = _config_arg(run, args)
    if c.status == ACTIVE and c.stopping and c.outcome == BY_PERSON:  # stopped at a barrier it has not reached
        budget = _budget(run, args, len(c.history), f"config {c.id}")
        c.resume(budget, PERSON)  # (it is active: the stop is cancelled)
        return Effect(f"config {c.id} trains on to {budget} epochs (its stop had not taken effect)", statuses=[c])
    if c.status != STOPPED:
        raise CommandRejected(f"config {c.id} is {c.status}: only a stopped config can be resumed")
    budget = _budget(run, args, len(c.history), f"config {c.id}")
    _latest(run, c)
    c.resume(budget, PERSON)
    commit.open_epochs(run, [c])
    run.open_round()
    return Effect(f"config {c.id} trains again, from epoch {c.epoch} to {budget} epochs", statuses=[c])


def _new_config(run: RunState, config: dict[str, Any], budget: int, parent: int | None = None) -> ConfigRecord:
    c = ConfigRecord(len(run.configs), config, parent=parent, origin=PERSON, owner=PERSON, budget=budget)
    run.configs.add(c)
    return c


@_HANDLERS.register("add_config")
def _add_config(run: RunState, args: Mapping[str, Any]) -> Effect:
    config = _config_dict(args.get("config"), "config")
    c = _new_config(run, config, _budget(run, args, 0, "the config"))
    commit.open_epochs(run, [c])
    run.open_round()
    return Effect(f"config {c.id} added: {config}, {c.budget} epochs", new=[c])


@_HANDLERS.register("clone_config")
def _clone_config(run: RunState, args: Mapping[str, Any]) -> Effect:
    src = _config_arg(run, args)
    overrides = _config_dict(args.get("overrides", {}), "overrides")
    warm = args.get("warm", True)
    if not isinstance(warm, bool):
        raise CommandRejected(f"`warm` is {warm!r}, but must be True (start from config {src.id}'s weights) or False "
                              "(start from `model_fn`)")
    budget = _budget(run, args, 0, "the clone")
    handle, units_in = None, 0
    if warm:
        handle = src.epoch_state if src.epoch_state is not None else _latest(run, src)
        units_in = src.units if handle is src.state else sum(len(v) for e, v in src.visited.items() if e < src.epoch)
        if handle is None:
            raise CommandRejected(f"config {src.id} has not trained yet: clone it cold (warm=False)")
    c = _new_config(run, {**src.config, **overrides}, budget, parent=src.id if warm else None)
    if warm:  # its own epochs count from 0: it inherits weights, not visits; on disk before its row commits
        c.start_from(run.backend.put({**run.backend.get(handle), "visited": {}}))
        run.checkpoint(c, 0, 0, c.state, None)
        run.log.flush()
    commit.open_epochs(run, [c])
    run.open_round()
    start = f"from config {src.id}'s weights after {units_in} training units" if warm else "from model_fn"
    return Effect(f"config {c.id} cloned from config {src.id} with {overrides}, {start}, {budget} epochs", new=[c],
                  detail={"source_units": units_in} if warm else {})


@_HANDLERS.register("extend")
def _extend(run: RunState, args: Mapping[str, Any]) -> Effect:
    try:
        outcome = run.procedure.extend(epochs=args.get("epochs"), samples=args.get("samples"))
    except (TypeError, ValueError) as e:
        raise CommandRejected(str(e)) from None
    return Effect(f"{type(run.procedure).__name__}: {outcome}", procedure=True)


@_HANDLERS.register("checkpoint_config")
def _checkpoint_config(run: RunState, args: Mapping[str, Any]) -> str:
    c = _config_arg(run, args)
    if c.state is None:
        raise CommandRejected(f"config {c.id} holds no weights in the driver: it has not trained yet, or its latest "
                              "weights are on disk already")
    if c.checkpointed[0] == c.units:
        raise CommandRejected(f"config {c.id}'s weights after {c.units} training units are on disk already")
    epoch = max((e for e, parts in c.visited.items() if parts), default=0)  # the epoch of its latest unit
    run.checkpoint(c, epoch, c.units, c.state, None)
    run.log.flush()
    return f"config {c.id}'s weights after {c.units} training units (epoch {epoch}) written"


# ---- the registry ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommandSpec(CommandEntry):
    """One command of `COMMANDS`: its entry (`framework.command_specs.CommandEntry`: name, doc, args, where it may
    come from, its button and subcommand) and `handler(run, args)`, which applies it (returns its outcome, or the
    `Effect` of a command that changed configs or the procedure; raises `CommandRejected` with the reason) after
    `check` has made sure the required `args` are there and no other is.

    Adding a command is one entry in `framework.command_specs.COMMAND_ENTRIES` plus its handler in `_HANDLERS`: the
    driver applies it, the dashboard shows it (its forms come from `describe`, served as `/api/commands`), the
    command line offers it."""

    handler: Callable[[RunState, Mapping[str, Any]], str | Effect] = field(kw_only=True)

    def check(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments the handler takes: `args` with the defaults of those not given. Raises `CommandRejected`
        when a required one is missing (or None) or one is not this command's."""
        if not isinstance(args, Mapping):
            raise CommandRejected(f"`args` is {args!r}, but must be a mapping of argument name -> value")
        for a in self.args:
            if a.required and args.get(a.name) is None:
                raise CommandRejected(f"`{a.name}` is {args.get(a.name)!r}, but must be {a.rule}")
        names = [a.name for a in self.args]
        unknown = sorted(str(k) for k in args if k not in names)
        if unknown:
            raise CommandRejected(f"{self.name!r} takes no argument {unknown[0]!r}; it takes {names}")
        return {**{a.name: a.default for a in self.args if a.default is not None}, **args}


if _missing := [name for name in COMMAND_ENTRIES if name not in _HANDLERS]:
    raise RuntimeError(f"commands with no handler in framework/driver/commands.py: {_missing}")

#: every command, by name, with its handler: `framework.command_specs.COMMAND_ENTRIES`, the one definition the
#: driver, the inbox, the dashboard and the command line read
COMMANDS: dict[str, CommandSpec] = {
    name: CommandSpec(**{f.name: getattr(e, f.name) for f in dataclasses.fields(e)}, handler=_HANDLERS[name])
    for name, e in COMMAND_ENTRIES.items()}


def _shown(value: Any, limit: int = 120) -> str:
    """`value` for the console: what is not printable escaped (a request's name and arguments are whatever the inbox
    held: never raw control characters on a person's terminal), at most `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    out = printable(text[:limit + 1])
    return out if len(text) <= limit and len(out) <= limit else out[:limit] + "..."


def apply(run: RunState, command: Command) -> bool:
    """Apply `command` to the run; log it with its outcome and effect. Returns whether it was applied. An
    `InboxNotice` is logged (an `inbox` event) and shown, not applied."""
    if isinstance(command, InboxNotice):
        run.event("inbox", **command.args)
        run.write(_shown(command.line, 600))
        return False
    spec = COMMANDS.get(command.name)
    try:
        if command.problem is not None:
            raise CommandRejected(f"the request cannot be trusted: {command.problem}")
        if spec is None:
            raise CommandRejected(f"unknown command {command.name!r}; known: {sorted(COMMANDS)}")
        if command.source.startswith(INBOX_SOURCE) and not spec.outside:
            raise CommandRejected(f"{command.name!r} cannot be sent from outside the run: it is for the driver's own "
                                  f"process (chaos testing); from outside: {sorted(OUTSIDE_COMMANDS)}")
        effect, applied = spec.handler(run, spec.check(command.args)), True
    except CommandRejected as e:
        effect, applied = str(e), False
        run.write(f"command {_shown(command.name, 64)} {_shown(dict(command.args))} rejected: {_shown(str(e), 400)}")
    effect = Effect(effect) if isinstance(effect, str) else effect
    detail = {"name": command.name, "args": dict(command.args), "source": command.source, "id": command.id,
              "request": command.request, "applied": applied, "outcome": effect.outcome, **effect.detail}
    if effect.steered():
        detail["steered"] = effect.steered()
    run.log.record_command(detail, statuses=[(c.id, c.status, len(c.history), c.outcome) for c in effect.statuses],
                           new_configs=[(c.id, c.config, c.parent, run.round) for c in effect.new],
                           procedure=run.procedure if effect.procedure else None, round_=run.round - 1)
    run.observers.call("on_event", "command", detail)
    return applied
