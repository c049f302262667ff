"""The completeness proof of a run, checked: every config's state says which partitions it absorbed in which epoch
(`state["visited"]`, written by the worker that trained it), and that record must agree with the schedule log and
with the epochs the run committed (Cerebro's invariant 1: in an epoch, each config trains on every partition exactly
once). Pure: numbers, lists and DataFrames in, `CompletenessProblem`s out; no Ray, no torch, no files.

What the rules compare, per config (`visit_problems`):

    state     {epoch: [partitions absorbed, in order]} of its latest verified checkpoint, and that checkpoint's count
              of training units (the `checkpoints` table's `units`)
    log       its done training units in log order (`logged_visits`: a gang's rows, one per worker, share a `group`
              and count once per partition, as the worker records the gang's step once per partition)
    epochs    the epochs the run committed for it (`n`: epochs 0..n-1 are finished, n is the one in progress)

Rules (the `rule` of a problem):

    unreadable         no verified checkpoint holds its state, but it trained (the log has units, or it committed
                       epochs)
    stale              its newest checkpoint does not verify: the proof read is an older one
    count              the state records a different number of visits than its checkpoint's unit count
    repeated           an epoch of the state absorbed a partition more than once
    unknown_partition  the state or the log names a partition the run does not have
    unlogged           the state records a visit the log has no done unit for (visits inherited, e.g. a clone that
                       kept its source's record, or planted)
    lost               the log has a done unit the state does not record (a visit lost)
    order              the state absorbed an epoch's partitions in another order than the log ran them
    gap                a finished epoch (< n) is missing partitions in the state
    beyond             the state or the log has visits of an epoch after the one in progress (> n)
    uncommitted        a config that completed or was pruned trained in epoch n, which the run never committed
    metrics            the epochs table's epochs of the config are not exactly 0..n-1

What is legitimately different, and why:

- Evaluation units absorb nothing: only `train` units count.
- Units re-run after a lost worker, a lost state or a crash: only `done` rows count (the first tries are logged
  `interrupted`, `failed` or `lost`), and the re-run is the one the state absorbed.
- A config stopped by a person (`stopped`), or still `active` in a run that crashed or still runs: its epoch n may
  be partial, or even complete and not yet committed.
- An `active` config's state may lag the log within its uncommitted epoch(s) (checkpoints are written off the
  critical path; a resume marks the units after the checkpoint `lost` and re-runs them): `lost` is not reported for
  epochs >= n.
- A `failed` config has no final checkpoint (its state may lag the log anywhere), and a config failed on resume
  failed precisely because its readable state lacked committed epochs: `lost`, `gap` and `unreadable` are not
  reported for it. What it does record must still be logged (`unlogged`, `repeated`, `count`, `beyond`).
- A clone (PBT's exploit, `clone_config`) starts from its source's weights with an empty record: its own epochs
  count from 0, so a clone that kept its source's visits is `unlogged`/`repeated`/`count`.
- Frozen layers (Egeria) and their activation cache change what a unit computes, not which units run: no exception.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

RULES = ("unreadable", "stale", "count", "repeated", "unknown_partition", "unlogged", "lost", "order", "gap", "beyond",
         "uncommitted", "metrics")
#: outcomes (`framework.result.OUTCOMES`) whose epoch in progress may hold visits
_IN_PROGRESS = ("stopped", "active", "failed")
COLUMNS = ["config_id", "epoch", "rule", "detail"]

Visits = Mapping[int, Sequence[int]]  # epoch -> partitions absorbed, in order


class IncompleteRunError(RuntimeError):
    """A run whose completeness proof does not check out (`Result.assert_complete`): the message lists why."""


@dataclass(frozen=True)
class CompletenessProblem:
    """One way a config's visit record disagrees with the log or the committed epochs. `epoch` None: the config as
    a whole (its checkpoint, its count)."""

    config_id: int
    epoch: int | None
    rule: str
    detail: str

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"`rule` is {self.rule!r}, but must be one of {list(RULES)}")

    def __str__(self) -> str:
        where = f"config {self.config_id}" + (f", epoch {self.epoch}" if self.epoch is not None else "")
        return f"{where}: {self.rule}: {self.detail}"


def run_partitions(meta: Mapping[str, Any], schedule: pd.DataFrame) -> list[int]:
    """The run's training partitions, the units' `partition`s: as its dataset was recorded (`meta["dataset"]`),
    else every partition its placement (partition -> workers, of a `mop` run) or its log names (a run whose meta is
    gone). The full-data executors (`task_parallel`, `sequential`) train on one "partition" 0 that is all the data
    (`PartitionedDataset.worker_entries(per_partition=False)`)."""
    if meta.get("executor", "mop") != "mop":
        return [0]
    data = meta.get("dataset") or {}
    if data.get("kind") == "arrays" and isinstance(data.get("num_partitions"), int):
        return list(range(data["num_partitions"]))
    if data.get("kind") == "files" and isinstance(data.get("train"), list):
        return list(range(len(data["train"])))
    placed = {int(p) for p in meta.get("placement") or {}}
    logged = set() if schedule.empty else {int(p) for p in schedule.partition[schedule.kind == "train"]}
    return sorted(placed | logged)


def logged_visits(schedule: pd.DataFrame) -> dict[int, list[tuple[int, int]]]:
    """config -> its done training units as (epoch, partition), in log order, from a schedule in log order (the
    `units` table's `seq`, as `Result.schedule` keeps it) with columns config_id, epoch, partition, kind and
    `group` (optional). Rows of one gang step (one `group`) on the same partition count once: each worker of a gang
    logs its own row, but the gang's state absorbs each of its partitions once. Only done rows belong in
    `schedule`."""
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    if schedule.empty:
        return {}
    train = schedule[schedule.kind == "train"]
    groups = train["group"] if "group" in train else pd.Series(pd.NA, index=train.index)
    seen: set[tuple[int, int, int, int]] = set()
    for cid, e, p, g in zip(train.config_id, train.epoch, train.partition, groups):
        cid, e, p = int(cid), int(e), int(p)
        if not pd.isna(g):
            key = (cid, e, p, int(g))
            if key in seen:
                continue
            seen.add(key)
        out[cid].append((e, p))
    return dict(out)


def visit_problems(
    config_id: int,
    *,
    status: str,
    epochs: int,
    partitions: Iterable[int],
    visited: Visits | None,
    units: int | None = None,
    logged: Sequence[tuple[int, int]] | None = None,
    metric_epochs: Iterable[int] | None = None,
) -> list[CompletenessProblem]:
    """What is wrong with one config's visit record `visited` (None: no readable state), given its outcome `status`
    (`completed`, `pruned`, `stopped`, `failed`, `active`), the `epochs` the run committed for it, the run's
    `partitions`, its checkpoint's unit count `units`, its done training units `logged` as (epoch, partition) in log
    order, and the epochs its metrics were committed for (`metric_epochs`). The last three are optional: without
    them (the driver's mirror at the end of a run) only the record itself and the committed epochs are checked."""
    parts = set(partitions)
    failed, n = status == "failed", int(epochs)
    problems: list[CompletenessProblem] = []

    def problem(epoch: int | None, rule: str, detail: str) -> None:
        problems.append(CompletenessProblem(config_id, epoch, rule, detail))

    if metric_epochs is not None:
        have = sorted({int(e) for e in metric_epochs})
        if have != list(range(n)):
            problem(None, "metrics", f"the run committed {n} epochs, but the epochs table holds epochs {have}")
    log: dict[int, list[int]] = defaultdict(list)
    for e, p in logged or ():
        log[int(e)].append(int(p))
    if visited is None:
        if not failed and (n > 0 or logged):
            problem(None, "unreadable", f"no verified checkpoint holds its state, but it committed {n} epochs and "
                                        f"the log has {len(logged or ())} training units")
        return problems
    state = {int(e): [int(p) for p in ps] for e, ps in visited.items()}
    if units is not None and sum(map(len, state.values())) != units:
        problem(None, "count", f"the state records {sum(map(len, state.values()))} visits, but its checkpoint holds "
                               f"{units} training units")
    for e in sorted(set(state) | set(log)):
        mine, theirs = state.get(e, []), log.get(e, [])
        twice = sorted(p for p, k in Counter(mine).items() if k > 1)
        if twice:
            problem(e, "repeated", f"the state absorbed partitions {twice} more than once: {mine}")
        foreign = sorted({*mine, *theirs} - parts)
        if foreign:
            problem(e, "unknown_partition", f"partitions {foreign} are not among the run's {sorted(parts)}")
        if e > n:
            problem(e, "beyond", f"visits of epoch {e} (state {mine}, log {theirs}), but only {n} epochs are "
                                 f"committed: epoch {n} is the one in progress")
        elif e == n and (mine or theirs) and status not in _IN_PROGRESS:
            problem(e, "uncommitted", f"it is {status}, but trained in epoch {e} (state {mine}, log {theirs}), which "
                                      f"the run never committed")
        if e < n and not failed:
            missing = sorted(parts - set(mine))
            if missing:
                problem(e, "gap", f"finished epoch {e} without absorbing partitions {missing} (state {mine})")
        if logged is None:
            continue
        extra = sorted((Counter(mine) - Counter(theirs)).elements())
        if extra:
            problem(e, "unlogged", f"the state records visits of partitions {extra} that the log has no done "
                                   f"training unit for (state {mine}, log {theirs})")
        lost = sorted((Counter(theirs) - Counter(mine)).elements())
        lagging = failed or (status == "active" and e >= n)  # the state may lag the log here: a prefix of it
        if lost and not lagging:
            problem(e, "lost", f"the log has done training units on partitions {lost} that the state does not record "
                               f"(state {mine}, log {theirs})")
        elif not extra and mine != theirs[:len(mine)]:
            problem(e, "order", f"the state absorbed {mine}, but the log ran {theirs}")
    return problems


def as_frame(problems: Iterable[CompletenessProblem]) -> pd.DataFrame:
    """Problems as a long DataFrame: config_id, epoch (<NA>: the config as a whole), rule, detail."""
    rows: list[dict[str, Any]] = [{"config_id": p.config_id, "epoch": p.epoch, "rule": p.rule, "detail": p.detail}
                                  for p in problems]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["config_id"] = df["config_id"].astype("int64")
    df["epoch"] = df["epoch"].astype("Int64")
    return df


def describe(problems: Sequence[CompletenessProblem], shown: int = 5) -> str:
    """The first `shown` problems, one a line, and how many more."""
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    return "\n".join(str(p) for p in problems[:shown]) + more
