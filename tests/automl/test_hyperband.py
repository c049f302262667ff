from __future__ import annotations

import pytest

import automl
import simulators
from automl import ACTIVE, FAILED, STOPPED, ConfigState, Rung

# Li et al. 2017, Table 1 (R = 81, eta = 3): (n_i, r_i) per rung, brackets s = 4..0.
TABLE_81_3 = [
    [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    [(34, 3), (11, 9), (3, 27), (1, 81)],
    [(15, 9), (5, 27), (1, 81)],
    [(8, 27), (2, 81)],
    [(5, 81)],
]
# Cerebro appendix E.1 runs R = 25, eta = 3 (the paper gives no table); by hand from Li et al.'s formulas:
# s_max = 2, B = 75; s=2: n = ceil(3 * 9 / 3) = 9, r = 25/9 = 2.78 -> 3, then 25/3 = 8.33 -> 8, then 25;
# s=1: n = ceil(3 * 3 / 2) = 5 at 8, floor(5/3) = 1 at 25; s=0: n = 3 at 25.
TABLE_25_3 = [
    [(9, 3), (3, 8), (1, 25)],
    [(5, 8), (1, 25)],
    [(3, 25)],
]


def _table(max_epochs: int, eta: int) -> list[list[tuple[int, int]]]:
    return [[tuple(r) for r in b.rungs] for b in automl.hyperband_brackets(max_epochs, eta)]


def test_hyperband_brackets_match_li_et_al_table_1():
    assert _table(81, 3) == TABLE_81_3
    assert [b.s for b in automl.hyperband_brackets(81, 3)] == [4, 3, 2, 1, 0]


def test_hyperband_brackets_match_cerebro_appendix_e1():
    assert _table(25, 3) == TABLE_25_3


def test_hyperband_brackets_small_cases():
    assert _table(1, 3) == [[(1, 1)]]
    assert _table(9, 3) == [[(9, 1), (3, 3), (1, 9)], [(5, 3), (1, 9)], [(3, 9)]]
    assert automl.hyperband_brackets(4, 2)[0].rungs == (Rung(4, 1), Rung(2, 2), Rung(1, 4))


def test_hyperband_starts_every_bracket_in_the_first_round(space):
    decision = automl.HyperBand(space, max_epochs=81).step([])
    assert len(decision.add) == 81 + 34 + 15 + 8 + 5


def _states(procedure_configs, losses: dict[int, list[float]], status: dict[int, str] | None = None):
    status = status or {}
    return [
        ConfigState(
            id=i,
            config=c,
            epochs=len(losses[i]),
            history=tuple({"valid_loss": v} for v in losses[i]),
            status=status.get(i, ACTIVE),
        )
        for i, c in enumerate(procedure_configs)
    ]


def test_hyperband_keeps_the_best_of_a_rung_with_ties_by_id(space):
    # max_epochs=3, eta=3: bracket s=1 = ids 0-2, rungs (3 at 1 epoch, 1 at 3); bracket s=0 = ids 3-4, (2 at 3).
    hb = automl.HyperBand(space, max_epochs=3, eta=3)
    configs = hb.step([]).add
    assert len(configs) == 5
    losses = {0: [0.5], 1: [0.2], 2: [0.2], 3: [0.1], 4: [0.9]}
    first = hb.step(_states(configs, losses))
    assert first.stop == [0, 2] and first.pruned == [0, 2]  # 1 and 2 tie: the smaller id survives
    status = {0: STOPPED, 2: STOPPED}
    losses = {0: [0.5], 1: [0.2, 0.1], 2: [0.2], 3: [0.1, 0.1], 4: [0.9, 0.8]}
    assert hb.step(_states(configs, losses, status)).stop == []
    losses = {0: [0.5], 1: [0.2, 0.1, 0.1], 2: [0.2], 3: [0.1, 0.1, 0.1], 4: [0.9, 0.8, 0.7]}
    last = hb.step(_states(configs, losses, status))
    assert last.stop == [1, 3, 4] and last.pruned == []  # the last rung completes its budget


def test_hyperband_ranks_by_max_metric_when_bound_so(space):
    hb = automl.HyperBand(space, max_epochs=3, eta=3)
    hb.bind("valid_accuracy", "max")
    configs = hb.step([]).add
    states = [
        ConfigState(id=i, config=c, epochs=1, history=({"valid_accuracy": a},))
        for i, (c, a) in enumerate(zip(configs, [0.1, 0.9, 0.5, 0.3, 0.2], strict=True))
    ]
    assert hb.step(states).stop == [0, 2]


def test_hyperband_failed_configs_rank_last_and_free_no_extra_slot(space):
    hb = automl.HyperBand(space, max_epochs=3, eta=3)
    configs = hb.step([]).add
    losses = {0: [0.5], 1: [], 2: [0.7], 3: [0.1], 4: [0.9]}
    assert hb.step(_states(configs, losses, {1: FAILED})).stop == [2]


def test_hyperband_offline_run_trains_each_rung_its_epochs(space, objective):
    run = simulators.run_procedure_offline(automl.HyperBand(space, max_epochs=25, eta=3), objective)
    epochs = sorted(s.epochs for s in run.states)
    # bracket 2: 6 stop at 3, 2 at 8, 1 at 25; bracket 1: 4 at 8, 1 at 25; bracket 0: 3 at 25
    assert epochs == [3] * 6 + [8] * 6 + [25] * 5
    assert run.rounds == 25
    assert automl.HyperBand(space, max_epochs=25, eta=3).planned_epochs() == sum(epochs)  # the progress bar's total


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": 1}, r"`eta` is 1, but must be >= 2"),
        ({"max_epochs": 0}, r"`max_epochs` is 0, but must be >= 1"),
        ({"seed": -1}, r"`seed` is -1, but must be an int >= 0"),
    ],
)
def test_hyperband_rejects_bad_arguments(space, kwargs, message):
    with pytest.raises(ValueError, match=message):
        automl.HyperBand(space, **{"max_epochs": 9, **kwargs})


def test_hyperband_rejects_non_int_max_epochs(space):
    with pytest.raises(TypeError, match=r"`max_epochs` is 9.5, but must be an int >= 1"):
        automl.HyperBand(space, max_epochs=9.5)


def test_hyperband_rejects_unknown_options(space):
    with pytest.raises(TypeError, match="unexpected keyword argument 'grace_period'"):
        automl.HyperBand(space, max_epochs=9, grace_period=1)
