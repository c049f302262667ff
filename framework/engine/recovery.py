"""The driver's recovery decisions as pure functions (no Ray, no I/O), so each rule is tested with numbers alone.

- `should_retry`: does a unit whose user code raised run again, or does its config fail?
- `units_to_redo`: after a config's state object was lost and read back from an older checkpoint, which units of the
  current epoch must train again (or can they not be re-done at all)?
- `resume_units`: after a driver crash, which units logged in the interrupted round are kept, which were lost, and
  which must run?
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from framework.scheduling import EVAL, TRAIN, Unit

Visits = Mapping[int, Sequence[int]]  # epoch -> partitions absorbed, in order


def should_retry(failures: int, max_retries: int) -> bool:
    """A config whose user code failed `failures` times so far (this one included) retries while that is at most
    `max_retries`; then it fails."""
    return failures <= max_retries


def units_to_redo(mirror: Visits, restored: Visits, epoch: int, behind: int) -> list[int] | None:
    """Partitions of `epoch` to train again after a restore.

    `mirror` is what the driver saw the config absorb, `restored` what the checkpoint it fell back to holds, and
    `behind` how many training units the checkpoint lags the driver. The units to redo are the current epoch's
    partitions the checkpoint lacks. If they do not account for every lost unit, the lost work crossed into an
    epoch whose metrics are already committed, and it cannot be re-done: None.
    """
    redo = [p for p in mirror.get(epoch, []) if p not in restored.get(epoch, [])]
    return redo if behind == len(redo) else None


def resume_units(
    config_id: int,
    epoch: int,
    partitions: Iterable[int],
    absorbed: Sequence[int],
    logged: Iterable[tuple[int, Unit]],
) -> tuple[list[int], list[int], list[Unit]]:
    """Split a config's units of the interrupted round into kept, lost and still to run.

    `absorbed` are the partitions of `epoch` the config's restored checkpoint holds, `logged` the `(seq, unit)`
    rows the log has for the config in that round. A train unit is kept when the checkpoint absorbed its partition;
    an eval unit when the checkpoint absorbed every partition (it evaluated the epoch's final weights). Everything
    else logged was lost with the crash. Returns (kept seqs, lost seqs, units to run).
    """
    partitions = sorted(partitions)
    complete = set(absorbed) >= set(partitions)
    kept, lost, have = [], [], set()
    for seq, u in logged:
        if (u.kind == TRAIN and u.partition in absorbed) or (u.kind == EVAL and complete):
            kept.append(seq)
            have.add((u.partition, u.kind))
        else:
            lost.append(seq)
    todo = [Unit(config_id, epoch, p, kind) for kind in (TRAIN, EVAL) for p in partitions if (p, kind) not in have]
    return kept, lost, todo
