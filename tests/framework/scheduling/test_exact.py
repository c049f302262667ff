from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from framework.scheduling import CPSATSolver, DenseApproxSolver, MILPSolver, ShopProblem, Unit
from simulators import heterogeneous, homogeneous, shop_problem, validate_schedule

# Taillard 1993 ta4x4_1os (T[config][worker]); proven optimum 193, simple bound 186
TA4X4_1 = [[34, 2, 54, 61], [15, 89, 70, 9], [38, 19, 28, 87], [95, 7, 34, 29]]


def _taillard(name: str):
    path = Path(__file__).resolve().parents[4] / "shared" / "data" / "openshop" / f"{name}.txt"
    if not path.exists():
        path = Path("/work/shared/data/openshop") / f"{name}.txt"
    if not path.exists():
        pytest.skip(f"{name} not available")
    vals = path.read_text().split()
    n, m = int(vals[0]), int(vals[1])
    return np.array(vals[2 : 2 + n * m], dtype=int).reshape(n, m)


def test_cpsat_taillard_4x4_optimum():
    s = CPSATSolver(time_limit_s=10).solve(ShopProblem.from_matrix(TA4X4_1))
    assert (s.makespan, s.status, s.bound) == (193, "optimal", 193)


def test_cpsat_taillard_5x5_optimum():
    s = CPSATSolver(time_limit_s=10).solve(ShopProblem.from_matrix(_taillard("ta5x5_1os")))
    assert s.optimal and s.makespan == 300


@pytest.mark.parametrize("shape,seed", [((4, 3), 0), ((4, 3), 1), ((5, 4), 2), ((5, 4), 3)])
def test_exact_solvers_agree_and_prove_optimality(shape, seed):
    t = np.random.default_rng(seed).integers(1, 30, size=shape)
    p = ShopProblem.from_matrix(t)
    a = CPSATSolver(time_limit_s=10).solve(p)
    b = MILPSolver(time_limit_s=20).solve(p)
    assert a.optimal and b.optimal
    assert a.makespan == pytest.approx(b.makespan)
    assert validate_schedule(a, {q: [q] for q in range(shape[1])}).ok
    assert validate_schedule(b, {q: [q] for q in range(shape[1])}).ok


@pytest.mark.parametrize("n,p", [(4, 4), (6, 3), (16, 8)])
def test_exact_equals_lower_bound_on_homogeneous(n, p):
    # identical unit times: a cyclic Latin-square schedule attains max(n, p) units, the bound
    prob = shop_problem(homogeneous(n, p))
    s = CPSATSolver(time_limit_s=10).solve(prob)
    assert s.optimal and s.makespan == pytest.approx(prob.lower_bound()) == max(n, p)


def test_milp_proves_bound_above_lb_when_lb_not_tight():
    s = MILPSolver(time_limit_s=20).solve(ShopProblem.from_matrix(TA4X4_1))
    assert s.optimal and s.makespan == 193 and s.bound == pytest.approx(193)


def test_milp_skips_too_large_models_honestly():
    s = MILPSolver(time_limit_s=1, max_pairs=10).solve(ShopProblem.from_matrix(TA4X4_1))
    assert s.status == "heuristic" and "skipped" in s.info


def test_cpsat_eval_units_wait_for_training():
    units = [Unit(0, 0, 0), Unit(0, 0, 1), Unit(0, 0, 2, "eval"), Unit(1, 0, 0), Unit(1, 0, 1)]
    dur = {(u, w): 2.0 for u in units for w in ([u.partition] if u.partition < 2 else [0, 1])}
    s = CPSATSolver(time_limit_s=5).solve(ShopProblem(tuple(units), dur))
    ev = next(e for e in s.entries if e.unit.kind == "eval")
    assert ev.start >= max(e.end for e in s.entries if e.unit.config_id == 0 and e.unit.kind == "train")


def test_cpsat_rejects_nonpositive_time_limit():
    with pytest.raises(ValueError, match="time_limit_s"):
        CPSATSolver(time_limit_s=0)


def test_cpsat_rejects_fewer_than_one_worker():
    with pytest.raises(ValueError, match="`workers` is 0, but must be >= 1"):
        CPSATSolver(workers=0)


def test_milp_rejects_a_backend_without_a_deterministic_limit():
    with pytest.raises(ValueError, match="`backend` is 'CBC', but must be one of \\('SCIP', 'CP-SAT'\\)"):
        MILPSolver(backend="CBC")


def test_cpsat_with_two_workers_interleaves_them_deterministically():
    p = shop_problem(heterogeneous(30, 8, seed=1))
    a, b = (CPSATSolver(time_limit_s=0.1, workers=2, seed=5).solve(p) for _ in range(2))
    # (stopped by its budget; an older OR-Tools may prove the optimum within it)
    assert a.status in ("feasible", "optimal") and a.entries == b.entries and a.info["work"] == b.info["work"]


def test_milp_budget_is_a_node_limit_for_scip_and_deterministic_time_for_cp_sat():
    p = ShopProblem.from_matrix(np.random.default_rng(1).integers(1, 100, size=(5, 5)))
    # 100 ordering pairs + 20 start times + C: 0.02 reference seconds x 20,000 / 121 variables = 4 nodes
    assert MILPSolver(time_limit_s=0.02).solve(p).info["limit"] == "limits/totalnodes = 4"
    cp = MILPSolver(time_limit_s=0.02, backend="CP-SAT", seed=3).solve(p).info["limit"]
    assert cp == "max_deterministic_time: 0.001 num_workers: 1 random_seed: 3"


def test_dense_approx_meets_its_guarantee_on_random_instances():
    rng = np.random.default_rng(42)
    for _ in range(30):
        n, m = rng.integers(2, 9), rng.integers(2, 7)
        t = rng.integers(1, 50, size=(n, m))
        p = ShopProblem.from_matrix(t)
        s = DenseApproxSolver().solve(p)
        lb = p.lower_bound()
        assert s.makespan <= lb + (min(n, m) - 1) * t.max() + 1e-9
        assert s.makespan <= s.info["guarantee"] + 1e-9
        assert s.makespan < 2 * lb + 1e-9


def test_dense_approx_claims_no_guarantee_with_replicas():
    u = Unit(0, 0, 0)
    s = DenseApproxSolver().solve(ShopProblem((u,), {(u, 0): 2.0, (u, 1): 1.0}))  # one partition, two holders
    assert "guarantee" not in s.info
