"""PB2 (Ray Tune's `PB2`): PBT's exploit with a time-varying GP-UCB explore. The GP arithmetic on numbers alone,
then the procedure on the driver loop: its suggestions stay inside the bounds, move toward the values whose
results improved, repeat under a seed and survive a pickle mid-run (the engine's resume)."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

import automl
import simulators
from automl.pb2 import fit_tv_gp, from_unit, select_pb2_point, to_unit, tv_kernel
from automl.space import SearchSpace


def _fastest_near_008(config: dict, epoch: int) -> dict[str, float]:
    """The loss falls by `rate` per epoch, fastest (1.0) for lr = 0.08."""
    rate = 1.0 - 8 * abs(config["lr"] - 0.08)
    return {"train_loss": 0.0, "valid_loss": 10.0 - epoch * rate}


def _objective(config: dict, epoch: int) -> dict[str, float]:
    loss = abs(math.log10(config["lr"]) + 2.0) + 0.01 * config.get("width", 16) / 16 + 1.0
    return {"train_loss": loss / (epoch + 1), "valid_loss": loss / (epoch + 1)}


# ---- the GP -------------------------------------------------------------------------------------------------------
def test_tv_kernel_multiplies_a_squared_exponential_by_a_forgetting_factor():
    xa, xb = np.array([[0.0, 0.0]]), np.array([[0.3, 0.4], [0.0, 0.0]])
    k = tv_kernel(xa, np.array([0.0]), xb, np.array([2.0, 4.0]), lengthscale=0.5, epsilon=0.19)
    assert k.shape == (1, 2)
    assert k[0, 0] == pytest.approx(math.exp(-0.25 / 0.5) * 0.81 ** 1.0)  # |x|^2 = 0.25, |t| / 2 = 1
    assert k[0, 1] == pytest.approx(0.81**2)  # same point, four steps apart


def test_the_ucb_choice_lands_at_the_best_observed_region():
    x = np.linspace(0, 1, 21)[:, None]
    gp = fit_tv_gp(x, np.zeros(21), -((x[:, 0] - 0.7) ** 2))
    u = select_pb2_point(gp, 0.0, np.zeros((0, 1)), np.random.default_rng(0))
    assert u.shape == (1,) and abs(u[0] - 0.7) < 0.05


def test_the_time_varying_gp_follows_the_newest_observations():
    x = np.linspace(0, 1, 21)[:, None]
    xs, ts = np.concatenate([x, x]), np.concatenate([np.zeros(21), np.full(21, 5.0)])
    ys = np.concatenate([-((x[:, 0] - 0.2) ** 2), -((x[:, 0] - 0.8) ** 2)])  # the best value moved from 0.2 to 0.8
    gp = fit_tv_gp(xs, ts, ys)
    assert gp.epsilon > 0
    assert abs(select_pb2_point(gp, 5.0, np.zeros((0, 1)), np.random.default_rng(0))[0] - 0.8) < 0.05
    assert abs(select_pb2_point(gp, 0.0, np.zeros((0, 1)), np.random.default_rng(0))[0] - 0.2) < 0.05


def test_a_pending_point_lowers_the_uncertainty_there_and_not_far_away():
    x = np.array([[0.0], [1.0]])
    gp = fit_tv_gp(x, np.zeros(2), np.array([0.0, 1.0]))
    pending = gp.with_inputs(np.array([[0.0], [1.0], [0.5]]), np.zeros(3))
    at = np.array([[0.5], [0.0]])
    before, after = gp.predict(at, 0.0)[1], pending.predict(at, 0.0)[1]
    assert after[0] < 0.5 * before[0] and after[1] == pytest.approx(before[1], rel=0.05)


def test_fit_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"`x`, `t` and `y` have shapes"):
        fit_tv_gp(np.zeros((3, 1)), np.zeros(2), np.zeros(3))


@pytest.mark.parametrize("domain, value, unit", [
    (automl.uniform(0.0, 2.0), 0.5, 0.25),
    (automl.loguniform(1e-4, 1.0), 1e-2, 0.5),
    (automl.randint(0, 10), 5, 0.5),
    (automl.uniform(0.0, 2.0), 9.0, 1.0),  # outside: clipped
])
def test_to_unit_and_back(domain, value, unit):
    assert to_unit(domain, value) == pytest.approx(unit)
    assert from_unit(domain, unit) == pytest.approx(domain.clip(value))


def test_from_unit_keeps_ints_and_multiples():
    assert from_unit(automl.qrandint(16, 256, 16), 0.52) == 144 and isinstance(from_unit(automl.randint(0, 9), 0.5), int)
    assert from_unit(automl.qloguniform(0.01, 1.0, 0.01), 0.5) == pytest.approx(0.1)


# ---- the procedure ------------------------------------------------------------------------------------------------
def test_clones_stay_inside_their_bounds_and_keep_the_donors_other_values():
    space = {"lr": automl.loguniform(1e-3, 1.0), "act": ["relu", "tanh"], "noise": automl.randn(0, 1),
             "double": automl.sample_from(lambda_free_double), "width": 64, "mom": 0.9}
    bounds = {"lr": automl.loguniform(1e-3, 0.1), "width": automl.qrandint(16, 128, 16), "mom": [0.5, 0.99]}
    pb2 = automl.PB2(space, population=6, epochs=8, perturbation_interval=2, seed=0, hyperparam_bounds=bounds)
    run = simulators.run_procedure_offline(pb2, _objective, num_workers=3)
    assert run.finished
    first = run.decisions[0].add
    assert all(16 <= c["width"] <= 128 and c["width"] % 16 == 0 and 0.5 <= c["mom"] <= 0.99 for c in first)
    clones = [(donor, config) for d in run.decisions for donor, config in d.clone]
    assert len(clones) >= 4
    for donor, config in clones:
        before = run.states[donor].config
        assert 1e-3 <= config["lr"] <= 0.1 and config["width"] % 16 == 0 and 0.5 <= config["mom"] <= 0.99
        assert config["act"] == before["act"] and config["noise"] == before["noise"]  # not explored: copied
        assert config["double"] == 2 * config["lr"]  # sample_from computed from the new config
        assert list(config) == list(before)


def lambda_free_double(config: dict) -> float:
    return 2 * config["lr"]


def test_without_bounds_every_numeric_hyper_parameter_of_the_space_is_explored_inside_it():
    space = {"opt": {"lr": automl.uniform(0.01, 0.1)}, "width": automl.qrandint(16, 64, 16), "act": ["a", "b"]}
    pb2 = automl.PB2(space, population=4, epochs=6, perturbation_interval=1, seed=1)
    assert list(pb2.bounds) == ["opt/lr", "width"]
    run = simulators.run_procedure_offline(pb2, _objective_nested)
    clones = [config for d in run.decisions for _, config in d.clone]
    assert clones and all(SearchSpace(space).contains(c) for c in clones)
    assert len({c["opt"]["lr"] for c in clones}) > 1


def _objective_nested(config: dict, epoch: int) -> dict[str, float]:
    loss = abs(config["opt"]["lr"] - 0.05) + 1.0
    return {"train_loss": loss / (epoch + 1), "valid_loss": loss / (epoch + 1)}


def test_observations_start_after_the_first_interval_and_count_each_member():
    pb2 = automl.PB2({"lr": automl.uniform(0.0, 0.1)}, population=4, epochs=6, perturbation_interval=2, seed=0)
    engine = simulators.OfflineEngine(pb2, _fastest_near_008)
    engine.run_rounds(2)  # the first perturbation: nothing to measure yet, the clone's lr is a uniform draw
    assert pb2.data == [] and any(d.clone for d in engine.run.decisions)
    engine.run_rounds(2)  # the second: one observation per member, the change of its score over two epochs
    assert len(pb2.data) == 4 and all(row[0] == 2.0 and len(row) == 3 for row in pb2.data)
    by_lr = {round(s.config["lr"], 12): s for s in engine.states}
    originals = [(u, change) for _, u, change in pb2.data if by_lr[round(u * 0.1, 12)].parent is None]
    assert originals  # (the synthetic objective knows nothing of a clone's inherited weights: check the others)
    for u, change in originals:
        assert change == pytest.approx(2 * (1.0 - 8 * abs(u * 0.1 - 0.08)))  # two epochs at `rate`


def test_suggestions_move_toward_the_values_whose_results_improved():
    first, late = [], []
    for seed in range(5):
        pb2 = automl.PB2({"lr": automl.uniform(0.0, 0.1)}, population=8, epochs=10, perturbation_interval=1, seed=seed)
        run = simulators.run_procedure_offline(pb2, _fastest_near_008)
        first += [abs(c["lr"] - 0.08) for c in run.decisions[0].add]
        late += [abs(c["lr"] - 0.08) for d in run.decisions[4:] for _, c in d.clone]
    assert len(late) >= 20
    assert np.mean(late) < 0.75 * np.mean(first)


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    def trace(seed):
        pb2 = automl.PB2({"lr": automl.uniform(0.0, 0.1)}, population=4, epochs=6, perturbation_interval=1, seed=seed)
        return simulators.run_procedure_offline(pb2, _fastest_near_008).trace()

    assert trace(3) == trace(3) and trace(3) != trace(4)


def test_a_pickled_pb2_resumes_where_it_stopped_with_json_able_observations():
    def make():
        return automl.PB2({"lr": automl.uniform(0.0, 0.1)}, population=4, epochs=8, perturbation_interval=1, seed=2)

    whole = simulators.run_procedure_offline(make(), _fastest_near_008)
    engine = simulators.OfflineEngine(make(), _fastest_near_008)
    engine.run_rounds(4)
    assert engine.procedure.data and not engine.done
    assert json.loads(json.dumps(engine.procedure.data)) == engine.procedure.data
    engine.objective = None
    copy = pickle.loads(pickle.dumps(engine))
    copy.objective = _fastest_near_008
    assert copy.run_rounds(100).trace() == whole.trace()


def test_load_procedure_finds_pb2_by_its_short_name():
    pb2 = automl.load_procedure("pb2", space={"lr": automl.uniform(0.0, 0.1)}, population=2, epochs=2,
                                perturbation_interval=1)
    assert isinstance(pb2, automl.PB2) and isinstance(pb2, automl.PBT)


@pytest.mark.parametrize("bounds, message", [
    ({}, r"`hyperparam_bounds` is \{\}, but must be None or a non-empty dict"),
    ({"lr": [0.1, 0.01]}, r"`hyperparam_bounds\['lr'\]` is \[0.1, 0.01\], but `lo` must be < `hi`"),
    ({"lr": ["a", "b"]}, r"`hyperparam_bounds\['lr'\]` is \['a', 'b'\], but must be a \[lo, hi\] pair"),
    ({"act": [0.0, 1.0]}, r"`hyperparam_bounds\['act'\]` is .*, but `space\['act'\]` is Categorical"),
    ({"x/y": [0.0, 1.0]}, r"`hyperparam_bounds\['x/y'\]` names 'x/y', but `space` has no such hyper-parameter: it "
                          r"has \['lr', 'act'\]; add it to the space"),
    ({"momentum": [0.8, 0.99]}, r"`hyperparam_bounds\['momentum'\]` names 'momentum', but `space` has no such"),
    ({"x": {"y": [0.0, 1.0]}}, r"`hyperparam_bounds\['x/y'\]` names 'x/y', but `space` has no such"),
])
def test_bad_bounds_name_the_parameter(bounds, message):
    with pytest.raises(ValueError, match=message):
        automl.PB2({"lr": automl.uniform(0.0, 0.1), "act": ["a", "b"]}, population=2, epochs=2,
                   perturbation_interval=1, hyperparam_bounds=bounds)


def test_a_space_without_numbers_needs_bounds():
    with pytest.raises(ValueError, match=r"`hyperparam_bounds` is None, but `space` .* has no numeric hyper-parameter"):
        automl.PB2({"act": ["a", "b"]}, population=2, epochs=2, perturbation_interval=1)
