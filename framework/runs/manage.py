"""The runs on disk, as a user looks after them: list them, tell running from crashed ones, compare, export and resume
them. What `modelhopper list|status|compare|export|resume` prints; Python users call the same functions.

Reading a run never writes into it (`Result.open` opens its catalog read-only). Nothing a run names is imported
unless its catalog verifies under this machine's key (`resume_run`).

**Status rule**: `framework.steering.status` (a run is `finished`, `running`, `crashed`, `running?`, `unknown` or
`unreadable`); its names are here too.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from framework.functions import FUNCTIONS
from framework.steering.status import (
    open_quietly,
    opened,
    run_status,
)
from framework.store.catalog import CATALOG_FILE, CatalogError, SQLiteCatalog, check_verified
from framework.store.storage import default_root, is_uri, run_name, unusable_dir
from framework.text import printable

if TYPE_CHECKING:  # pandas is imported where a DataFrame is made: `modelhopper list` prints `run_rows` without it
    import pandas as pd

    from framework.result import Result

__all__ = ["compare_runs", "export_run", "find_runs", "list_runs", "resume_run", "run_rows"]

EXPORT_FORMATS = ("csv", "parquet")


def _from_python(extra: str = ", input_fn=...") -> str:
    """How to resume from Python what the command line cannot."""
    return f"ModelSelection.resume(path, model_fn, train_fn, eval_fn{extra}) from Python"


def find_runs(root: str, max_depth: int = 4) -> list[str]:
    """The run directories (folders holding `run.db`) at most `max_depth` levels under `root` (`root` itself
    included). A run's own folders and hidden ones (the `.working` copies of mirrored runs) are not searched, nor
    are links."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"`root` {root!r} is not a folder" if os.path.exists(root)
                                else f"`root` {root!r} does not exist")
    found: list[str] = []
    stack = [(os.path.abspath(root), 0)]  # depth first, in name order; a stack, not recursion: any depth is fine
    while stack:
        folder, depth = stack.pop()
        if os.path.isfile(os.path.join(folder, CATALOG_FILE)):
            found.append(folder)
            continue
        if depth >= max_depth:
            continue
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # unreadable: nothing of it can be listed
        stack += [(e.path, depth + 1) for e in reversed(entries)
                  if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    return found


LIST_COLUMNS = ["path", "status", "configs", "best", "metric", "mode", "last_activity", "age_s", "verified", "pid",
                "error"]


def run_rows(root: str | None = None, max_depth: int = 4, now: float | None = None) -> list[dict[str, Any]]:
    """`list_runs` as plain dicts, one per run, newest first, with its columns as keys (`LIST_COLUMNS`): what
    `modelhopper list` prints, without pandas (a run that does not verify is read as a `Result`, which imports it)."""
    given = root is not None
    root = os.path.abspath(os.path.expanduser(root if given else default_root()))
    now = time.time() if now is None else now
    rows = []
    # the default root does not exist before the first run: no runs (a root the user names must exist)
    for path in find_runs(root, max_depth) if given or os.path.exists(root) else []:
        rel = printable(os.path.relpath(path, root))
        try:
            s = run_status(path, now)
        except (CatalogError, ValueError, TypeError, KeyError, OSError) as e:
            mtime = os.path.getmtime(os.path.join(path, CATALOG_FILE))
            rows.append({"path": rel, "status": "unreadable", "configs": 0, "best": float("nan"), "metric": None,
                         "mode": None, "last_activity": mtime, "age_s": now - mtime, "verified": False, "pid": None,
                         "error": printable(f"{type(e).__name__}: {e}")})
            continue
        best = s["best"]["value"] if s["best"] is not None and s["best"]["value"] is not None else float("nan")
        rows.append({"path": rel, "status": s["status"], "configs": s["num_configs"], "best": best,
                     "metric": _text(s["metric"]), "mode": _text(s["mode"]), "last_activity": s["last_activity"],
                     "age_s": s["age_s"], "verified": s["verified"], "pid": s["pid"], "error": None})
    # newest first; runs of the same time in the order found, one whose time is NaN last (as pandas sorts)
    return sorted(rows, key=lambda r: (r["last_activity"] != r["last_activity"], -r["last_activity"]))


def list_runs(root: str | None = None, max_depth: int = 4, now: float | None = None) -> pd.DataFrame:
    """One row per run under `root` (default `framework.store.storage.default_root()`, see `find_runs`), newest first:
    `path` (relative to `root`), `status` (module docstring), `configs`, `best` (the best config's value of the
    run's `metric`, ranked by its `mode`; NaN when none has one), `last_activity` (epoch seconds) and `age_s`,
    `verified`, `pid` (of a running run's driver) and `error` (why a run that is `unreadable` could not be read).
    Runs that do not verify are listed too (`verified` False); nothing they name is imported. The text columns are
    `framework.text.printable`: a folder whose name is not UTF-8 (an `unreadable` run: SQLite cannot open it) is
    listed with its bytes escaped (`run-\\xff`), and no control character of a name or an edited catalog reaches a
    terminal. `run_rows` gives the same rows as dicts."""
    import pandas as pd

    df = pd.DataFrame(run_rows(root, max_depth, now), columns=LIST_COLUMNS)
    df["pid"] = df.pid.astype("Int64")
    return df


def _text(value: Any) -> Any:
    """A str an (edited) catalog holds, `printable`; anything else as it is."""
    return printable(value) if isinstance(value, str) else value


def age(seconds: float) -> str:
    """A duration as users read a run's age: `"45s"`, `"3m"`, `"2h"`, `"5d"`."""
    seconds = max(0.0, float(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# ---- compare and export -----------------------------------------------------------------------------------------
COMPARE_COLUMNS = ["run", "rank", "config_id", "metric", "mode", "value", "epoch", "epochs_trained", "status",
                   "config"]


def compare_runs(paths: list[str], metric: str | None = None, mode: str | None = None, scope: str = "last",
                 top: int = 1) -> pd.DataFrame:
    """The best `top` configs of each run (`Result.get_dataframe(metric, mode, scope)`), one row each, the runs in
    the order given: `run`, `rank` (1 = the run's best), `config_id`, the `metric` and `mode` it is ranked by and its
    `value` (with an averaging scope, the mean it is ranked by), `epoch`, `epochs_trained`, `status`, `config`.
    Each run is ranked by its own metric and mode unless `metric` (and, for a metric other than a run's, `mode`) is
    given. Reads only."""
    import pandas as pd

    if not paths:
        raise ValueError("`paths` is [], but compare needs at least one run")
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"`top` is {top!r}, but must be an int >= 1")
    frames = []
    for path in paths:
        with opened(path) as result:
            board = result.get_dataframe(metric, mode, scope).head(top)
            m, d = metric or result.metric, mode or result.mode
            key = "score" if "score" in board else m
            frames.append(pd.DataFrame({
                "run": path, "rank": range(1, len(board) + 1), "config_id": board.config_id.astype(int),
                "metric": m, "mode": d, "value": board[key] if key in board else float("nan"),
                "epoch": board.epoch, "epochs_trained": board.epochs_trained, "status": board.status,
                "config": [json.dumps(result.configs[int(c)], sort_keys=True, default=str) for c in board.config_id],
            }, columns=COMPARE_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def export_tables(result: Result) -> dict[str, pd.DataFrame]:
    """A run's tables as `export_run` writes them: `leaderboard`, `metrics` (one row per config x epoch),
    `schedule` (one row per unit), `configs` (status, epochs, parent and the config as JSON text), `failures`
    (tracebacks) and `events`."""

    configs = result.status.copy()
    configs["config"] = configs.config_id.map(lambda c: json.dumps(result.configs[c], sort_keys=True, default=str))
    return {"leaderboard": result.leaderboard(), "metrics": result.metrics, "schedule": result.schedule,
            "configs": configs, "failures": result.failures, "events": result.events}


def export_run(path: str, fmt: str = "csv", out: str | None = None) -> dict[str, str]:
    """Write the run's tables (`export_tables`) as `<name>.csv` or `<name>.parquet` files into a new folder `out`
    (default: `<run>-export` beside the run; a run given by URI: a new folder under the default root); returns
    name -> file. Reading a run never writes into it: an `out` inside the run, or one that exists and is not an empty
    folder, is refused. The files appear together (they are written to a temporary folder first)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"`format` is {fmt!r}, but must be one of {list(EXPORT_FORMATS)}")
    if out is None:
        out = os.path.join(default_root(), run_name("export")) if is_uri(path) else os.path.abspath(path) + "-export"
    out = os.path.abspath(out)
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"`out` {out!r} exists and is not empty: choose a new folder")
    if (why := unusable_dir(out)) is not None:
        raise ValueError(f"`out` is {out!r}, but {why}: it must be a new folder")
    if not is_uri(path):
        run = os.path.realpath(path)
        if os.path.commonpath([run, os.path.realpath(out)]) == run:
            raise ValueError(f"`out` is {out!r}, which is inside the run {path!r}: reading a run never writes into "
                             "it; choose a folder outside it")
    with opened(path) as result:
        tables = export_tables(result)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        names = {}
        for name, df in tables.items():
            names[name] = os.path.join(out, f"{name}.{fmt}")
            target = os.path.join(tmp, f"{name}.{fmt}")
            if fmt == "csv":
                df.to_csv(target, index=False)
            else:
                _storable(df).to_parquet(target, index=False)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return names


def _storable(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each object column that mixes value types (a hyper-parameter that is an int in one config and a
    string in another) as text, which Parquet can store."""

    df = df.copy()
    for col in df.select_dtypes(include="object").columns:
        types = {type(v) for v in df[col] if v is not None and v == v}
        if len(types) > 1:
            df[col] = [None if v is None or v != v else str(v) for v in df[col]]
    return df


# ---- resume -----------------------------------------------------------------------------------------------------
def resume_run(path: str, *, trust_unverified: bool = False, functions: Mapping[str, str] | None = None,
               progress: bool = True, **overrides: Any) -> Result:
    """Resume a crashed run with the functions it recorded: `ModelSelection.resume(path, model_fn, train_fn,
    eval_fn, input_fn=...)` whose functions are imported by their recorded `module:qualname`. Returns the finished
    run's `Result`; a run that had already finished is returned as it is (nothing imported, nothing started).

    `functions`: `module:qualname` names that replace recorded ones (e.g. `{"model_fn": "mypkg.models:build"}`).
    The names a run records are imported only when its catalog verifies under this machine's key; a run that does
    not is refused (`UnverifiedRunError`), and with `trust_unverified=True` it is resumed only with every function
    it needs named in `functions`. `overrides`: the options `ModelSelection.resume` may change
    (`framework.options.RESUMABLE`).

    Raises `ValueError` for a run that is running (or may be: see the module docstring), that committed no decision
    yet, that used `extract=`, or whose functions cannot be imported here (defined in `__main__` or inside a
    function, or in a module this process cannot import): resume those with `ModelSelection.resume` from Python.
    A run whose status is `unknown` (its driver cannot be checked from here and the run has not changed for
    `RECENT_S` seconds) is resumed: the caller makes sure its driver is gone."""
    from framework.selection import ModelSelection

    given = dict(functions or {})
    unknown = set(given) - set(FUNCTIONS)
    if unknown:
        raise ValueError(f"`functions` names {sorted(unknown)}, but may only name {list(FUNCTIONS)}")
    for name, ref in given.items():
        if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
            raise ValueError(f"`{name}` is {ref!r}, but must name a function as module:qualname, e.g. "
                             "'mypkg.train:model_fn'")
    state = run_status(path)
    if state["status"] == "finished":
        return open_quietly(path)
    if state["status"] in ("running", "running?"):
        d = state["driver"] or {}
        who = f"its driver (pid {d.get('pid')} on {d.get('host')})" if d.get("pid") else "its driver"
        why = "is alive" if state["status"] == "running" else (
            f"cannot be checked from {socket.gethostname()!r} and the run changed {age(state['age_s'])} ago")
        if state["locked"]:
            who, why = "a process on this host", "holds its writer lock (a run, or a resume that started)"
        raise ValueError(f"the run in {path!r} is {state['status']}: {who} {why}; resume it once that driver has "
                         "stopped")
    if state["rounds"] == 0:
        raise ValueError(f"the run in {path!r} committed no decision before it stopped, so no procedure state was "
                         f"saved: resume it with {_from_python(', procedure=...')}, or start it again")
    with opened(path) as result:  # a URI: its fetched copy; the catalog it checks is the one it read
        catalog = SQLiteCatalog(os.path.join(result.storage_path, CATALOG_FILE), readonly=True)
        try:
            unverified = check_verified(catalog, "resume", trust_unverified)
            meta = catalog.meta()
        finally:
            catalog.close()
    if meta.get("extract") is not None:
        raise ValueError(f"the run in {path!r} used `extract` ({meta['extract']}), which the command line cannot "
                         f"rebuild: resume it with {_from_python(', extract=...')}")
    recorded = meta.get("functions") if isinstance(meta.get("functions"), dict) else {}
    refs = {n: given.get(n) or recorded.get(n) for n in FUNCTIONS}
    if unverified:
        missing = [n for n in FUNCTIONS if n not in given and recorded.get(n) is not None]
        if missing:
            raise ValueError(f"the run in {path!r} is not verified, so the functions it names are not imported: "
                             f"name {', '.join(f'{n}={recorded[n]}' for n in missing)} yourself (CLI: "
                             f"{' '.join('--' + n.replace('_', '-') + ' MODULE:QUALNAME' for n in missing)}), or "
                             f"resume it with {_from_python()}")
    fns = {n: _import(refs[n], n, path) for n in FUNCTIONS}
    needs = (("model_fn", fns["model_fn"]), ("train_fn or step_fn", fns["train_fn"] or fns["step_fn"]),
             ("eval_fn, eval_step or step_fn", fns["eval_fn"] or fns["eval_step"] or fns["step_fn"]))
    lacking = [n for n, fn in needs if fn is None]
    if lacking:
        raise ValueError(f"the run in {path!r} records no {', '.join(lacking)}: resume it with {_from_python()}")
    sel = ModelSelection.resume(path, fns["model_fn"], fns["train_fn"], fns["eval_fn"],
                                input_fn=fns["input_fn"], step_fn=fns["step_fn"], eval_step=fns["eval_step"],
                                trust_unverified=trust_unverified, progress=progress, **overrides)
    return sel.run()


def _import(ref: str | None, name: str, path: str) -> Callable | None:
    """`import_ref` of a recorded (or given) name, every failure as one `ValueError` that says how to resume."""
    from framework.trainable import import_ref

    where = f"{_from_python()} (CLI: --{name.replace('_', '-')} MODULE:QUALNAME)"
    try:
        return import_ref(ref, name, where)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"`{name}` is {ref!r} in the run in {path!r}, which cannot be imported here ({e}); name one "
                         f"that can (CLI: --{name.replace('_', '-')} MODULE:QUALNAME), or resume it with "
                         f"{_from_python()}") from e


def iso(t: float | None) -> str | None:
    """Epoch seconds as local ISO time to the second, as the CLI prints them."""
    return None if t is None else _dt.datetime.fromtimestamp(float(t)).isoformat(sep=" ", timespec="seconds")
