"""Checks of what `ModelSelection` takes besides the run's options (those are `framework.options.RunOptions`): the
user's functions, the dataset, the procedure, the fault plan and where the run's directory goes. Each raises the
`TypeError`/`ValueError` that names the argument, its value and the rule, before any work starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from automl import Procedure
from framework.callbacks import Callback
from framework.data import PartitionedDataset, encode_entry
from framework.engine.faults import FaultPlan
from framework.functions import UserFunctions
from framework.result import CATALOG_FILE
from framework.store.storage import RunStorage, check_folder_name, run_name, unusable_dir


def check_user_code(model_fn: Any, train_fn: Any, eval_fn: Any, input_fn: Any, extract: Any, step_fn: Any = None,
                    eval_step: Any = None, pack: Any = 1) -> UserFunctions:
    """The user's functions as one value (`UserFunctions` checks each is callable, and that they train and
    evaluate), with what `ModelSelection` asks besides: training by `step_fn` (the engine's loop,
    `framework.engine.steps`) or a `train_fn` of the user's own, not both, and evaluation likewise; packs (`pack`
    other than 1) fuse the engine's loop, so they need a `step_fn`."""
    functions = UserFunctions(model_fn, train_fn, eval_fn, input_fn, step_fn, eval_step, extract)
    for own, step in (("train_fn", "step_fn"), ("eval_fn", "eval_step")):
        if getattr(functions, own) is not None and getattr(functions, step) is not None:
            raise TypeError(f"`{own}` and `{step}` are both given, but one does what the other does: keep "
                            f"`{step}` (the engine's loop) or `{own}` (your own)")
    if pack != 1 and step_fn is None:
        raise ValueError(f"`pack` is {pack!r}, but packs train their configs as one fused model in the engine's "
                         "loop, which a `train_fn` of your own keeps out of reach: pass step_fn=... or pack=1")
    return functions


def check_dataset(dataset: Any) -> PartitionedDataset:
    if not isinstance(dataset, PartitionedDataset):
        raise TypeError(f"`dataset` is a {type(dataset).__name__}, but must be a framework.PartitionedDataset")
    if not dataset.in_memory:  # file entries are stored in run.db for replay and resume: JSON must hold them
        for entry in (*dataset.train, *dataset.valid):
            encode_entry(entry)
    return dataset


def resolve_procedure(procedure: Any, procedure_args: Mapping[str, Any] | None = None) -> Procedure:
    """`procedure` itself, or the one a registered name or `"module:Class"` string names, constructed with
    `procedure_args`."""
    if procedure_args is not None and not isinstance(procedure_args, Mapping):
        raise TypeError(f"`procedure_args` is {procedure_args!r}, but must be a dict of keyword arguments or None")
    if isinstance(procedure, Procedure):
        if procedure_args:
            raise TypeError(f"`procedure_args` is {dict(procedure_args)!r}, but `procedure` is an instance already: "
                            "pass a name or a 'module:Class' string with it")
        return procedure
    if isinstance(procedure, str):
        from automl import load_procedure

        try:
            return load_procedure(procedure, **dict(procedure_args or {}))
        except (TypeError, ValueError) as e:  # its words name `spec` and options: say which arguments those were
            given = " with `procedure_args`" if procedure_args else ""
            hint = " (give them as procedure_args={...})" if "needs the option" in str(e) else ""
            raise type(e)(f"`procedure` is {procedure!r}{given}: {e}{hint}") from e
    raise TypeError(f"`procedure` is {procedure!r}, but must be an automl.Procedure (or a 'module:Class' string)")


def check_faults(faults: Any) -> FaultPlan:
    if faults is not None and not isinstance(faults, FaultPlan):
        raise TypeError(f"`faults` is {faults!r}, but must be a framework.engine.faults.FaultPlan or None")
    return faults if faults is not None else FaultPlan()


def new_run_storage(storage_path: str | None, name: str | None, procedure: Procedure) -> RunStorage:
    """Where a new run goes (see `ModelSelection`'s `storage_path` and `name`): a folder that can be made and that
    holds no run yet, locally or at its URI. Checked now, else `run` would fail only after Ray started."""
    if name is not None:
        check_folder_name("name", name)
    storage = RunStorage(storage_path, name or run_name(type(procedure).__name__.lower()))
    why = unusable_dir(storage.local)
    if why is not None:
        raise ValueError(f"`storage_path` is {storage_path!r}, but the run's folder {storage.local!r} cannot be "
                         f"made: {why}")
    if os.path.exists(os.path.join(storage.local, CATALOG_FILE)) or storage.remote_exists():
        raise FileExistsError(
            f"`storage_path` {storage.where!r} already holds a run; choose a new directory or use "
            "ModelSelection.resume()"
        )
    return storage


def check_callbacks(callbacks: Any, dashboard: Any = False) -> list[Callback]:
    """`ModelSelection(callbacks=..., dashboard=...)`: the `callbacks` (a list of `framework.Callback`s), then the
    dashboard's: `dashboard` is False (none), True (127.0.0.1, a free port), or a dict of
    `framework.dashboard.serve`'s `host`, `port` and `token`: a `framework.dashboard.DashboardCallback`."""
    if callbacks is None:
        callbacks = []
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` is {callbacks!r}, but must be a list of framework.Callback instances")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise TypeError(f"`callbacks` holds {cb!r}, but every entry must be a framework.Callback instance")
    callbacks = list(callbacks)
    if dashboard is False or dashboard is None:
        return callbacks
    if not (dashboard is True or isinstance(dashboard, dict) and set(dashboard) <= {"host", "port", "token"}):
        raise ValueError(f"`dashboard` is {dashboard!r}, but must be True, False or a dict with keys among 'host', "
                         "'port' and 'token'")
    from framework.dashboard import DashboardCallback  # (aiohttp is imported only by those who serve a page)

    return [*callbacks, DashboardCallback(**({} if dashboard is True else dashboard))]
