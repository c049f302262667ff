"""The unit of work and its messages, in one torch-free module: what the policies, the driver, the backends and
the simulators all speak.

A *unit* is one visit of a config to a partition for one epoch: a training pass (a sub-epoch) or an evaluation.
An *assignment* says where units run, and is plural from the start:

    Assignment(unit, workers=(3,))                  one config on one worker (Cerebro's unit; every policy today)
    Assignment(unit, workers=(3, 5))                a gang: the workers share the partition's pass, data-parallel
    Assignment(unit, workers=(3, 5), partitions=(0, 2))
                                                    a gang over two partitions: worker 3 trains the config on
                                                    partition 0 and worker 5 on partition 2, in one synchronous
                                                    pass (gradients averaged at every step); units (c, e, 0) and
                                                    (c, e, 2) are done together
    Assignment(unit, workers=(3,), members=(0, 4, 7))
                                                    a pack: configs 0, 4 and 7 hop together as one state, and each
                                                    absorbs the same partition in the one pass
    Assignment(unit, workers=(3,), members=(0, 4), epochs=(2, 0))
                                                    a pack of configs at different epochs (asynchronous procedures)

`unit` is the pack's lead member's unit (`members[0]`) on the first worker's partition; `Assignment.units` lists
every member's unit on every partition the gang trains (workers given the same partition split its pass, each taking
a share of its batches). The bookkeeping stays per (config, partition), so the MOP invariants, the completeness
check, replay and resume hold for gangs and packs unchanged; the schedule log keeps one row per (config, worker)
with the partition that worker trained and the examples it took (`example_share` of the unit's, where workers share
a pass: a unit's rows add up to its examples), and names the gang or pack by `group`.

`UnitTask` is what a worker needs to run an assignment besides the states; `UnitReport` what it sends back, one
per member. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TRAIN = "train"
EVAL = "eval"
KINDS = (TRAIN, EVAL)


_UnitFields = collections.namedtuple("Unit", ["config_id", "epoch", "partition", "kind"], defaults=(TRAIN,))


class Unit(_UnitFields):
    """One visit of a config to a partition: train (one pass, one sub-epoch) or eval (no gradients).

    `Unit(config_id, epoch, partition, kind="train")`, where `epoch` is the config's own epoch index (0-based) that
    this unit belongs to. A named tuple: hashed, compared and ordered (by its fields, in order) at C speed, since
    the driver keys its sets and maps by units hundreds of thousands of times a run.
    """

    __slots__ = ()

    def __new__(cls, config_id: int, epoch: int, partition: int, kind: str = TRAIN) -> Unit:
        if kind not in KINDS:
            raise ValueError(f"`kind` is {kind!r}, but must be one of {KINDS}")
        return tuple.__new__(cls, (config_id, epoch, partition, kind))  # (the named tuple's own `__new__`, inlined)


def member_units(unit: Unit, members: tuple[int, ...], partitions: tuple[int, ...] = (),
                 epochs: tuple[int, ...] = ()) -> tuple[Unit, ...]:
    """The units of a pack's `members` at `unit`'s kind and epoch (or each member's of `epochs`), on each distinct
    partition of a gang's `partitions` in order (default: `unit`'s own); `(unit,)` for a unit of its own."""
    parts = tuple(dict.fromkeys(partitions)) if partitions else (unit.partition,)
    if len(members) <= 1 and len(parts) == 1:
        return (unit,)
    members = members or (unit.config_id,)
    return tuple(Unit(c, e, p, unit.kind) for c, e in zip(members, epochs or (unit.epoch,) * len(members),
                                                          strict=True) for p in parts)


def _check_epochs(epochs: tuple[int, ...], members: tuple[int, ...], unit: Unit) -> tuple[int, ...]:
    """A pack's per-member `epochs` as `Assignment` and `UnitTask` keep them: () when all are the unit's."""
    if not epochs:
        return ()
    if len(epochs) != len(members) or epochs[0] != unit.epoch:
        raise ValueError(f"`epochs` is {epochs!r}, but must give one epoch per member of {members}, the first being "
                         f"the unit's ({unit.epoch})")
    return () if all(e == unit.epoch for e in epochs) else tuple(epochs)


@dataclass(frozen=True)
class Assignment:
    """`unit` runs on `workers` (a gang when more than one) for every config of `members` (a pack when more than
    one; default: the unit's own config). `partitions`: the partition each worker of a gang trains (default: every
    worker on `unit.partition`, sharing its pass); the first is `unit.partition`. See the module docstring."""

    unit: Unit
    workers: tuple[int, ...]
    members: tuple[int, ...] = ()
    partitions: tuple[int, ...] = ()
    epochs: tuple[int, ...] = ()  # a pack's per-member epochs (asynchronous configs; default: all the unit's)

    def __post_init__(self) -> None:
        if not self.members and type(self.workers) is tuple and len(self.workers) == 1:  # the common case, fast
            object.__setattr__(self, "members", (self.unit.config_id,))
            return
        if not self.members:
            object.__setattr__(self, "members", (self.unit.config_id,))
        elif self.members[0] != self.unit.config_id:
            raise ValueError(f"`members` is {self.members!r}, but must start with the unit's config "
                             f"{self.unit.config_id}")
        if type(self.workers) is not tuple or not self.workers:
            raise TypeError(f"`workers` is {self.workers!r}, but must be a non-empty tuple of worker ids")
        if self.epochs:
            object.__setattr__(self, "epochs", _check_epochs(self.epochs, self.members, self.unit))
        if len(set(self.workers)) != len(self.workers) or len(set(self.members)) != len(self.members):
            raise ValueError(f"an assignment names a worker or a member twice: workers {self.workers}, "
                             f"members {self.members}")
        if self.partitions:
            if len(self.partitions) != len(self.workers) or self.partitions[0] != self.unit.partition:
                raise ValueError(f"`partitions` is {self.partitions!r}, but must name one partition per worker of "
                                 f"{self.workers}, the first being the unit's ({self.unit.partition})")
            if len(set(self.partitions)) == 1:
                object.__setattr__(self, "partitions", ())  # every worker on the unit's partition: the default

    @property
    def worker(self) -> int:
        """The first worker (the only one, outside a gang)."""
        return self.workers[0]

    @property
    def units(self) -> tuple[Unit, ...]:
        """Every member's unit on every partition of the gang, in `members` then `partitions` order."""
        return member_units(self.unit, self.members, self.partitions, self.epochs)

    def partition_of(self, worker: int) -> int:
        """The partition `worker` trains in this assignment."""
        return self.partitions[self.workers.index(worker)] if self.partitions else self.unit.partition

    @property
    def plural(self) -> bool:
        """A gang or a pack."""
        return len(self.workers) > 1 or len(self.members) > 1


# estimate(unit, worker) -> expected seconds (or any consistent unit of time)
UnitTimeEstimate = Callable[[Unit, int], float]


@dataclass(slots=True)
class UnitTask:
    """Everything a worker needs to run one assignment, besides the states: the unit, the configs (one per member,
    in `members` order), the run seed, the gang's workers, and an injected fault to act out
    (a `framework.engine.faults.Fault` of a kind its worker carries out; None: none)."""

    unit: Unit
    config: dict[str, Any]
    seed: int  # the run seed
    fault: Any = None  # (typed loosely: the scheduling layer imports nothing of the engine's)
    members: tuple[int, ...] = ()  # the pack's configs (default: the unit's own)
    configs: tuple[dict[str, Any], ...] = ()  # their configs (default: `config`)
    workers: tuple[int, ...] = ()  # the gang (default: the worker it is sent to)
    partitions: tuple[int, ...] = ()  # the partition each worker of the gang trains (default: the unit's)
    faults: tuple[Any, ...] = ()  # a pack's faults, one per member (default: `fault`, the first member's)
    epochs: tuple[int, ...] = ()  # a pack's per-member epochs (default: all the unit's)

    @property
    def units(self) -> tuple[Unit, ...]:
        return member_units(self.unit, self.members, self.partitions, self.epochs)


@dataclass(slots=True)
class UnitReport:
    """What a worker sends back after a unit, per member (small; the state travels separately). `group`: the gang
    or pack it ran in (None: a unit of its own)."""

    unit: Unit
    worker: int
    start: float
    end: float
    metrics: dict[str, float] = field(default_factory=dict)
    num_examples: int = 0
    state_bytes: int = 0
    error: str | None = None  # traceback of a failure in user code
    group: int | None = None
    comm_s: float = 0.0  # seconds a gang's step spent in its all-reduces (the least of its members'; 0: no gang)
    note: str | None = None  # a pack's members ran one after another: why they were not fused (not logged)


def example_share(total: int, index: int, count: int) -> int:
    """How many of a unit's `total` examples its gang's sharer `index` of `count` trained: `framework.data.shard_data`
    gives it every `count`-th example from `index`. The `count` shares add up to `total`."""
    return len(range(index, total, count))


def unit_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed derived from the run seed and a tuple of ints (config, epoch, partition, ...).

    The tuple's length is part of the entropy: numpy's `SeedSequence` would otherwise read `(c,)` and `(c, 0)` as one
    seed, and a config's construction would draw what one of its units draws.
    """
    return int(np.random.SeedSequence([seed, len(parts), *parts]).generate_state(1, dtype=np.uint64)[0]) >> 1


def epoch_metrics(reports: list[UnitReport]) -> dict[str, float]:
    """A config's metrics for one epoch: example-weighted means over its units, `train_`/`valid_` prefixed."""
    out: dict[str, float] = {}
    for kind, prefix in ((TRAIN, "train_"), (EVAL, "valid_")):
        sums: dict[str, float] = {}
        n = 0
        for r in reports:
            if r.unit.kind != kind:
                continue
            n += r.num_examples
            for k, v in r.metrics.items():
                sums[k] = sums.get(k, 0.0) + v * r.num_examples
        if n:
            out.update({prefix + k: v / n for k, v in sums.items()})
    return out
