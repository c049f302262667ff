"""What watches a `ModelSelection` run from the driver's process: the progress bar over units, a leaderboard line
per round, the closing summary line, and the mirror of a run whose `storage_path` is a URI."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from framework.callbacks import Callback
from framework.engine.storage import RunStorage
from framework.result import Result


class ProgressBar(Callback):
    """A progress bar over units (over the run's `planned` units when the procedure knows them, else growing as
    epochs open), the run's one-line notices above it, and a leaderboard line at every epoch barrier; disabled
    (but still counting) when not `show`. `line()` gives the leaderboard line (`Driver.leaderboard_line`)."""

    def __init__(self, show: bool, planned_units: int | None, line: Callable[[float], str]) -> None:
        # in a job log (not a terminal) the bar is a status line every 30 s, not a line per refresh
        self.bar = tqdm(total=planned_units or 0, unit="unit", desc="model selection", disable=not show,
                        dynamic_ncols=True, mininterval=0.1 if sys.stderr.isatty() else 30.0)
        self.show, self.planned, self.line = show, bool(planned_units), line
        self._round_start = time.time()

    def on_units_opened(self, count: int) -> None:
        if not self.planned:
            self.bar.total += count
            self.bar.refresh()

    def on_unit_end(self, *args: Any) -> None:
        self.bar.update(1)

    def on_unit_failed(self, *args: Any) -> None:
        self.bar.update(1)

    def on_round_end(self, round: int) -> None:
        if self.show:
            self.bar.write(self.line(time.time() - self._round_start))
        self._round_start = time.time()

    def on_notice(self, line: str) -> None:
        tqdm.write(line)

    def close(self) -> None:
        if self.planned and self.bar.n < self.bar.total:  # configs that failed or stopped early: their work is done
            self.bar.total = self.bar.n
            self.bar.refresh()
        self.bar.close()


def print_summary(storage: RunStorage, result: Result, metric: str) -> None:
    """The run's closing line: where its results are, how many configs, the best one and its metric."""
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
