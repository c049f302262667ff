"""Offline scheduler simulators: workloads, a discrete-event simulator running the live policies, exact and
approximate solvers' comparison (Cerebro Figure 6), validator, Gantt charts, communication-cost model (Table 2).

No Ray needed. CLI: `python -m simulators compare|gantt|comm-cost --help`.
"""

from __future__ import annotations

from simulators.bounds import lower_bound, shop_problem
from simulators.comm_cost import CommCostParams, comm_costs, format_bytes
from simulators.offline import OfflineEngine, OfflineRun, run_procedure_offline
from simulators.simulator import (
    FAIL,
    JOIN,
    RETURN,
    Noise,
    SimulationResult,
    Simulator,
    WorkerEvent,
    simulate,
    simulate_selection,
)
from simulators.validate import ValidationReport, as_frame, validate_schedule
from simulators.workload import (
    CNN_MFLOPS,
    GPU_TFLOPS,
    Workload,
    from_schedule_log,
    heterogeneous,
    homogeneous,
    replicate,
)

__all__ = [
    "CNN_MFLOPS",
    "FAIL",
    "GPU_TFLOPS",
    "JOIN",
    "RETURN",
    "CommCostParams",
    "Noise",
    "OfflineEngine",
    "OfflineRun",
    "SimulationResult",
    "Simulator",
    "ValidationReport",
    "WorkerEvent",
    "Workload",
    "as_frame",
    "comm_costs",
    "format_bytes",
    "from_schedule_log",
    "heterogeneous",
    "homogeneous",
    "lower_bound",
    "replicate",
    "run_procedure_offline",
    "shop_problem",
    "simulate",
    "simulate_selection",
    "validate_schedule",
]
