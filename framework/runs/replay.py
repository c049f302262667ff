"""Replay a finished run from its schedule log: same units, same per-config visit order, same seeds.

The replay is the driver loop itself (`framework.driver`) on a `LocalBackend`: one in-process worker holds every
partition and runs the logged units one at a time in the logged order (`LoggedOrder`), while `LoggedDecisions`
repeats the run's decisions (configs added and cloned at the commits where they appeared, stopped after the epochs
they trained, failed at the unit that failed them). Clones, checkpoints and epoch metrics therefore follow exactly
the rules of a live run. The worker uses as many torch threads as the run's workers did, so on CPU the final
weights are bit-identical to the run's. (With layer freezing the reference model is evaluated asynchronously, so
when a layer freezes can differ between a run and its replay.)
(`framework.engine.rebuild` uses the same property to repair one config's damaged checkpoint on resume.)
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Callable

import pandas as pd
import torch

from automl import ACTIVE, FAILED, PERSON, Decision, Procedure
from framework.data import PartitionedDataset
from framework.driver import Driver, SQLiteRunLog
from framework.driver.commands import Command, CommandSource
from framework.driver.configs import BY_PERSON
from framework.engine.faults import Fault, FaultPlan
from framework.engine.local import LocalBackend
from framework.functions import UserFunctions
from framework.options import SERIAL_QUEUE_DEPTH, RunOptions
from framework.result import CATALOG_FILE, CHECKPOINT_DIR, Result
from framework.run_record import check_read_files, recorded_prints
from framework.scheduling import Assignment, DispatchState, Scheduler, Unit
from framework.store.catalog import SQLiteCatalog, check_verified, confine, describe_problems, parent_id
from framework.store.checkpoint import CheckpointStore
from framework.store.signing import SignatureError
from framework.store.storage import RunStorage, default_root, is_uri, run_name, unusable_dir
from framework.trainable import function_ref, import_ref

REPLAY_WORKER = 0  # the one worker of a replay; the log keeps each unit's original worker
#: what replay reads from a run's meta (`ModelSelection` records them at the start of every run)
_META_NEEDED = ("functions", "dataset", "executor", "seed", "metric", "mode")


class LoggedDecisions(Procedure):
    """The decisions of a logged run, repeated: at commit k, the configs that first appeared in round k + 1 are
    added (`parent` None) or cloned; a config is stopped once it has trained the epochs it trained in the run
    (configs that failed are failed by their failing unit instead). Configs a person created (`by_person`) are
    `LoggedCommands`' to create."""

    def __init__(self, configs, synchronous: bool = True, fails: set[int] = frozenset(),
                 by_person: set[int] = frozenset()) -> None:
        self.synchronous = synchronous
        self._commit = -1
        self._new: dict[int, list[tuple[int | None, dict]]] = defaultdict(list)  # first round -> (parent, config)
        self._epochs: dict[int, int] = {}
        self._pruned: set[int] = set()
        for row in configs.itertuples():
            if int(row.config_id) not in by_person:  # (`LoggedCommands` creates those)
                self._new[int(row.first_round)].append((parent_id(row.parent), dict(row.config)))
            self._epochs[int(row.config_id)] = int(row.epochs)
            if row.outcome == "pruned":
                self._pruned.add(int(row.config_id))
        self._failed = set(fails)

    def step(self, states):
        self._commit += 1
        rows = self._new.get(self._commit, [])
        stop = [s.id for s in states if s.status == ACTIVE and s.id not in self._failed
                and s.epochs >= self._epochs[s.id]]
        return Decision(add=[dict(c) for p, c in rows if p is None],
                        clone=[(p, dict(c)) for p, c in rows if p is not None], stop=stop,
                        pruned=[cid for cid in stop if cid in self._pruned])


class LoggedCommands(CommandSource):
    """What a person did to the run's configs, repeated where it happened in the logged order of units.

    A config a person added or cloned is created when the replay reaches the round it was created in and every
    config with a smaller id exists (a warm clone once its source has absorbed as many units as when it was
    cloned), with the same budget. A config the run trained no further (a person stopped it, in the middle of an
    epoch or between two) is stopped once the replay has run its last logged unit. Resumes and extensions are not
    repeated as such: the replay runs each config's logged units in order, and `LoggedDecisions` stops it at its
    epochs. Not yet repeated: with an epoch barrier, a config stopped in one round and resumed in a later one (by a
    person, or by a procedure whose budget a person extended) holds the barrier in the replay.
    """

    def __init__(self, created: list[dict], order: list[Unit], scheduler: LoggedOrder) -> None:
        self.created, self.scheduler = sorted(created, key=lambda c: c["id"]), scheduler
        self.last: dict[int, int] = {}  # config -> index of its last unit in `order`
        for i, u in enumerate(order):
            self.last[u.config_id] = i
        self.run = None  # the driver's run state, set once the driver exists

    def poll(self) -> list[Command]:
        run = self.run
        if run is None or run.dispatch.flights:
            return []
        out: list[Command] = []
        n = len(run.configs)
        while self.created and self.created[0]["id"] == n and run.round >= self.created[0]["first_round"]:
            c = self.created[0]
            if c["parent"] is not None:
                if run.configs[c["parent"]].units < c["source_units"]:
                    break
                args = {"config_id": c["parent"], "overrides": c["config"], "epochs": c["budget"]}
                out.append(Command("clone_config", args, "replay"))
            else:
                out.append(Command("add_config", {"config": c["config"], "epochs": c["budget"]}, "replay"))
            self.created.pop(0)
            n += 1
        for c in run.configs.active():
            if c.open and self.scheduler._next > self.last.get(c.id, -1):  # the run trained it no further
                out.append(Command("stop_config", {"config_id": c.id}, "replay"))
        return out


def _created_by_a_person(events) -> dict[int, dict]:
    """The configs a person added or cloned, by id: config, parent, budget, and a warm clone's source units."""
    out: dict[int, dict] = {}
    for detail in events.detail:
        d = json.loads(detail)
        if not d.get("applied") or d.get("name") not in ("add_config", "clone_config"):
            continue
        for rec in d.get("steered", ()):
            if rec.get("origin") == PERSON and rec["id"] not in out:
                out[int(rec["id"])] = {"id": int(rec["id"]), "budget": rec["budget"],
                                       "source_units": d.get("source_units", 0)}
    return out


class LoggedOrder(Scheduler):
    """Dispatches the logged units in the logged order, one at a time, on the replay's worker; a logged pack
    (`packs`: its first unit -> its units, at their epochs) as the same pack, so its members train fused again, as they did."""

    name = "logged"

    def __init__(self, order: list[Unit], packs: dict[Unit, tuple[Unit, ...]] | None = None) -> None:
        self.order, self._next, self.packs = order, 0, packs or {}

    def select(self, state: DispatchState) -> list[Assignment]:
        if state.running:
            return []
        while self._next < len(self.order):
            unit = self.order[self._next]
            if state.is_eligible(unit, REPLAY_WORKER):
                self._next += 1
                members = [v for v in self.packs.get(unit, ()) if v == unit or state.is_eligible(v, REPLAY_WORKER)]
                return [Assignment(unit, (REPLAY_WORKER,), tuple(v.config_id for v in members),
                                   epochs=tuple(v.epoch for v in members))]
            if unit not in state.pending:  # its config is gone (units open before the scheduler is asked)
                self._next += 1
                continue
            return []
        return []


class _ReplayLog(SQLiteRunLog):
    """The replay's log: each unit row keeps the worker it ran on in the run."""

    def __init__(self, catalog: SQLiteCatalog, checkpoints: CheckpointStore, workers: dict) -> None:
        super().__init__(catalog, checkpoints)
        self.workers = workers

    def add_unit(self, round_: int, report, status: str) -> None:
        report.worker = self.workers.get(report.unit, report.worker)
        super().add_unit(round_, report, status)


def replay(
    storage_path: str,
    *,
    model_fn: Callable | None = None,
    train_fn: Callable | None = None,
    eval_fn: Callable | None = None,
    input_fn: Callable | None = None,
    out_path: str | None = None,
    extract: Callable | None = None,
    device: str | None = None,
    trust_unverified: bool = False,
    step_fn: Callable | None = None,
    eval_step: Callable | None = None,
    dataset: PartitionedDataset | None = None,
    accept_changed_data: bool = False,
) -> Result:
    """Re-run every completed unit of the run in `storage_path` in the logged order; return the replay's `Result`.

    User functions default to the ones the run recorded (`module:qualname`); functions defined in `__main__` or
    inside other functions must be passed explicitly. The replay is written to `out_path`, which must not hold a run
    yet (default: `<storage_path>-replay` next to the run, or `-replay-2`, `-replay-3`, ... when taken: nothing is
    written into the run); `storage_path` may be the URI a
    run was mirrored to (its replay then goes to a new folder under `~/modelhopper_runs` unless `out_path` says
    otherwise, and the temporary copy it reads is removed at the end). A run made with `ModelSelection(extract=...)`
    needs the same `extract`.
    `device`: where the replay trains ("cpu", "cuda", "cuda:1"); default: the run's device (a run whose workers
    asked for a GPU replays on "cuda"). Metrics match the run's within float tolerance on the run's device, and
    bit for bit on CPU.
    `trust_unverified`: replay a run whose catalog does not verify under this machine's key (refused otherwise with
    `UnverifiedRunError`); its function names are still never imported (pass the functions), and the replay's own
    catalog is left unsigned.
    `dataset`: the run's dataset passed again, for a run whose partitions came from a source its run.db cannot
    rebuild (`PartitionedDataset.from_torch_dataset`, `from_ray_dataset`, or a `to_tensors` function).
    `accept_changed_data`: go on where a source's files differ from what the run read (refused otherwise, naming the
    file); the replay's events record it.
    """
    args = {"model_fn": model_fn, "train_fn": train_fn, "eval_fn": eval_fn, "input_fn": input_fn, "extract": extract,
            "device": device, "trust_unverified": trust_unverified, "step_fn": step_fn, "eval_step": eval_step,
            "dataset": dataset, "accept_changed_data": accept_changed_data}
    if not is_uri(storage_path):
        return _replay_dir(storage_path, out_path=out_path, **args)
    copy = RunStorage(storage_path, "replayed").fetch()
    try:
        return _replay_dir(copy, out_path=out_path or os.path.join(default_root(), run_name("replay")), source=storage_path,
                           **args)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _replay_dir(
    storage_path: str,
    *,
    model_fn: Callable | None = None,
    train_fn: Callable | None = None,
    eval_fn: Callable | None = None,
    input_fn: Callable | None = None,
    out_path: str | None = None,
    extract: Callable | None = None,
    device: str | None = None,
    trust_unverified: bool = False,
    source: str | None = None,
    step_fn: Callable | None = None,
    eval_step: Callable | None = None,
    dataset: PartitionedDataset | None = None,
    accept_changed_data: bool = False,
) -> Result:
    """`replay` of a run directory on this machine (`source`: where it came from, when it is a copy)."""
    if out_path is not None and os.path.exists(os.path.join(out_path, CATALOG_FILE)):
        raise FileExistsError(f"`out_path` {out_path!r} already holds a run; choose a new directory")
    if out_path is not None and (why := unusable_dir(out_path)) is not None:
        raise ValueError(f"`out_path` is {out_path!r}, but {why}: it must be a new folder (or one that holds no run)")
    src = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE), readonly=True)
    try:
        unverified = check_verified(src, "replay", trust_unverified)
        meta, configs = src.meta(), src.configs()
        done, failed = src.units(status="done"), src.units(status="failed")
        created = _created_by_a_person(src.events("command"))
        prints = recorded_prints(src)
    finally:
        src.close()
    grouped = done[done["group"].notna()]
    if (grouped.groupby("group").worker.nunique() > 1).any():  # a gang (a pack ran on one worker: it replays)
        raise ValueError(f"the run in {storage_path!r} trained configs in data-parallel gangs (scheduler "
                         f"{meta.get('scheduler')!r}): replay runs units one at a time on one worker and cannot repeat "
                         "a gang's synchronous steps yet; resume and the run's checkpoints are not affected")
    lacking = [k for k in _META_NEEDED if k not in meta]
    if lacking:
        raise ValueError(f"`storage_path` {storage_path!r} holds a run.db whose meta lacks {lacking} (its meta table "
                         "was emptied, or the run never started): replay needs the run's settings")
    fns = meta["functions"]
    device = _replay_device(meta, device)
    given = {"model_fn": model_fn, "train_fn": train_fn, "eval_fn": eval_fn, "input_fn": input_fn,
             "step_fn": step_fn, "eval_step": eval_step}
    missing = [n for n, f in given.items() if f is None and fns.get(n) is not None]
    if missing and unverified:
        raise SignatureError(
            f"replay would import {', '.join(f'{n}={fns[n]}' for n in missing)} as named in {storage_path!r}, but "
            f"its run.db does not verify ({describe_problems(unverified)}); replay imports nothing it cannot "
            "verify: pass "
            f"{', '.join(f'{n}=' for n in missing)} to replay()")
    if meta.get("extract") is not None and extract is None:
        raise ValueError(
            f"the run in {storage_path!r} used `extract` ({meta['extract']}), but `extract` is None; pass the same "
            "extract= to replay()"
        )
    used = {n: f or import_ref(fns.get(n), n) for n, f in given.items()}
    ds = PartitionedDataset.load(confine(storage_path, "data", "the data folder"), meta["dataset"], dataset)
    held = ds.worker_entries(per_partition=meta["executor"] == "mop")
    check_read_files(held, prints)  # (before any file is opened)

    # what runs, in order: every done unit of a committed epoch, and of the epoch in which a config failed, plus
    # the unit that failed it (it fails the config again, through an injected fault)
    epochs = dict(zip(configs.config_id, configs.epochs))
    status = dict(zip(configs.config_id, configs.status))
    faults = []
    for cid, group in failed.groupby("config_id"):
        if status.get(cid) == FAILED:
            last = group.iloc[-1]
            faults.append(Fault("raise", config_id=int(cid), epoch=int(last.epoch), partition=int(last.partition),
                                kind=last.kind))
    fails = {f.config_id for f in faults}
    # a config a person stopped in the middle of an epoch trained part of it: those units run too
    cut = set(configs.config_id[configs.outcome == BY_PERSON])
    rows = [r for r in done.itertuples() if r.epoch < epochs[r.config_id] or r.config_id in fails | cut]
    rows += [failed[failed.config_id == cid].iloc[-1] for cid in sorted(fails)]
    rows.sort(key=lambda r: r.seq)
    order = [Unit(int(r.config_id), int(r.epoch), int(r.partition), r.kind) for r in rows]
    by_group: dict[float, list[Unit]] = {}  # a pack's units, in the logged order (its first: the pack's own unit)
    for u, r in zip(order, rows, strict=True):
        if not pd.isna(r.group):
            by_group.setdefault(r.group, []).append(u)
    packs = {us[0]: tuple(us) for us in by_group.values() if len(us) > 1}
    workers = {Unit(int(r.config_id), int(r.epoch), int(r.partition), r.kind): int(r.worker) for r in rows}

    if out_path is None:  # next to the run, never inside it: reading a run writes nothing into it
        out_path = _free_folder(os.path.normpath(storage_path) + "-replay")
    os.makedirs(os.path.join(out_path, CHECKPOINT_DIR), exist_ok=True)
    # a replay of a run that did not verify is not signed either: nothing re-signs what it could not verify
    dst = SQLiteCatalog(os.path.join(out_path, CATALOG_FILE), sign=not unverified)
    ckpt = CheckpointStore(os.path.join(out_path, CHECKPOINT_DIR), dst)
    threads = torch.get_num_threads()
    try:
        dst.set_meta(**{**{k: v for k, v in meta.items() if k != "run_id"},
                        "functions": {n: function_ref(f) for n, f in used.items()},
                        "replay_of": source or os.path.abspath(storage_path), "replay_device": device})
        backend = LocalBackend(
            UserFunctions(**used, extract=extract), held, num_threads=int(meta.get("num_threads", 1)), device=device,
            worker_options={"freezing": meta.get("freezing"), "data_on_device": meta.get("data_on_device", False)})
        procedure = LoggedDecisions(configs, synchronous=bool(meta.get("synchronous", True)),
                                    fails={f.config_id for f in faults} | cut, by_person=set(created))
        scheduler = LoggedOrder(order, packs)
        rows_by_id = configs.set_index("config_id")
        for c in created.values():
            c.update(config=dict(rows_by_id.config[c["id"]]), parent=parent_id(rows_by_id.parent[c["id"]]),
                     first_round=int(rows_by_id.first_round[c["id"]]))
        commands = LoggedCommands(list(created.values()), order, scheduler)
        options = RunOptions(seed=int(meta["seed"]), metric=meta["metric"], mode=meta["mode"],
                             scheduler=scheduler, max_worker_restarts=0, queue_depth=SERIAL_QUEUE_DEPTH)
        driver = Driver(backend, procedure, _ReplayLog(dst, ckpt, workers), {REPLAY_WORKER: sorted(held)},
                        sorted(held), options, FaultPlan(faults), commands=commands)
        commands.run = driver.run_state
        driver.run_state.expect_prints(prints, accept_changed_data)
        driver.run()
        for row in configs.itertuples():  # the run's own words for why a config failed
            if row.status == FAILED:
                dst.update_config(int(row.config_id), status=FAILED, error=row.error)
    finally:
        torch.set_num_threads(threads)
        ckpt.close()
        dst.close()
    result = Result(out_path, used["model_fn"])
    result.write()
    return result


def _free_folder(path: str) -> str:
    """`path`, or `path-2`, `path-3`, ...: the first that holds no run."""
    candidate, n = path, 1
    while os.path.exists(os.path.join(candidate, CATALOG_FILE)):
        n += 1
        candidate = f"{path}-{n}"
    return candidate


def _replay_device(meta: dict, device: str | None) -> str:
    """The device a replay trains on: `device` when given, else the run's (a GPU worker request means "cuda")."""
    if device is None:
        device = "cuda" if float((meta.get("worker_resources") or {}).get("GPU", 0)) > 0 else "cpu"
        source = "the run's device (its workers asked for a GPU)"
    else:
        source = "`device`"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"`device` is {device!r}, but must be a torch device such as 'cpu' or 'cuda:0'") from e
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{source} is {device!r}, but this machine has no CUDA device; pass device='cpu' to replay "
                         "on the CPU (metrics then match within float tolerance, not bit for bit)")
    return str(parsed)
