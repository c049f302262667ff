"""Managing runs: the runs on disk and the ones running, as a user looks after them (what the `modelhopper` commands,
`framework.connect` and the dashboard call). The layer above `ModelSelection`: it reads run directories (what
`framework.run_record` records, where `framework.store.storage` puts them), and it starts a driver only to resume or
replay one::

    manage.py    list, compare, export and resume the runs on disk (`list_runs`, `run_rows`, `compare_runs`,
                 `export_run`, `resume_run`, `find_runs`)
    status.py    a run's status: finished, running, crashed, running?, unknown or unreadable (`run_status`); wait
                 for a run just launched to start (`wait_for_run`)
    steering.py  `connect(run)`: watch and steer a running run from another process
    replay.py    `replay(run)`: the run again on this machine, following its log

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
