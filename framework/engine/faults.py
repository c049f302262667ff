"""Faults injected at exact points of a run: every recovery path of the driver can be reached on purpose.

A `FaultPlan` is handed to `ModelSelection(faults=...)`. The driver consults it at fixed points: when it dispatches a
unit (`on_dispatch`), after it commits a round (`crash_after_commit`) and whenever it logs an event (`observe`).
Nothing here races a timer, so a test that injects "kill the worker running config 1's third unit" reaches that
path on every machine, loaded or not. Pure Python: no Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from framework.registry import Registry
from framework.scheduling import KINDS, Unit

#: where a fault is carried out: by the worker that runs the unit, by the driver around the unit, or by a worker
#: while it loads its partitions (on a start, a restart or a re-load)
WORKER, DRIVER, LOAD = "worker", "driver", "load"

#: the behaviours a fault kind names (`FaultKind.effect`); each backend maps every effect it can meet in one place
#: (`Worker.act_out`, `_LocalWorker.act_out`, `SimulatedBackend._act_out`, the driver's `units.unit_done`):
#: user code raises; the state object is gone; the worker's process dies; the unit never returns; the unit takes
#: `Fault.seconds` longer and succeeds; the unit's checkpoint never reaches the disk; the driver's process dies
RAISE, LOSE_STATE, DIE, HANG, STRETCH, SKIP_CHECKPOINT, CRASH_DRIVER = (
    "raise", "lose_state", "die", "hang", "stretch", "skip_checkpoint", "crash_driver")


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault (an entry of `FAULT_KINDS`): its `name` (a `Fault`'s `action`), `where` it is carried out
    (`WORKER`, `DRIVER` or `LOAD`), the `effect` every backend acts out, what it does (`doc`), and the `Fault`
    fields it takes beyond the filters (`params`, each required, a number of seconds > 0). Adding a kind is one entry
    here; a kind with an effect no backend knows yet needs that effect's handler in each backend too."""

    name: str
    where: str
    effect: str
    doc: str
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.where not in (WORKER, DRIVER, LOAD):
            raise ValueError(f"`where` is {self.where!r}, but must be one of {[WORKER, DRIVER, LOAD]}")


#: every fault kind, by name: the one definition the worker, the backends, the simulator and the driver read
FAULT_KINDS: Registry[FaultKind] = Registry("fault kind", ((k.name, k) for k in (
    FaultKind("raise", WORKER, RAISE,
              "the unit's user code raises `InjectedFault` (a failure in user code: retried, then the config fails)"),
    FaultKind("kill_worker", WORKER, DIE, "the worker's process SIGKILLs itself as the unit starts (a crashed worker)"),
    FaultKind("hang", WORKER, HANG, "the unit never returns (a hung worker, found by `unit_timeout_s`)"),
    FaultKind("lose_state", WORKER, LOSE_STATE,
              "the worker cannot fetch the config's state object (a lost object, restored from checkpoints)"),
    FaultKind("slow", WORKER, STRETCH,
              "the unit takes `seconds` longer and succeeds (a straggler: a real worker sleeps as the unit starts, "
              "a simulated unit's duration stretches)", params=("seconds",)),
    FaultKind("skip_checkpoint", DRIVER, SKIP_CHECKPOINT,
              "the unit completes, but its checkpoint never reaches the disk"),
    FaultKind("crash_driver", DRIVER, CRASH_DRIVER,
              "the driver SIGKILLs itself after the unit's row is logged and every earlier checkpoint is on disk, "
              "before the unit's own checkpoint is queued (or after round `after_commit` commits)"),
    FaultKind("kill_loading", LOAD, DIE,
              "the worker's process dies while it loads its partitions (a worker that never joins)"),
)))
#: the names of the kinds carried out by the worker that runs the unit, by the driver, and by a loading worker
WORKER_ACTIONS = tuple(n for n, k in FAULT_KINDS.items() if k.where == WORKER)
DRIVER_ACTIONS = tuple(n for n, k in FAULT_KINDS.items() if k.where == DRIVER)
LOAD_ACTIONS = tuple(n for n, k in FAULT_KINDS.items() if k.where == LOAD)
ACTIONS = tuple(FAULT_KINDS)
#: the `Fault` fields some kind takes as its parameters (`FaultKind.params`)
_PARAMS = tuple(sorted({p for k in FAULT_KINDS.values() for p in k.params}))


class InjectedFault(RuntimeError):
    """What a `raise` fault raises inside the unit's user code."""


@dataclass(frozen=True)
class Fault:
    """One fault: `action` on the `nth` dispatched unit that matches the filters (a filter left None matches any).

    Dispatches are counted per fault in the order the driver submits them, retries and re-runs included, so
    `Fault("raise", config_id=2, nth=3)` hits config 2's third dispatched unit whatever the scheduler does;
    `worker` restricts it to units sent to that worker. `Fault("crash_driver", after_commit=K)` instead fires once
    round K has committed (round -1 is the commit of the procedure's first decision, before any unit runs), and
    `Fault("kill_loading", worker=W, nth=N)` on the N-th time worker W is asked to load partitions.

    Actions: the names in `FAULT_KINDS` (each entry says what its kind does), e.g. `Fault("slow", config_id=0,
    seconds=30.0)`: config 0's first dispatched unit takes 30 s longer.
    """

    action: str
    config_id: int | None = None
    epoch: int | None = None
    partition: int | None = None
    kind: str | None = None
    worker: int | None = None
    nth: int = 1
    after_commit: int | None = None
    seconds: float | None = None  # `slow`: how much longer the unit takes

    def __post_init__(self) -> None:
        spec = FAULT_KINDS.lookup(self.action, "action")
        for name in _PARAMS:
            value = getattr(self, name)
            if name not in spec.params and value is not None:
                takers = [k.name for k in FAULT_KINDS.values() if name in k.params]
                raise ValueError(f"`{name}` is {value!r}, but only a fault of {takers} takes it")
            if name in spec.params and (isinstance(value, bool) or not isinstance(value, (int, float))
                                        or not math.isfinite(value) or value <= 0):
                raise ValueError(f"`{name}` is {value!r}, but a {self.action!r} fault needs a number of seconds > 0")
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"`kind` is {self.kind!r}, but must be one of {list(KINDS)} or None")
        if not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"`nth` is {self.nth!r}, but must be an int >= 1")
        if self.after_commit is not None:
            if spec.effect != CRASH_DRIVER:
                raise ValueError(f"`after_commit` is {self.after_commit!r}, but only a 'crash_driver' fault takes it")
            if any(v is not None for v in (self.config_id, self.epoch, self.partition, self.kind, self.worker)):
                raise ValueError("a fault with `after_commit` fires on a commit: it takes no unit filters")
        if spec.where == LOAD and any(v is not None for v in (self.config_id, self.epoch, self.partition, self.kind)):
            raise ValueError(f"a {self.action!r} fault fires on a worker's load: it takes only `worker` and `nth`")

    @property
    def spec(self) -> FaultKind:
        """This fault's kind: where it is carried out, and its effect."""
        return FAULT_KINDS[self.action]

    def matches(self, unit: Unit, worker: int) -> bool:
        """Whether a dispatch of `unit` to `worker` counts towards this fault."""
        return self.after_commit is None and self.spec.where != LOAD and all(
            want is None or want == have
            for want, have in ((self.config_id, unit.config_id), (self.epoch, unit.epoch),
                               (self.partition, unit.partition), (self.kind, unit.kind), (self.worker, worker))
        )


@dataclass
class FaultPlan:
    """Faults to inject, and an observer of the run's events (called in the driver's thread).

    `on_event(kind, detail)` sees every event the run logs (`worker_joined`, `round_committed`, ...) at the moment
    it is logged; it may call `ModelSelection.add_workers` / `drain_worker`, which then act at a known point of the
    run instead of whenever a polling thread wakes up. `fired` lists what was injected, in order.
    """

    faults: Iterable[Fault] = ()
    on_event: Callable[[str, dict[str, Any]], None] | None = None
    fired: list[tuple[Fault, Unit | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.faults = tuple(self.faults)
        for f in self.faults:
            if not isinstance(f, Fault):
                raise TypeError(f"`faults` holds {f!r}, but must hold framework.engine.faults.Fault objects")
        if self.on_event is not None and not callable(self.on_event):
            raise TypeError(f"`on_event` is {self.on_event!r}, but must be callable or None")
        self._seen = [0] * len(self.faults)

    def on_dispatch(self, unit: Unit, worker: int) -> list[Fault]:
        """The faults that fire on this dispatch of `unit` to `worker` (counted once per call)."""
        return self._count(lambda f: f.matches(unit, worker), unit)

    def on_load(self, worker: int) -> list[Fault]:
        """The faults that fire as `worker` is asked to load partitions (counted once per call)."""
        return self._count(lambda f: f.spec.where == LOAD and f.worker in (None, worker), None)

    def _count(self, matches: Callable[[Fault], bool], unit: Unit | None) -> list[Fault]:
        out = []
        for i, f in enumerate(self.faults):
            if matches(f):
                self._seen[i] += 1
                if self._seen[i] == f.nth:
                    out.append(f)
                    self.fired.append((f, unit))
        return out

    def crash_after_commit(self, round_: int) -> bool:
        for f in self.faults:
            if f.after_commit == round_:
                self.fired.append((f, None))
                return True
        return False

    def observe(self, kind: str, detail: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, detail)
