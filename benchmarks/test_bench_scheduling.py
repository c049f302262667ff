"""Decision time of the online policies (pytest-benchmark): one full simulated round, no solver."""

from __future__ import annotations

import pytest

from simulators import heterogeneous, simulate


@pytest.mark.parametrize("name", ["randomized", "mwr", "lpt", "lookahead"])
def test_bench_round_256x16(benchmark, name):
    w = heterogeneous(256, 16, seed=0)
    r = benchmark.pedantic(lambda: simulate(w, name), rounds=2, iterations=1)
    benchmark.extra_info["decision_ms_per_unit"] = r.decision_ms_per_unit
    assert len(r.schedule) == 256 * 16
