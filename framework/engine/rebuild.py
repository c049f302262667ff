"""Rebuild a config's damaged checkpoint from the schedule log (on resume, before any worker starts).

The log is the source of truth for what ran; a checkpoint is a copy of where it got to. Units are seeded by
(run seed, config, epoch, partition) and a config's state is rebuilt from scratch by `model_fn` each unit, so
re-running the training units the log records after the newest readable checkpoint gives, on the same device and
library versions, the very bytes the run wrote. The rebuilt file is used only when its sha256 is the recorded one:
then nothing the run committed changes. Otherwise nothing is touched, and resume fails the config if its readable
state lacks an epoch the run committed (`framework.driver.commit.restore`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from framework.engine.state import self_contained, unpack_state
from framework.engine.worker import Worker
from framework.functions import UserFunctions
from framework.scheduling import TRAIN, Unit
from framework.scheduling.units import UnitTask
from framework.store.catalog import SQLiteCatalog, UnsafePathError, parent_id
from framework.store.checkpoint import PARTIAL, CorruptCheckpointError, load_latest_verified, write_atomic


def rebuild_checkpoints(
    catalog: SQLiteCatalog,
    functions: UserFunctions,
    entries: dict[int, tuple[list, list]],
    *,
    seed: int,
    data_on_device: bool | None = None,
    num_threads: int = 1,
    device: str = "cpu",
    max_units: int | None = None,
    write: Callable[[str], Any] = print,
) -> list[dict[str, Any]]:
    """Repair the newest checkpoint of every active config where it is corrupt or missing, from the log.

    From the config's newest readable checkpoint (or from scratch, for a config that is not a clone), the training
    units the log records after it are re-run here, in order, with the run's seeds and `num_threads`, on `device`.
    The rebuilt state is written in place of the damaged file only when its sha256 equals the one the catalog
    recorded for it: the file is then exactly what the run wrote, and nothing the run committed changes. Otherwise
    (training that is not deterministic, another device or library version, user code that now fails) the file is
    left as it was, and resume handles the config as before (it fails when its readable state lacks a committed
    epoch). `functions`: what the workers run, with the run's `data_on_device` (layer freezing is not rebuilt).
    `entries`: what the workers load, by partition. `max_units`:
    the most training units re-run for one config (None: no limit), so a run directory that arrives without its
    checkpoints does not retrain every config in the driver. Each attempt is an event (`checkpoint_rebuilt` or
    `checkpoint_rebuild_failed`) and a line through `write`; returns their details.
    """
    configs = catalog.configs()
    done = catalog.units(status="done")
    # a config's chain in log order: one unit of a config runs at a time and the log records each as it finishes
    done = done[done.kind == TRAIN].sort_values("seq")
    outcomes = []
    for row in configs[configs.status == "active"].itertuples():
        cid, checkpoints = int(row.config_id), catalog.checkpoints(int(row.config_id), resolve=False)
        if not checkpoints:
            continue
        _, units, stored, digest = checkpoints[0]
        t0 = time.perf_counter()
        try:
            start, _, start_units, skipped = load_latest_verified(catalog, cid)
            if not skipped:
                continue  # the newest is intact: nothing to rebuild
            damage = skipped[0][1]
        except CorruptCheckpointError as e:  # none is readable
            start, start_units, damage = None, 0, str(e)
        absorbed = {(int(e), int(p)) for e, ps in (start or {}).get("visited", {}).items() for p in ps}
        mine = done[done.config_id == cid]
        todo = [Unit(cid, int(r.epoch), int(r.partition), TRAIN) for r in mine.itertuples()
                if (int(r.epoch), int(r.partition)) not in absorbed][: units - start_units]
        why = None
        if start is None and parent_id(row.parent) is not None:
            why = "it is a clone and no checkpoint of its starting state is readable"
        elif len(todo) != units - start_units:
            why = f"the log holds {len(todo)} of the {units - start_units} training units after the readable state"
        elif max_units is not None and len(todo) > max_units:
            why = (f"it would re-run {len(todo)} training units in the driver, more than `max_units` ({max_units}); "
                   "not rebuilt")
        else:
            try:  # the file is replaced only inside the run directory
                path = catalog.resolve(stored, cid, units)
            except UnsafePathError as e:
                why = str(e)
            else:
                why = _rerun(todo, start, dict(row.config), functions, data_on_device, entries, seed, num_threads,
                             device, path, digest)
        detail = {"config_id": cid, "units": units, "from_units": start_units, "rerun": len(todo),
                  "seconds": round(time.perf_counter() - t0, 3)}
        if why is None:
            catalog.add_event("checkpoint_rebuilt", **detail, damage=damage)
            write(f"config {cid}: rebuilt its newest checkpoint ({units} units) by re-running {len(todo)} training "
                  f"unit(s) from the log; the checksum matches the run's")
        else:
            catalog.add_event("checkpoint_rebuild_failed", **detail, damage=damage, reason=why)
            write(f"config {cid}: could not rebuild its newest checkpoint ({damage}): {why}")
        outcomes.append({**detail, "rebuilt": why is None, "reason": why})
    return outcomes


def _rerun(todo: list[Unit], state: dict | None, config: dict, functions: UserFunctions, data_on_device: bool | None,
           entries: dict, seed: int, num_threads: int, device: str, path: str, digest: str) -> str | None:
    """Run `todo` from `state`; put the result at `path` if its sha256 is `digest`. Returns why not, or None."""
    threads = torch.get_num_threads()
    rebuilt = f"{path}{PARTIAL}rebuilt"  # a crash now leaves a partial file that the next resume removes
    # the user's `extract` module goes on to the workers: this process moves and switches a copy, not it
    if isinstance(functions.extract, torch.nn.Module):
        functions = dataclasses.replace(functions, extract=copy.deepcopy(functions.extract))
    try:
        worker = Worker(0, functions, device=device, num_threads=num_threads, data_on_device=data_on_device)
        worker.load({p: entries[p] for p in sorted({u.partition for u in todo})})
        for unit in todo:
            state, report = worker.run(UnitTask(unit, config, seed), state)
            if report.error is not None:
                return f"its {unit} raised: {report.error.strip().splitlines()[-1]}"
        sha256, _ = write_atomic(self_contained(unpack_state(state)), rebuilt)
    except Exception as e:  # noqa: BLE001 - loading data, the device, the disk: the config is handled as before
        return f"{type(e).__name__}: {e}"
    finally:
        torch.set_num_threads(threads)
        del state
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # the workers' GPU, borrowed: give it back
    if sha256 != digest:
        os.remove(rebuilt)
        return (f"re-running gave other weights (sha256 {sha256[:12]}... instead of {digest[:12]}...): training is "
                "not deterministic here (or ran on another device or library version)")
    os.replace(rebuilt, path)
    return None
