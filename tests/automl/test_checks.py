"""What a config holds (`automl.json_exact`) and the construction-time checks of every numeric argument of the space
primitives and the procedures (`automl._checks`): each value a config can hold is accepted exactly (the type and
value `model_fn` sees, the same after a JSON round trip, which is what resume and replay read), each other one is
refused at the draw in one line naming the parameter and the value's type."""

from __future__ import annotations

import datetime
import enum
import json
import math
from typing import Any

import numpy as np
import pytest
import torch

import automl
import simulators
from automl import Decision, SearchSpace, json_exact
from automl._checks import MAX_DEPTH
from tests.automl.conftest import objective


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same type at every level (1 == 1.0 == True are three different configs to model_fn)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _round_trips(config: dict) -> bool:
    """What the run records (`json.dumps`, no `default=`) reads back identical, type and value."""
    return _same(json.loads(json.dumps(config, allow_nan=False)), config)


class Returns:
    """A `sample_from` function (it pickles) that returns `value` whatever the config."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, config: dict) -> Any:
        return self.value


class Level(enum.IntEnum):
    HIGH = 3


# value -> what a config holds (type included)
ACCEPTED = [
    (np.float32(0.05), 0.05000000074505806),  # the float it equals, not 0.05 and not '0.05'
    (np.float64(0.1), 0.1),
    (np.float16(0.5), 0.5),
    (np.int64(7), 7),
    (np.uint8(3), 3),
    (np.bool_(True), True),
    (torch.tensor(0.25), 0.25),  # a 0-d tensor: its .item()
    (torch.tensor(0.05), 0.05000000074505806),
    (torch.tensor(3), 3),
    (torch.tensor(False), False),
    (np.array(1.5), 1.5),
    ((16, 16), [16, 16]),  # JSON has no tuple: a list in the run as on its replay
    ({"a": np.float32(0.5), "b": [np.int64(1), None, "x"]}, {"a": 0.5, "b": [1, None, "x"]}),
    (Level.HIGH, 3),
    (2**63 - 1, 2**63 - 1),
    (-(2**63), -(2**63)),
    (1e308, 1e308),
    (None, None),
    ("ünï", "ünï"),
]
# value -> (error, words of its one line)
REFUSED = [
    ({1, 2}, TypeError, ["is {1, 2}, a set, but a config holds JSON values only"]),
    (frozenset({1}), TypeError, ["a frozenset"]),
    (torch.ones(3), TypeError, ["is a torch.Tensor of shape (3,)", ".tolist()"]),
    (torch.ones(1), TypeError, ["is a torch.Tensor of shape (1,)"]),
    (np.ones((2, 2)), TypeError, ["is a numpy.ndarray of shape (2, 2)"]),
    (b"ab", TypeError, ["is b'ab', a bytes"]),
    (float("nan"), ValueError, ["is nan, but a float in a config must be finite"]),
    (float("-inf"), ValueError, ["is -inf, but a float in a config must be finite"]),
    (np.float32("inf"), ValueError, ["must be finite"]),
    (torch.tensor(float("nan")), ValueError, ["must be finite"]),
    (10**400, ValueError, ["is 1.00000e+400 (an int), but an int in a config must be in [-2**63, 2**63 - 1]"]),
    (2**63, ValueError, ["is 9223372036854775808, but an int in a config must be in"]),
    (np.uint64(2**64 - 1), ValueError, ["an int in a config must be in"]),
    (datetime.datetime(2024, 1, 1), TypeError, ["a datetime.datetime, but a config holds JSON values only"]),
    (object(), TypeError, ["<object object at 0x", ">, an object, but a config holds"]),
    (1 + 2j, TypeError, ["a complex"]),
    (torch.tensor(1 + 2j), TypeError, ["a torch.Tensor of shape ()"]),
    ({1: "a"}, TypeError, ["has the key 1, an int, but the keys of a dict in a config must be str"]),
    ("bad\udcff", ValueError, ["must be UTF-8 text: it holds a lone surrogate"]),
    (print, TypeError, ["a builtin_function_or_method"]),
]
if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant:  # (x86: 80-bit; elsewhere it may be a float64)
    REFUSED.append((np.longdouble(1) / 3, ValueError, [f"a numpy.{type(np.longdouble(1)).__name__}, but a float in a "
                                                       "config must be one a float64 holds exactly"]))


ACCEPTED_IDS = [f"{i}-{type(v).__name__}" for i, (v, _) in enumerate(ACCEPTED)]
REFUSED_IDS = [f"{i}-{type(v).__name__}" for i, (v, _, _) in enumerate(REFUSED)]


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("value, held", ACCEPTED, ids=ACCEPTED_IDS)
def test_json_exact_keeps_or_converts_what_a_config_can_hold(value, held):
    got = json_exact("x", value)
    assert _same(got, held)
    assert _same(json.loads(json.dumps(got, allow_nan=False)), held)  # what resume and replay read back


@pytest.mark.parametrize("value, error, words", REFUSED, ids=REFUSED_IDS)
def test_json_exact_refuses_the_rest_in_one_line_naming_the_parameter_and_the_type(value, error, words):
    with pytest.raises(error) as e:
        json_exact("space['x']", value)
    line = str(e.value)
    assert "\n" not in line and line.startswith("`space['x']") and all(w in line for w in words), line


def test_json_exact_names_where_in_a_nested_value_and_refuses_nesting_deeper_than_its_limit():
    with pytest.raises(TypeError, match=r"^`config\['opt'\]\['betas'\]\[1\]` is \{0.9\}, a set"):
        json_exact("config", {"opt": {"betas": [0.9, {0.9}]}})
    assert json_exact("x", _nested(MAX_DEPTH)) == _nested(MAX_DEPTH)
    with pytest.raises(ValueError, match=rf"^`x(\[0\]){{{MAX_DEPTH}}}` is nested more than {MAX_DEPTH} lists or dicts"):
        json_exact("x", _nested(MAX_DEPTH + 1))
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match=r"is nested more than"):
        json_exact("x", cycle)


# ---- every space primitive, and sample_from -------------------------------------------------------------------------
EVERY_PRIMITIVE = {
    "uniform": automl.uniform(np.float32(0.5), 1),
    "loguniform": automl.loguniform(1e-4, np.float64(1e-1)),
    "quniform": automl.quniform(0.0, 0.5, 0.1),
    "qloguniform": automl.qloguniform(1e-4, 1e-2, 1e-4),
    "randint": automl.randint(np.int64(1), 4),
    "qrandint": automl.qrandint(16, 64, np.int32(16)),
    "randn": automl.randn(np.float32(0.0), 1.0),
    "qrandn": automl.qrandn(10.0, 2.0, 0.5),
    "choice": [np.float32(0.1), np.int64(2), np.bool_(False), (1, 2), "relu", None],
    "nested": {"lr": automl.loguniform(1e-3, 1e-1), "betas": (np.float32(0.9), 0.99), "eps": np.float64(1e-8)},
    "constant": np.int64(64),
    "derived": automl.sample_from(Returns(np.float32(0.05))),
}


def test_every_space_primitive_draws_configs_that_read_back_exactly():
    space = SearchSpace(EVERY_PRIMITIVE)
    configs = [space.sample(np.random.default_rng(seed)) for seed in range(40)]
    assert configs and all(_round_trips(c) and space.contains(c) for c in configs)
    assert {type(c[name]) for c in configs for name in ("uniform", "loguniform", "quniform", "qloguniform", "randn",
                                                         "qrandn", "derived")} == {float}
    assert {type(c[name]) for c in configs for name in ("randint", "qrandint", "constant")} == {int}
    assert {json.dumps(c["choice"]) for c in configs} == {"0.10000000149011612", "2", "false", "[1, 2]", '"relu"',
                                                           "null"}
    assert all(_same(c["nested"]["betas"], [float(np.float32(0.9)), 0.99]) and c["derived"] == 0.05000000074505806
               for c in configs)


@pytest.mark.parametrize("value, held", ACCEPTED, ids=ACCEPTED_IDS)
def test_a_sample_from_value_is_held_as_json_exact_holds_it_in_every_procedure_that_computes_it(value, held):
    space = {"lr": [0.1], "x": automl.sample_from(Returns(value))}
    drawn = SearchSpace(space).sample(np.random.default_rng(0))
    [grid] = automl.GridSearch(space, epochs=1).configs()
    [random] = automl.RandomSearch(space, num_samples=1, epochs=1).configs()
    assert _same(drawn["x"], held) and _same(grid["x"], held) and _same(random["x"], held)


@pytest.mark.parametrize("value, error, words", REFUSED, ids=REFUSED_IDS)
def test_a_sample_from_value_a_config_cannot_hold_is_refused_at_the_draw_in_one_line(value, error, words):
    space = {"lr": [0.1], "x": automl.sample_from(Returns(value))}
    for draw in (lambda: SearchSpace(space).sample(np.random.default_rng(0)),
                 lambda: automl.GridSearch(space, epochs=1).step([]),
                 lambda: automl.RandomSearch(space, num_samples=1, epochs=1).step([])):
        with pytest.raises(error) as e:
            draw()
        line = str(e.value)
        assert "\n" not in line and line.startswith("`space['x']") and line.endswith("(what sample_from(Returns) "
                                                                                      "returned)"), line
        assert all(w in line for w in words), line


@pytest.mark.parametrize("value, error, words", REFUSED, ids=REFUSED_IDS)
def test_a_choice_or_constant_a_config_cannot_hold_is_refused_when_the_space_is_built(value, error, words):
    with pytest.raises(error, match=r"^`space\['x'\]\[1\]` (is|has the key)"):
        SearchSpace({"x": [1, value]})
    with pytest.raises(error, match=r"^`space\['opt'\]\['x'\]` (is|has the key)"):
        SearchSpace({"opt": {"lr": automl.uniform(0, 1), "x": value}})
    with pytest.raises(error, match=r"^`space\['x'\]\[0\]` (is|has the key)"):
        automl.GridSearch({"x": [value]}, epochs=1)


def derived_float32(config: dict) -> np.float32:
    return np.float32(config["lr"] / 100)


def derived_set(config: dict) -> set:
    return {config["lr"]}


NUMPY_SPACE = {
    "lr": automl.loguniform(1e-4, 1e-1), "momentum": automl.uniform(0.5, 0.99), "layers": automl.randint(1, 4),
    "act": ["relu", "tanh", "gelu"], "batch_size": np.int64(32), "wd": automl.sample_from(derived_float32),
}
NUMPY_GRID = {"lr": [np.float32(1e-3), 1e-2], "act": ["relu", "tanh"], "batch_size": [np.int64(32)],
              "wd": automl.sample_from(derived_float32)}


def _procedure(name: str, wd: Any) -> automl.Procedure:
    space = {**NUMPY_SPACE, "wd": automl.sample_from(wd)}
    return {
        "grid": lambda: automl.GridSearch({**NUMPY_GRID, "wd": automl.sample_from(wd)}, epochs=2),
        "random": lambda: automl.RandomSearch(space, num_samples=4, epochs=2, seed=0),
        "optuna": lambda: automl.OptunaSearch(space, num_samples=4, epochs=2, concurrency=2, seed=0),
        "tpe": lambda: automl.TPE(space, num_samples=4, epochs=2, concurrency=2, seed=0),
        "hyperband": lambda: automl.HyperBand(space, max_epochs=3, eta=3, seed=0),
        "asha": lambda: automl.ASHA(space, max_epochs=3, eta=3, max_configs=4, seed=0),
        "bohb": lambda: automl.BOHB(space, max_epochs=3, eta=3, concurrency=2, seed=0),
        "pbt": lambda: automl.PBT(space, population=4, epochs=4, perturbation_interval=1, seed=0),
        "pb2": lambda: automl.PB2(space, population=4, epochs=4, perturbation_interval=1, seed=0),
    }[name]()


PROCEDURE_NAMES = ["grid", "random", "optuna", "tpe", "hyperband", "asha", "bohb", "pbt", "pb2"]


@pytest.mark.parametrize("name", PROCEDURE_NAMES)
def test_every_procedure_hands_the_engine_configs_that_read_back_exactly(name):
    run = simulators.run_procedure_offline(_procedure(name, derived_float32), objective)
    assert run.finished and run.states
    for s in run.states:  # clones (PBT, PB2) and Optuna's suggestions included
        assert _round_trips(s.config), s.config
        assert s.config["batch_size"] == 32 and type(s.config["batch_size"]) is int
        assert type(s.config["wd"]) is float and s.config["wd"] == float(np.float32(s.config["lr"] / 100))


@pytest.mark.parametrize("name", PROCEDURE_NAMES)
def test_every_procedure_refuses_a_value_a_config_cannot_hold_at_its_first_draw(name):
    procedure = _procedure(name, derived_set)
    procedure.bind("valid_loss", "min")
    with pytest.raises(TypeError, match=r"^`space\['wd'\]` is \{.*\}, a set, but a config holds JSON values only.* "
                                        r"\(what sample_from\(derived_set\) returned\)$"):
        procedure.step([])


def test_a_decision_converts_numpy_values_and_refuses_what_a_config_cannot_hold():
    """The backstop of every procedure, a person's own included: `Decision` holds configs as the run records them."""
    decision = Decision(add=[{"lr": np.float32(0.5), "shape": (2, 2)}], clone=[(0, {"n": np.int64(3)})])
    assert _same(decision.add, [{"lr": 0.5, "shape": [2, 2]}]) and _same(decision.clone, [(0, {"n": 3})])
    with pytest.raises(TypeError, match=r"^`add\[1\]\['when'\]` is datetime.date\(2024, 1, 1\), a datetime.date"):
        Decision(add=[{"lr": 0.1}, {"when": datetime.date(2024, 1, 1)}])
    with pytest.raises(ValueError, match=r"^`clone\[0\] config\['lr'\]` is nan, but a float in a config must be"):
        Decision(clone=[(0, {"lr": math.nan})])


def define_by_run_with_a_set(trial) -> dict:
    trial.suggest_float("lr", 0.1, 1.0)
    return {"lr": {1}}


def test_a_define_by_run_space_returning_a_value_a_config_cannot_hold_is_refused_and_its_trial_fails():
    from optuna.trial import TrialState

    search = automl.OptunaSearch(define_by_run_with_a_set, num_samples=2, epochs=1)
    with pytest.raises(TypeError, match=r"^`config\['lr'\]` is \{1\}, a set, .*\(in the config the define-by-run"):
        search.step([])
    assert [t.state for t in search.study.trials] == [TrialState.FAIL]


def test_points_to_evaluate_are_held_as_a_config_holds_them():
    search = automl.OptunaSearch({"lr": automl.uniform(0, 1), "shape": [(1, 2), (3, 4)]}, num_samples=2, epochs=1,
                                 points_to_evaluate=[{"lr": np.float32(0.5), "shape": (3, 4)}])
    assert _same(search.points_to_evaluate, [{"lr": 0.5, "shape": [3, 4]}])
    with pytest.raises(TypeError, match=r"^`points_to_evaluate\[0\]\['lr'\]` is \{0.5\}, a set"):
        automl.OptunaSearch({"lr": automl.uniform(0, 1)}, num_samples=2, epochs=1, points_to_evaluate=[{"lr": {0.5}}])


# ---- construction-time checks of every numeric argument ------------------------------------------------------------
SPACE = {"lr": automl.uniform(0, 1)}


@pytest.mark.parametrize("build, error, match", [
    (lambda: automl.uniform(0, 10**400), ValueError,
     r"^`hi` is 1.00000e\+400 \(an int\), but must be a finite real number \(a float64"),
    (lambda: automl.uniform(np.float64("nan"), 1), ValueError,
     r"^`lo` is (np.float64\()?nan\)?, but must be a finite"),  # (numpy 2 shows its scalars' type; 1.x does not)
    (lambda: automl.uniform(-1e308, 1e308), ValueError, r"^`hi` is 1e\+308 and `lo` -1e\+308, but `hi` - `lo` must "
                                                        r"be a finite float"),
    (lambda: automl.loguniform(1e-10, 10**400), ValueError, r"^`hi` is 1.00000e\+400 \(an int\), but must be a"),
    (lambda: automl.randint(0, 2**70), ValueError,
     r"^`hi` is 1.18059e\+21 \(an int\), but must be an int in \[-2\*\*63, 2\*\*63 - 1\]"),
    (lambda: automl.randint(-(2**64), 0), ValueError, r"^`lo` is -1.84467e\+19 \(an int\), but must be an int in"),
    (lambda: automl.qrandint(0, 10, 2**70), ValueError, r"^`q` is 1.18059e\+21 \(an int\), but must be an int in"),
    (lambda: automl.quniform(0, 1, 1e-300), ValueError,
     r"^`q` is 1e-300, but \[`lo`, `hi`\] = \[0, 1\] reaches its multiple k \* q for k = 1.00000e\+300 \(an int\), "
     r"and \|k\| must be <= 2\*\*53"),
    (lambda: automl.qloguniform(1e-3, 1.0, 1e-300), ValueError, r"^`q` is 1e-300, .*\|k\| must be <= 2\*\*53"),
    (lambda: automl.quniform(0, 1e300, 1), ValueError, r"^`q` is 1, .*\|k\| must be <= 2\*\*53"),
    (lambda: automl.quniform(0, 1, float("inf")), ValueError, r"^`q` is inf, but must be a finite real number"),
    (lambda: automl.randn(10**400, 1), ValueError, r"^`mean` is 1.00000e\+400 \(an int\), but must be a finite"),
    (lambda: automl.randn(0, 1e308), ValueError, r"^`sd` is 1e\+308 and `mean` 0, but `mean` ± 10 `sd` must be "
                                                 r"finite floats"),
    (lambda: automl.qrandn(0, 1, 1e-300), ValueError, r"^`q` is 1e-300, but a draw within `mean` ± 10 `sd` reaches "
                                                      r"its multiple k \* q for \|k\| up to 1.00000e\+301"),
    (lambda: automl.HyperBand(SPACE, max_epochs=2**70), ValueError,
     r"^`max_epochs` is 1.18059e\+21 \(an int\), but must be <= 9223372036854775807 \(an int64"),
    (lambda: automl.BOHB(SPACE, max_epochs=2**70), ValueError, r"^`max_epochs` is 1.18059e\+21 \(an int\), but must"),
    (lambda: automl.BOHB(SPACE, max_epochs=2**40), ValueError, r"^`max_epochs` is 1099511627776 \(with `eta` 3 and "
                                                               r"`iterations` 1\), but its bracket table starts "
                                                               r"1297486921747 configs, and at most 1,000,000"),
    (lambda: automl.HyperBand(SPACE, max_epochs=81, iterations=10**6), ValueError,
     r"^`max_epochs` is 81 \(with `eta` 3 and `iterations` 1000000\), but its bracket table starts 143000000 configs"),
    (lambda: automl.BOHB(SPACE, max_epochs=9, random_fraction=10**400), ValueError,
     r"^`random_fraction` is 1.00000e\+400 \(an int\), but must be in \[0, 1\]"),
    (lambda: automl.ASHA(SPACE, max_epochs=2**70, max_configs=4), ValueError, r"^`max_epochs` is 1.18059e\+21"),
    (lambda: automl.ASHA(SPACE, max_epochs=9, time_budget_s=10**400), ValueError,
     r"^`time_budget_s` is 1.00000e\+400 \(an int\), but must be a finite number > 0"),
    (lambda: automl.RandomSearch(SPACE, num_samples=2**63, epochs=1), ValueError, r"^`num_samples` is 9223372036854775808, but must be <= "
                                                                                       r"9223372036854775807"),
    (lambda: automl.RandomSearch(SPACE, num_samples=1, epochs=1, seed=2**64), ValueError,
     r"^`seed` is 1.84467e\+19 \(an int\), but must be <= 9223372036854775807"),
    (lambda: automl.OptunaSearch(SPACE, num_samples=2**70, epochs=1), ValueError, r"^`num_samples` is 1.18059e\+21"),
    (lambda: automl.PBT(SPACE, population=4, epochs=2, perturbation_interval=1, perturbation_factors=(10**400,)),
     ValueError, r"^`perturbation_factors` is \(1000.*, but must be a non-empty tuple of finite numbers > 0"),
    (lambda: automl.PBT(SPACE, population=4, epochs=2, perturbation_interval=1, quantile_fraction=float("nan")),
     ValueError, r"^`quantile_fraction` is nan, but must be in \(0, 0.5\]"),
    (lambda: automl.PBT(SPACE, population=4, epochs=2, perturbation_interval=1, resample_probability=10**400),
     ValueError, r"^`resample_probability` is 1.00000e\+400 \(an int\), but must be in \[0, 1\]"),
    (lambda: automl.PB2({**SPACE, "wd": 0.0}, population=4, epochs=2, perturbation_interval=1,
                        hyperparam_bounds={"wd": [0, 10**400]}),
     ValueError, r"^`hyperparam_bounds\['wd'\]` is \[0, 1000.*, but must be a \[lo, hi\] pair of finite numbers"),
    (lambda: automl.PB2({**SPACE, "n": 1}, population=4, epochs=2, perturbation_interval=1,
                        hyperparam_bounds={"n": [0, 2**70]}),
     ValueError, r"^`hyperparam_bounds\['n'\]` is \[0, 1180591620717411303424\], but `hi` is 1.18059e\+21 \(an int\), "
                 r"but must be an int in"),
])
def test_numeric_arguments_are_checked_at_construction_in_one_line(build, error, match):
    with pytest.raises(error, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_numpy_arguments_are_held_as_python_numbers():
    assert automl.uniform(np.float32(0.5), np.int64(2)) == automl.uniform(0.5, 2)
    assert type(automl.uniform(np.float32(0.5), 1).lo) is float and type(automl.randint(np.int8(1), 3).lo) is int
    assert automl.quniform(0, 1, np.float64(0.25)).q == 0.25 and type(automl.qrandint(0, 8, np.int16(2)).q) is int
