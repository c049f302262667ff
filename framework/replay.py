"""Replay a finished run from its schedule log: same units, same per-config visit order, same seeds.

The replay runs in-process (no Ray) with one `Worker` that holds every partition, using as many torch threads as the
run's workers did, so on CPU the final weights are bit-identical to the run's. (With layer freezing the reference
model is evaluated asynchronously, so when a layer freezes can differ between a run and its replay.)
"""

from __future__ import annotations

import copy
import importlib
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from framework.data import PartitionedDataset
from framework.engine.catalog import SQLiteCatalog
from framework.engine.checkpoint import write_atomic
from framework.engine.worker import UnitReport, UnitTask, Worker, epoch_metrics
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.scheduling import TRAIN, Unit


def _import_ref(ref: str | None, name: str) -> Callable | None:
    if ref is None:
        return None
    module, _, qualname = ref.partition(":")
    if module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"`{name}` was {ref!r} in the run, which cannot be imported again; pass `{name}=` to replay()"
        )
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def replay(
    storage_path: str,
    *,
    model_fn: Callable | None = None,
    train_fn: Callable | None = None,
    eval_fn: Callable | None = None,
    input_fn: Callable | None = None,
    out_path: str | None = None,
    extract: Callable | None = None,
) -> Result:
    """Re-run every completed unit of the run in `storage_path` in the logged order; return the replay's `Result`.

    User functions default to the ones the run recorded (`module:qualname`); functions defined in `__main__` or
    inside other functions must be passed explicitly. The replay is written to `out_path`
    (default: `<storage_path>/replay`). A run made with `ModelSelection(extract=...)` needs the same `extract`.
    """
    src = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE))
    try:
        meta = src.meta()
        configs = src.configs()
        units = src.units(status="done")
    finally:
        src.close()
    fns = meta["functions"]
    if meta.get("extract") is not None and extract is None:
        raise ValueError(
            f"the run in {storage_path!r} used `extract` ({meta['extract']}), but `extract` is None; pass the same "
            "extract= to replay()"
        )
    model_fn = model_fn or _import_ref(fns["model_fn"], "model_fn")
    train_fn = train_fn or _import_ref(fns["train_fn"], "train_fn")
    eval_fn = eval_fn or _import_ref(fns["eval_fn"], "eval_fn")
    input_fn = input_fn or _import_ref(fns.get("input_fn"), "input_fn")
    ds = PartitionedDataset.load(os.path.join(storage_path, "data"), meta["dataset"])
    if meta["executor"] == "mop":
        held = {p: ([ds.train[p]], [ds.valid[p]]) for p in range(ds.num_partitions)}
    else:
        held = {0: (ds.train, ds.valid)}

    out_path = out_path or os.path.join(storage_path, "replay")
    os.makedirs(os.path.join(out_path, CHECKPOINT_DIR), exist_ok=True)
    if os.path.exists(os.path.join(out_path, CATALOG_FILE)):
        os.remove(os.path.join(out_path, CATALOG_FILE))
    dst = SQLiteCatalog(os.path.join(out_path, CATALOG_FILE))
    threads = torch.get_num_threads()
    try:
        dst.set_meta(**{**meta, "replay_of": os.path.abspath(storage_path)})
        worker = Worker(-1, model_fn, train_fn, eval_fn, input_fn, num_threads=int(meta.get("num_threads", 1)),
                        freezing=meta.get("freezing"), extract=extract)
        worker.load(held)
        states: dict[int, dict | None] = {}
        counts: dict[int, int] = defaultdict(int)
        reports: dict[tuple[int, int], list[UnitReport]] = defaultdict(list)
        rounds: dict[tuple[int, int], int] = {}
        cfg = dict(zip(configs.config_id, configs.config))
        parent = dict(zip(configs.config_id, configs.parent))
        first_round = dict(zip(configs.config_id, configs.first_round))
        for row in configs.itertuples():
            dst.add_config(row.config_id, row.config, row.status, parent=_opt_int(row.parent), first_round=row.first_round)
            dst.update_config(row.config_id, epochs=int(row.epochs), error=row.error)
        for round_, group in units.groupby("round", sort=True):
            for cid, r0 in first_round.items():  # clones start from the parent's state at the end of the last round
                if r0 == round_ and _opt_int(parent[cid]) is not None:
                    src = states.get(_opt_int(parent[cid]))
                    states[cid] = None if src is None else {**copy.deepcopy(src), "visited": {}}
            for row in group.itertuples():
                unit = Unit(int(row.config_id), int(row.epoch), int(row.partition), row.kind)
                new_state, report = worker.run(UnitTask(unit, cfg[unit.config_id], int(meta["seed"])), states.get(unit.config_id))
                if report.error is not None:
                    raise RuntimeError(f"replay of {unit} failed although the run's unit succeeded:\n{report.error}")
                report.worker = int(row.worker)
                dst.add_unit(int(round_), report, status="done")
                reports[(unit.config_id, unit.epoch)].append(report)
                rounds[(unit.config_id, unit.epoch)] = int(round_)
                if unit.kind == TRAIN:
                    states[unit.config_id] = new_state
                    counts[unit.config_id] += 1
        for (cid, epoch), reps in sorted(reports.items()):
            dst.add_epoch(cid, epoch, rounds[(cid, epoch)], epoch_metrics(reps))
        for cid, state in states.items():
            if state is not None and counts[cid]:
                path = os.path.join(out_path, CHECKPOINT_DIR, f"config_{cid}_u{counts[cid]}.pt")
                digest, size = write_atomic(state, path)
                dst.add_checkpoint(cid, max(state["visited"]), counts[cid], path, digest, size)
    finally:
        torch.set_num_threads(threads)
        dst.close()
    result = Result(out_path, model_fn)
    result.write()
    return result


def _opt_int(v: Any) -> int | None:
    try:
        return None if v is None or v != v else int(v)  # NaN from pandas for missing parents
    except (TypeError, ValueError):
        return None
