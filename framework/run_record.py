"""What a run records about itself when it starts, and what `ModelSelection.resume` reads back.

`record_run` writes the catalog's meta: the run's options (`RunOptions.to_meta`), its placement, dataset, procedure,
and the names of its functions and code. `load_run` verifies a run directory and reads those back as the pieces of
a `ModelSelection` that continues it; `is_finished` and `reopen_run` are the other steps of a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from framework.options import RunOptions
from framework.store.catalog import CATALOG_FILE, SQLiteCatalog, check_verified, confine
from framework.store.checkpoint import CheckpointStore
from framework.store.inbox import read_requests
from framework.store.signing import loads_signed
from framework.store.storage import RunStorage, git_revision

if TYPE_CHECKING:  # (torch comes with the data module, Optuna with automl: the command line reads run records
    # without them)
    from automl import Procedure
    from framework.data import PartitionedDataset
    from framework.driver.commands import InboxCommands
    from framework.functions import UserFunctions


def extract_ref(extract: Callable | None) -> str | None:
    """What the run log records about `extract`: a function's `module:qualname`, or an object's class."""
    from framework.trainable import function_ref  # (torch comes with it: see `PartitionedDataset` above)

    if extract is None:
        return None
    if hasattr(extract, "__qualname__"):
        return function_ref(extract)
    return function_ref(type(extract))


def code_digest() -> str:
    """sha256 over this package's source files (framework, automl, simulators): names the code that ran even
    where no git revision is known."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for pkg in ("framework", "automl", "simulators"):
        for dirpath, dirs, files in sorted(os.walk(os.path.join(root, pkg))):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()


def record_run(
    catalog: SQLiteCatalog,
    options: RunOptions,
    *,
    placement: Mapping[int, list[int]],
    procedure: Procedure,
    dataset: PartitionedDataset,
    functions: UserFunctions,
    storage_uri: str | None,
    start_time: float,
) -> None:
    """Write a new run's meta. `functions`: what the workers run; the user functions (`framework.functions.FUNCTIONS`)
    are recorded by name (the names replay imports; the catalog signs every meta row, so a run directory cannot make
    replay call others), `extract` by its name or class. `driver` is this process (pid and host): whether it is
    still alive tells a running run from a crashed one (`framework.steering.status`)."""
    from framework.trainable import function_ref

    assert options.storage_path is not None
    data_desc = dataset.save(os.path.join(options.storage_path, "data"))
    catalog.set_meta(
        start_time=start_time, **options.to_meta(), num_threads=options.num_threads,
        placement={str(k): v for k, v in placement.items()}, extract=extract_ref(functions.extract),
        synchronous=options.deterministic or getattr(procedure, "synchronous", True),
        procedure=type(procedure).__name__, dataset=data_desc, git_revision=git_revision(),
        code_digest=code_digest(), storage_uri=storage_uri,
        functions={n: function_ref(f) for n, f in functions.named().items()},
        driver=driver_identity(),
    )


def driver_identity() -> dict[str, Any]:
    """The process that writes a run: what `record_run` and a `resumed` event record."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def inbox_commands(catalog: SQLiteCatalog, storage_path: str) -> InboxCommands:
    """The commands other processes send a run (`framework.connect`): the requests in its inbox that no `command`
    event of the run names yet (all of them, for a new run)."""
    from framework.driver.commands import InboxCommands

    run_id = catalog.meta()["run_id"]
    seen = {json.loads(d).get("request") for d in catalog.events("command").detail} - {None}
    return InboxCommands(lambda after: read_requests(storage_path, run_id, after), seen)


@dataclass(frozen=True)
class LoadedRun:
    """What `load_run` read from a run directory: enough to build the `ModelSelection` that continues it."""

    storage: RunStorage
    options: RunOptions  # the recorded options, with resume's overrides
    procedure: Procedure
    dataset: PartitionedDataset


def load_run(
    storage_path: str,
    procedure: Procedure | str | None,
    extract: Callable | None,
    trust_unverified: bool,
    overrides: Mapping[str, Any],
) -> LoadedRun:
    """Verify the run in `storage_path` (a URI is fetched into its local working copy first) and read it back; see
    `ModelSelection.resume`. `overrides` are `RunOptions.RESUMABLE` options; options the run did not record take
    `RunOptions`' defaults (`RunOptions.from_meta`)."""
    storage = RunStorage(storage_path, "resumed")
    if storage.uri is not None and not os.path.exists(os.path.join(storage.local, CATALOG_FILE)):
        storage.pull()  # another machine's run: its mirror (a local working copy is never older than it)
    path = storage.local
    if not os.path.exists(os.path.join(path, CATALOG_FILE)):
        raise FileNotFoundError(f"`storage_path` {storage_path!r} holds no {CATALOG_FILE}: nothing to resume")
    catalog = SQLiteCatalog(os.path.join(path, CATALOG_FILE), readonly=True)
    try:
        check_verified(catalog, "resume", trust_unverified)
        meta = catalog.meta()
        _, blob, signature = catalog.last_round()
    finally:
        catalog.close()
    if meta.get("checkpoint") == "off":
        raise ValueError(f"the run in {storage_path!r} was made with checkpoint='off': it wrote no states to "
                         "resume from (only each config's final one)")
    if procedure is None:
        if blob is None:
            raise RuntimeError(f"the run in {storage_path!r} committed no round yet; pass `procedure=` to resume")
        procedure = loads_signed(blob, signature)
    if meta.get("extract") is not None and extract is None:
        raise ValueError(
            f"the run in {storage_path!r} used `extract` ({meta['extract']}), but `extract` is None; pass the same "
            "extract= to resume()"
        )
    overrides = dict(overrides)
    given = overrides.pop("dataset", None)  # the run's dataset passed again: a source run.db cannot rebuild
    options = RunOptions.from_meta(meta, **overrides)
    from framework.data import PartitionedDataset

    dataset = PartitionedDataset.load(confine(path, "data", "the data folder"), meta["dataset"], given)
    dataset.availability = {int(k): v for k, v in meta["placement"].items()} if options.executor == "mop" else None
    return LoadedRun(storage, options, procedure, dataset)


def is_finished(storage_path: str) -> bool:
    """Whether the run committed its last decision: no config is active after it (the procedure adds configs in
    the same commit that stops the others, so none active means it had nothing more to train)."""
    catalog = SQLiteCatalog(os.path.join(storage_path, CATALOG_FILE), readonly=True)
    try:
        return catalog.last_round()[0] >= 0 and not (catalog.configs().status == "active").any()
    finally:
        catalog.close()


def reopen_run(catalog: SQLiteCatalog, ckpt: CheckpointStore, options: RunOptions, functions: UserFunctions,
               entries: dict[int, tuple[list, list]], *, trust_unverified: bool, partial_removed: int) -> None:
    """A resumed run, once its writer has the catalog open: verified again (what changed since `load_run` checked is
    not trusted; on failure the catalog and `ckpt` are closed), its `resumed` event logged, and its damaged newest
    checkpoints rebuilt from the log where the result matches the recorded checksum (`framework.engine.rebuild`),
    re-running at most one epoch's training units per config. Not with layer freezing, and not for a GPU run in a
    driver without CUDA (the checksum could not match)."""
    try:
        check_verified(catalog, "resume", trust_unverified)
    except BaseException:
        ckpt.close()
        catalog.close()
        raise
    catalog.add_event("resumed", **driver_identity(), partial_checkpoints_removed=partial_removed)
    import torch  # (here, not with the module: the command line reads run records without torch)

    from framework.engine.rebuild import rebuild_checkpoints

    gpu = float(options.worker_resources.get("GPU", 0)) > 0
    if options.freezing is not None or (gpu and not torch.cuda.is_available()):
        return
    rebuild_checkpoints(catalog, functions, entries, seed=options.seed, data_on_device=options.data_on_device,
                        num_threads=options.num_threads, device="cuda" if gpu else "cpu", max_units=len(entries),
                        write=lambda line: print(line, file=sys.stderr, flush=True))


def expect_recorded_data(run: Any, catalog: SQLiteCatalog, entries: Mapping[int, tuple[list, list]],
                         accept_changed_data: bool) -> None:
    """A resume's data must be what the run read: no source names a file the run did not read (checked now, before
    any worker opens one), and every load is compared with the run's record (`RunState.sources_read`)."""
    if not isinstance(accept_changed_data, bool):
        raise TypeError(f"`accept_changed_data` is {accept_changed_data!r}, but must be True or False")
    recorded = recorded_prints(catalog)
    check_read_files(entries, recorded)
    run.expect_prints(recorded, accept_changed_data)


def recorded_prints(catalog: SQLiteCatalog) -> dict[str, dict[str, Any]]:
    """What the run's data sources read, by "split/partition/entry" (its `source_read` events; the latest of each):
    what a resume or replay compares its loads with (`RunState.sources_read`)."""
    out: dict[str, dict[str, Any]] = {}
    for detail in catalog.events("source_read").detail:
        d = json.loads(detail)
        entry = d.pop("entry", None)
        d.pop("worker", None)
        if isinstance(entry, str):
            out[entry] = d
    return out


def check_read_files(entries: Mapping[int, tuple[list, list]], recorded: Mapping[str, dict[str, Any]]) -> None:
    """Before any worker opens them: every file the run's sources name must be one the run read (a dataset entry
    edited to point elsewhere is refused; nothing outside what the run read is opened). A run that recorded no
    reads (from before fingerprints, or that never loaded) is not checked."""
    from framework.fingerprints import DataChangedError
    from framework.sources import Source

    read = {f["path"] for p in recorded.values() for f in p.get("files", [])}
    if not read:
        return
    for pair in entries.values():
        for source in (e for split in pair for e in split if isinstance(e, Source)):
            for f in source.files():
                if f not in read:
                    raise DataChangedError(f"the run's dataset names {f}, a file the run never read (was its run.db "
                                           "edited?); nothing the run did not read is opened")

