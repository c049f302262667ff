"""Commands from outside the loop: where they come from (`CommandSource`) and how they are applied.

A command is a request a person or another program makes of a running selection: add workers, drain one, kill one
(chaos testing), pause the run (units running finish, nothing new starts; a wall-clock run only) and unpause it. It enters through a `CommandSource`, which the driver loop polls between events (never in the
middle of handling one), so a command acts at a well-defined point: before the next dispatch. `QueueCommands` is an
in-process, thread-safe queue (`ModelSelection.add_workers` puts into it, from any thread, before or during
`run()`); `InboxCommands` reads the requests other processes append to the run's inbox (`framework.connect`).

Applying a command follows the same rule as applying a procedure's `Decision`: what cannot be applied (an unknown
command, a worker that does not live, a count below 1) is rejected with its reason and the run goes on. Every
command and its outcome is logged as a `command` event.
"""

from __future__ import annotations

import abc
import itertools
import math
import queue
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from framework.driver._state import RunState
from framework.driver.control import add_workers, drain_worker


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


class InboxCommands(CommandSource):
    """Requests other processes appended to the run's inbox (`framework.engine.inbox`), each applied once: `read(
    after)` returns the requests with an id above `after`; `seen` holds the nonces already applied (a resume passes
    those its `command` events name, so a request sent while the run was down is applied when it resumes, and none
    twice)."""

    def __init__(self, read: Callable[[int], list[Any]], seen: set[str] = frozenset(), interval_s: float = 0.05) -> None:
        # `interval_s`: the least time between two reads (one opens a SQLite file, about 0.4 ms: too much for every
        # turn of a busy loop), well inside the loop's `COMMAND_WAIT_S`
        self._read, self._after, self._seen, self._interval = read, 0, set(seen), interval_s
        self._last = -math.inf

    def poll(self) -> list[Command]:
        now = time.monotonic()
        if now - self._last < self._interval:
            return []
        self._last = now
        out = []
        for r in self._read(self._after):
            self._after = max(self._after, r.id)
            if r.nonce in self._seen:
                continue
            if isinstance(r.nonce, str):
                self._seen.add(r.nonce)
            out.append(Command(str(r.name), r.args, f"inbox:{r.source}", r.id, r.nonce, r.problem))
        return out


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


def _add(run: RunState, args: Mapping[str, Any]) -> str:
    count, parts, worker = args.get("count", 1), args.get("partitions"), args.get("worker")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CommandRejected(f"`count` is {count!r}, but must be an int >= 1")
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


def _drain(run: RunState, args: Mapping[str, Any]) -> str:
    w = _worker_arg(run, args)
    if w in run.workers.draining:
        raise CommandRejected(f"worker {w} is draining already")
    drain_worker(run, w)
    return f"worker {w} draining"


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


def _pause(run: RunState, args: Mapping[str, Any]) -> str:
    if not run.backend.wall_clock:
        raise CommandRejected("a run on a simulated clock cannot wait for a person: it has no time to pause in")
    if run.paused:
        raise CommandRejected("the run is paused already")
    run.paused = True
    running = len(run.dispatch.flights)
    return f"paused: nothing new is dispatched; {running} running unit(s) finish"


def _unpause(run: RunState, args: Mapping[str, Any]) -> str:
    if not run.paused:
        raise CommandRejected("the run is not paused")
    run.paused = False
    return "dispatching again"


#: name -> handler(run, args) -> outcome; a handler raises `CommandRejected` with the reason
COMMANDS: dict[str, Callable[[RunState, Mapping[str, Any]], str]] = {
    "add_workers": _add,
    "drain_worker": _drain,
    "kill_worker": _kill,
    "pause": _pause,
    "unpause": _unpause,
}


def apply(run: RunState, command: Command) -> bool:
    """Apply `command` to the run; log it with its outcome. Returns whether it was applied."""
    handler = COMMANDS.get(command.name)
    try:
        if command.problem is not None:
            raise CommandRejected(f"the request cannot be trusted: {command.problem}")
        if handler is None:
            raise CommandRejected(f"unknown command {command.name!r}; known: {sorted(COMMANDS)}")
        outcome, applied = handler(run, command.args), True
    except CommandRejected as e:
        outcome, applied = str(e), False
        run.write(f"command {command.name} {dict(command.args)} rejected: {e}")
    run.event("command", name=command.name, args=dict(command.args), source=command.source, id=command.id,
              request=command.request, applied=applied, outcome=outcome)
    return applied
