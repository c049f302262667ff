from __future__ import annotations

import math

import pytest

import automl
from automl import ConfigState, Decision, Procedure


class _Nothing(Procedure):
    def step(self, states):
        return Decision()


class _OwnMetric(_Nothing):
    def __init__(self) -> None:
        self.metric, self.mode = "valid_accuracy", "max"


def _state(i: int, *losses: float) -> ConfigState:
    return ConfigState(id=i, config={}, epochs=len(losses), history=tuple({"valid_loss": v} for v in losses))


def test_bind_sets_metric_mode_storage_and_num_workers():
    p = _Nothing()
    p.bind("valid_accuracy", "max", "/tmp/run", num_workers=3)
    assert (p.metric, p.mode, p.storage_path, p.num_workers) == ("valid_accuracy", "max", "/tmp/run", 3)


def test_bind_keeps_positional_three_argument_form():
    p = _Nothing()
    p.bind("valid_loss", "min", None)
    assert p.num_workers is None and p.storage_path is None


def test_bind_keeps_a_procedures_own_metric():
    p = _OwnMetric()
    p.bind("valid_loss", "min", None, num_workers=2)
    assert (p.metric, p.mode, p.num_workers) == ("valid_accuracy", "max", 2)


def test_bind_can_rebind_a_metric_it_set():
    p = _Nothing()
    p.bind("valid_loss", "min")
    p.bind("valid_accuracy", "max")
    assert (p.metric, p.mode) == ("valid_accuracy", "max")


def test_bind_rejects_bad_mode():
    with pytest.raises(ValueError, match=r"`mode` is 'minimize', but must be 'min' or 'max'"):
        _Nothing().bind("valid_loss", "minimize")


def test_bind_rejects_bad_num_workers():
    with pytest.raises(ValueError, match=r"`num_workers` is 0, but must be None or an int >= 1"):
        _Nothing().bind("valid_loss", "min", num_workers=0)


def test_claim_takes_a_procedure_for_one_run_and_refuses_a_second():
    p = _Nothing()
    p.claim()
    with pytest.raises(ValueError, match=r"`procedure` \(_Nothing\) has already run"):
        p.claim()
    _Nothing().claim()  # another object of the class is free


def test_score_at_an_epoch_and_missing_values_rank_last():
    p = _Nothing()
    s = _state(0, 0.5, 0.2)
    assert p.score(s) == -0.2 and p.score(s, epochs=1) == -0.5
    assert p.score(s, epochs=3) == -math.inf
    assert p.score(_state(1, math.nan)) == -math.inf


def test_rank_orders_best_first_with_ties_by_id():
    p = _Nothing()
    assert p.rank([_state(3, 0.2), _state(0, 0.5), _state(1, 0.2), _state(2)]) == [1, 3, 0, 2]
    p.bind("valid_loss", "max")
    assert p.rank([_state(3, 0.2), _state(0, 0.5), _state(1, 0.2)]) == [0, 1, 3]


def test_check_states_rejects_missing_or_reordered_ids():
    automl.check_states([_state(0), _state(1)], 2)
    with pytest.raises(RuntimeError, match=r"`states` has ids \[0\] \(1 added by the procedure\), but the procedure "
                       r"issued 2 configs"):
        automl.check_states([_state(0)], 2)
    person = automl.ConfigState(1, {}, origin=automl.PERSON, owner=automl.PERSON)
    automl.check_states([_state(0), person], 1)  # a config a person added is not the procedure's
    with pytest.raises(RuntimeError, match=r"1 added by the procedure"):
        automl.check_states([_state(0), person], 2)
    with pytest.raises(RuntimeError, match=r"has ids \[1, 0\]"):
        automl.check_states([_state(1), _state(0)], 2)


def test_random_search_samples_num_samples_configs(space):
    configs = automl.RandomSearch(space, num_samples=6, epochs=2, seed=3).step([]).add
    assert len(configs) == 6 and len({repr(c) for c in configs}) == 6
    assert configs == automl.RandomSearch(space, num_samples=6, epochs=2, seed=3).step([]).add
    assert configs != automl.RandomSearch(space, num_samples=6, epochs=2, seed=4).step([]).add


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 0}, r"`num_samples` is 0, but must be >= 1"),
        ({"epochs": 0}, r"`epochs` is 0, but must be >= 1"),
        ({"seed": -1}, r"`seed` is -1, but must be an int >= 0"),
    ],
)
def test_random_search_rejects_bad_arguments(space, kwargs, message):
    with pytest.raises(ValueError, match=message):
        automl.RandomSearch(space, **{"num_samples": 2, "epochs": 2, **kwargs})


def test_random_search_rejects_bad_space():
    with pytest.raises(ValueError, match=r"`lo` is 1, but must be < `hi` \(0\)"):
        automl.RandomSearch({"x": automl.uniform(1, 0)}, num_samples=2, epochs=1)
    with pytest.raises(ValueError, match=r"`space` is \{\}"):
        automl.RandomSearch({}, num_samples=2, epochs=1)


def test_grid_search_is_the_cartesian_product():
    configs = automl.GridSearch({"a": [1, 2], "b": ["x", "y", "z"]}, epochs=1).step([]).add
    assert len(configs) == 6 and configs[0] == {"a": 1, "b": "x"} and configs[-1] == {"a": 2, "b": "z"}


def test_grid_search_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"`space\['a'\]` is \[\], but must be a non-empty list"):
        automl.GridSearch({"a": []}, epochs=1)
    with pytest.raises(ValueError, match=r"`epochs` is 0, but must be an int >= 1"):
        automl.GridSearch({"a": [1]}, epochs=0)


def test_procedure_workers_changed_updates_the_concurrency_hint():
    p = automl.GridSearch({"lr": [0.1]}, epochs=1)
    p.bind("valid_loss", "min", None, num_workers=2)
    p.workers_changed(3)
    assert p.num_workers == 3
    p.workers_changed(0)  # every worker lost for now: no hint
    assert p.num_workers is None


def test_procedure_workers_changed_rejects_a_negative_count():
    with pytest.raises(ValueError, match="`num_workers` is -1, but must be an int >= 0"):
        automl.GridSearch({"lr": [0.1]}, epochs=1).workers_changed(-1)


def test_a_decision_prunes_only_configs_it_stops():
    assert Decision(stop=[1, 2], pruned=[2]).pruned == [2]
    with pytest.raises(ValueError, match=r"`pruned` holds \[3\], but every pruned id must also be in `stop` \(\[1\]\)"):
        Decision(stop=[1], pruned=[3])
