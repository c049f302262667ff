"""What watches a `ModelSelection` run from the driver's process: the progress bar over units, a leaderboard line
per round, the closing summary lines (where the results are, where the time went), and the mirror of a run whose
`storage_path` is a URI."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import psutil
from tqdm import autonotebook, std
from tqdm.auto import tqdm

from framework.callbacks import Callback
from framework.result import CATALOG_FILE, Result
from framework.store.catalog import SQLiteCatalog
from framework.store.storage import RunStorage

#: where the progress bar writes to a file or a pipe (a job log): a status line at most this often, and a last one
STATUS_EVERY_S = 30.0
_DESC = "model selection"
_STATUS = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} units [{elapsed}<{remaining}, {rate_fmt}]"
_STATUS_UNKNOWN_TOTAL = "{desc}: {n_fmt} units [{elapsed}, {rate_fmt}]"


def _redraws(file: TextIO) -> bool:
    """Whether a bar redrawn in place suits `file`: a terminal, or a notebook (where `tqdm.auto` draws a widget)."""
    if autonotebook.tqdm is not std.tqdm:
        return True
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class ProgressBar(Callback):
    """A progress bar over units (over the run's `planned` units when the procedure knows them, else growing as
    epochs open), the run's one-line notices above it, and a leaderboard line at every epoch barrier; nothing is
    drawn when not `show`. `heading` (the run directory) is printed first, above the bar. `line()` gives the
    leaderboard line (`Driver.leaderboard_line`). Leaderboard lines and notices go to stdout, flushed at once.

    The bar writes to `file` (default: stderr). On a terminal (or in a notebook) it redraws in place, at most every
    0.1 s; to a file or a pipe (a job log) it writes a status line instead, at most one every `status_every_s`
    (`STATUS_EVERY_S`) and a last one at `close`, so a log holds a few lines rather than a redraw per unit.
    """

    def __init__(self, show: bool, planned_units: int | None, line: Callable[[float], str],
                 heading: str | None = None, file: TextIO | None = None,
                 status_every_s: float = STATUS_EVERY_S) -> None:
        self.file = sys.stderr if file is None else file
        self.show, self.planned, self.line = show, bool(planned_units), line
        self.n, self.total = 0, planned_units or 0
        self.redraws = show and _redraws(self.file)
        self.status_every_s = status_every_s
        if show and heading:
            print(heading, file=self.file, flush=True)
        self.bar = tqdm(total=self.total, unit="unit", desc=_DESC, disable=not self.redraws, file=self.file,
                        dynamic_ncols=True, mininterval=0.1)
        self._started = self._status_at = time.monotonic()
        self._round_start = time.time()

    def on_units_opened(self, count: int) -> None:
        if not self.planned:
            self.total += count
            if self.redraws:
                self.bar.total = self.total
                self.bar.refresh()

    def on_unit_end(self, *args: Any) -> None:
        self._advance()

    def on_unit_failed(self, *args: Any) -> None:
        self._advance()

    def _advance(self) -> None:
        self.n += 1
        if self.redraws:
            self.bar.update(1)
        elif self.show and time.monotonic() - self._status_at >= self.status_every_s:
            self._status()

    def _status(self) -> None:
        self._status_at = now = time.monotonic()
        text = std.tqdm.format_meter(self.n, self.total or None, now - self._started, prefix=_DESC, unit="unit",
                                     bar_format=_STATUS if self.total else _STATUS_UNKNOWN_TOTAL)
        print(text, file=self.file, flush=True)

    def on_round_end(self, round: int) -> None:
        if self.show:
            self._say(self.line(time.time() - self._round_start))
        self._round_start = time.time()

    def on_notice(self, line: str) -> None:
        self._say(line)

    def _say(self, text: str) -> None:
        tqdm.write(text)  # above the bar where one is drawn (a bar that is not drawn is not redrawn)
        if sys.stdout is not None:  # a job log's stdout is a pipe: the line is there now, not when a buffer fills
            sys.stdout.flush()

    def close(self) -> None:
        if self.planned and self.n < self.total:  # configs that failed or stopped early: their work is done
            self.total = self.n
            if self.redraws:
                self.bar.total = self.total
                self.bar.refresh()
        if self.show and not self.redraws:
            self._status()
        self.bar.close()


#: a run's time parts, in order (the keys `RunClock.parts` and the run's `time_split` meta use), and their labels
TIME_PARTS = {"before_run": "before run()", "ray": "Ray", "set_up": "set-up", "workers": "workers",
              "training": "training", "results": "results"}
_START_UP = ("before_run", "ray", "set_up", "workers")
_runs_timed = 0  # `RunClock`s made in this process
BEFORE_RUN_MAX_S = 300.0  # a longer wait before the first run is a process that did other work first, not start-up


def _time_before_first_run() -> float | None:
    """Seconds from this process's start to now (its imports and data preparation) when no run was timed in it
    before, it is not interactive (a notebook's or a shell's process has waited on a person) and they are at most
    `BEFORE_RUN_MAX_S` (a service that starts a selection an hour after it started has no start-up to show); else
    None."""
    global _runs_timed
    _runs_timed += 1
    ipython = sys.modules.get("IPython")
    interactive = bool(sys.flags.interactive or hasattr(sys, "ps1")
                       or (ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None))
    if _runs_timed > 1 or interactive:
        return None
    try:
        before = max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return None
    return before if before <= BEFORE_RUN_MAX_S else None


class RunClock(Callback):
    """Where a run's wall time went, in consecutive parts (`TIME_PARTS`), from `ModelSelection.run`'s start: the
    caller closes "ray" and "set_up" with `lap`; as an observer (the last one) the clock closes "workers" at
    `on_run_start`, "training" at the end of the last unit, and "results" (the last checkpoints, the workers
    stopped, the result files and plot written) at `on_run_end`, where it records the split in the run's catalog
    (meta `time_split`, also `result.meta["time_split"]`) and prints it to stderr as one line. A process's first
    run also counts the time before `run` (imports, data; `_time_before_first_run`). `first_unit_s`: seconds from
    `on_run_start` to the first unit's end."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        before = _time_before_first_run()
        if before is not None:
            self.parts["before_run"] = before
        self.first_unit_s: float | None = None
        self._lap = time.perf_counter()
        self._training: float | None = None  # when `on_run_start` came
        self._last_unit: float | None = None  # when the latest unit ended

    def lap(self, part: str, at: float | None = None) -> None:
        """Close `part` (a `TIME_PARTS` key): the time since the previous lap (until `at`, a `perf_counter` time)."""
        if part not in TIME_PARTS:
            raise ValueError(f"`part` is {part!r}, but must be one of {sorted(TIME_PARTS)}")
        now = time.perf_counter() if at is None else at
        self.parts[part] = self.parts.get(part, 0.0) + max(0.0, now - self._lap)
        self._lap = max(self._lap, now)

    def on_run_start(self, run: Any) -> None:
        self.lap("workers")
        self._training = self._lap

    def on_unit_end(self, *args: Any) -> None:
        self._last_unit = now = time.perf_counter()
        if self.first_unit_s is None and self._training is not None:
            self.first_unit_s = now - self._training

    def on_unit_failed(self, *args: Any) -> None:
        self.on_unit_end()

    def on_run_end(self, result: Result) -> None:
        # training ends with the last unit (none ended: it took no time); what follows is results
        self.lap("training", self._last_unit if self._last_unit is not None else self._lap)
        self.lap("results")
        split = self.split()
        result.meta["time_split"] = split
        catalog = SQLiteCatalog(os.path.join(result.storage_path, CATALOG_FILE))
        try:
            catalog.set_meta(time_split=split)
        finally:
            catalog.close()
        print(self.line(), file=sys.stderr, flush=True)

    def split(self) -> dict[str, float]:
        """The parts measured (seconds, `TIME_PARTS` keys, in order), then `first_unit` when a unit ended, and
        `total` (their sum)."""
        split = {k: round(self.parts[k], 3) for k in TIME_PARTS if k in self.parts}
        total = round(sum(split.values()), 3)
        if self.first_unit_s is not None:
            split["first_unit"] = round(self.first_unit_s, 3)
        return {**split, "total": total}

    def line(self) -> str:
        """`time: 21.3 s: start-up 17.6 s (before run() 6.4, Ray 7.9, set-up 0.2, workers 3.1), training 2.4 s
        (first unit 0.6), results 1.3 s`."""
        parts = self.parts
        start = [k for k in _START_UP if k in parts]
        text = [f"start-up {sum(parts[k] for k in start):.1f} s ("
                + ", ".join(f"{TIME_PARTS[k]} {parts[k]:.1f}" for k in start) + ")"]
        if "training" in parts:
            first = f" (first unit {self.first_unit_s:.1f})" if self.first_unit_s is not None else ""
            text.append(f"training {parts['training']:.1f} s{first}")
        if "results" in parts:
            text.append(f"results {parts['results']:.1f} s")
        return f"time: {sum(parts.values()):.1f} s: " + ", ".join(text)


def print_summary(storage: RunStorage, result: Result, metric: str) -> None:
    """The run's closing line: where its results are, how many configs, the best one and its metric; or, when every
    config failed, that every config failed (`Result.all_failed`) and where their errors are."""
    if result.all_failed:
        first = str(result.failures.error.iloc[0] or "").strip().splitlines()
        print(f"Results: {storage.describe()} ({len(result.configs)} configs, every config failed"
              + (f"; the first: {first[-1][:200]}" if first else "")
              + "; tracebacks: result.failures, or modelhopper show RUN)", file=sys.stderr, flush=True)
        return
    try:
        best = f"{result.get_best_result().metrics.get(result.metric, float('nan')):.4g}"
    except LookupError:
        best = "none"
    print(f"Results: {storage.describe()} ({len(result.configs)} configs, best {result.best_config_id}, "
          f"{metric}={best})", file=sys.stderr, flush=True)


class StorageMirror(Callback):
    """Mirrors a run with a URI `storage_path` after each committed decision (at most every `sync_every_s`)."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage

    def on_decision(self, round: int, decision: Any) -> None:
        self.storage.push()
