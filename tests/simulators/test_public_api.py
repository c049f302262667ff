"""The simulators' public API at the magnitudes and seeds users give it: textbook open-shop instances, every
scheduler name, seeds 0-9, unit times from milliseconds to a day.

Two regressions passed every other test: the exact scheduler raised for common seeds (a 63-bit per-wave seed handed
to CP-SAT's int32 parameter), and units longer than the driver's 300 s health check made every worker "hung".
"""

from __future__ import annotations

import numpy as np
import pytest

from simulators import Workload, simulate, validate_schedule

# Taillard 1993 ta4x4_1os (T[config][worker]); proven optimum 193
TA4X4_1 = np.array([[34, 2, 54, 61], [15, 89, 70, 9], [38, 19, 28, 87], [95, 7, 34, 29]], dtype=float)


def _shop(times: np.ndarray) -> Workload:
    return Workload(times, {q: (q,) for q in range(times.shape[1])})


@pytest.mark.parametrize("seed", range(10))
def test_the_exact_scheduler_runs_for_every_seed(seed):
    r = simulate(_shop(TA4X4_1), "cpsat", seed=seed)
    assert validate_schedule(r.schedule, _shop(TA4X4_1).availability, raise_on_error=True).ok
    assert r.makespan == 193  # CP-SAT proves the optimum of this instance
