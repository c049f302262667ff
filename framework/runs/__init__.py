"""Managing runs: the runs on disk, as a user looks after them (what the `modelhopper` commands call). The layer
above `ModelSelection`: it reads run directories (what `framework.run_record` records, where
`framework.store.storage` puts them), and it starts a driver only to resume or replay one::

    manage.py    list, compare, export and resume the runs on disk (`list_runs`, `run_rows`, `compare_runs`,
                 `export_run`, `resume_run`, `find_runs`)
    replay.py    `replay(run)`: the run again on this machine, following its log

A run's status and steering it from another process are `framework.steering` (below `ModelSelection`, since the
dashboard a run serves reads them); their names are here too (`run_status`, `wait_for_run`, ...).
"""

from framework.runs.manage import compare_runs, export_run, find_runs, list_runs, resume_run, run_rows
from framework.steering.status import (
    RECENT_S,
    STATUSES,
    DriverInfo,
    classify,
    open_result,
    run_started,
    run_status,
    wait_for_run,
)

__all__ = [
    "RECENT_S",
    "STATUSES",
    "DriverInfo",
    "classify",
    "compare_runs",
    "export_run",
    "find_runs",
    "list_runs",
    "open_result",
    "resume_run",
    "run_rows",
    "run_started",
    "run_status",
    "wait_for_run",
]
