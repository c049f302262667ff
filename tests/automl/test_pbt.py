from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import automl
import simulators
from automl import ACTIVE, FAILED, STOPPED, ConfigState


def _drive(procedure, loss, max_rounds: int = 50, fail: set[tuple[int, int]] = frozenset()):
    """A scripted engine: config `i` reports `loss(i, e)` in its own epoch `e`; (i, e) in `fail` fails it."""
    states: list[ConfigState] = []
    decisions = []

    def apply(d):
        decisions.append(d)
        for i in d.stop:
            assert states[i].status == ACTIVE
            states[i] = replace(states[i], status=STOPPED)
        for c in d.add:
            states.append(ConfigState(id=len(states), config=c))
        for p, c in d.clone:
            states.append(ConfigState(id=len(states), config=c, parent=p))

    apply(procedure.step([]))
    for _ in range(max_rounds):
        if not any(s.status == ACTIVE for s in states):
            break
        for s in list(states):
            if s.status == ACTIVE and (s.id, s.epochs) in fail:
                states[s.id] = replace(s, status=FAILED)
            elif s.status == ACTIVE:
                metrics = {"valid_loss": loss(s.id, s.epochs)}
                states[s.id] = replace(s, epochs=s.epochs + 1, history=(*s.history, metrics))
        apply(procedure.step(list(states)))
    return states, decisions


AT_2 = {0: 0.5, 1: 0.1, 2: 0.7, 3: 0.3, 4: 0.9, 5: 0.2, 6: 0.4, 7: 0.6}  # ranking: 1, 5, 3, 6, 0, 7, 2, 4


def test_pbt_clones_the_top_quantile_into_the_bottom_quantile(space):
    # population 8, quantile 0.25 -> 2 donors (1, 5) and 2 victims, worst first (4, 2)
    pbt = automl.PBT(space, population=8, epochs=4, perturbation_interval=2)
    states, decisions = _drive(pbt, lambda i, e: AT_2.get(i, 0.05) + (1 - e) * 0.01)
    assert [d.stop for d in decisions] == [[], [], [2, 4], [], [0, 1, 3, 5, 6, 7, 8, 9]]
    assert [d.pruned for d in decisions] == [[], [], [2, 4], [], []]  # replaced members are pruned
    assert [src for src, _ in decisions[2].clone] == [1, 5]
    assert (states[8].parent, states[9].parent) == (1, 5)
    assert pbt.members == [0, 1, 9, 3, 8, 5, 6, 7]  # each clone takes its victim's slot
    assert pbt.offsets[8] == pbt.offsets[9] == 2
    assert (states[8].epochs, states[9].epochs) == (2, 2)  # 2 inherited + 2 own = 4 epochs per lineage


def test_pbt_clones_get_perturbed_donor_configs_inside_the_space(space):
    pbt = automl.PBT(space, population=8, epochs=4, perturbation_interval=2)
    states, decisions = _drive(pbt, lambda i, e: AT_2.get(i, 0.05))
    searched = automl.SearchSpace(space)
    assert len(decisions[2].clone) == 2  # the loop below checks something
    for source, config in decisions[2].clone:
        donor = states[source].config
        assert searched.contains(config)
        assert config != donor
        assert config["batch_size"] == donor["batch_size"]


def test_pbt_every_lineage_trains_exactly_epochs(space, objective):
    pbt = automl.PBT(space, population=6, epochs=5, perturbation_interval=2, quantile_fraction=0.5)
    run = simulators.run_procedure_offline(pbt, objective)
    final = run.decisions[-1].stop
    assert sorted(final) == sorted(pbt.members) and len(final) == 6
    assert all(run.weight_epochs[i] == 5 for i in final)
    replaced = [i for d in run.decisions[:-1] for i in d.stop]
    assert replaced and all(run.weight_epochs[i] in (2, 4) for i in replaced)
    assert run.rounds == 5
    assert pbt.planned_epochs() == sum(s.epochs for s in run.states) == 30  # the progress bar's total


def test_pbt_replaces_failed_members_at_the_next_perturbation(space):
    pbt = automl.PBT(space, population=4, epochs=4, perturbation_interval=2)
    # id 3 fails in its first epoch; at epoch 2 the worst (2) and the failed one (3) are replaced by 0's clones
    states, decisions = _drive(pbt, lambda i, e: [0.1, 0.2, 0.3, 0.4][i] if i < 4 else 0.05, fail={(3, 0)})
    assert decisions[2].stop == [2]
    assert [src for src, _ in decisions[2].clone] == [0, 0]
    assert pbt.members == [0, 1, 4, 5]


def test_pbt_perturb_moves_numbers_by_a_fifth_and_categories_to_neighbours():
    space = automl.SearchSpace(
        {"lr": automl.uniform(0.0, 1.0), "n": automl.randint(1, 100), "act": ["a", "b", "c"], "k": 7}
    )
    rng = np.random.default_rng(0)
    seen_lr, seen_act = set(), set()
    for _ in range(100):
        c = automl.perturb(space, {"lr": 0.5, "n": 50, "act": "a", "k": 7}, rng, resample_probability=0.0)
        seen_lr.add(round(c["lr"], 6))
        seen_act.add(c["act"])
        assert c["n"] in (40, 60) and c["k"] == 7
    assert seen_lr == {0.4, 0.6}
    assert seen_act == {"a", "b"}  # the neighbour of the first entry, clipped at the end
    top = automl.perturb(space, {"lr": 0.95, "n": 100, "act": "c", "k": 7}, np.random.default_rng(1), 0.0)
    assert top["lr"] <= 1.0 and top["n"] <= 100


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"population": 1}, r"`population` is 1, but must be >= 2"),
        ({"epochs": 0}, r"`epochs` is 0, but must be >= 1"),
        ({"perturbation_interval": 0}, r"`perturbation_interval` is 0, but must be >= 1"),
        ({"quantile_fraction": 0}, r"`quantile_fraction` is 0, but must be in \(0, 0.5\]"),
        ({"quantile_fraction": 0.6}, r"`quantile_fraction` is 0.6, but must be in \(0, 0.5\]"),
        ({"seed": -1}, r"`seed` is -1, but must be an int >= 0"),
    ],
)
def test_pbt_rejects_bad_arguments(space, kwargs, message):
    with pytest.raises(ValueError, match=message):
        automl.PBT(space, **{"population": 4, "epochs": 4, "perturbation_interval": 2, **kwargs})


def test_pbt_rejects_unknown_options(space):
    with pytest.raises(TypeError, match="unexpected keyword argument 'burn_in'"):
        automl.PBT(space, population=4, epochs=4, perturbation_interval=2, burn_in=1)


def test_perturb_moves_a_categorical_to_a_neighbour_clipped_at_the_ends():
    from automl.pbt import perturb

    space = automl.SearchSpace({"width": [8, 16, 32, 64]})
    seen = {}
    for seed in range(60):
        for start in (8, 16, 64):
            got = perturb(space, {"width": start}, np.random.default_rng(seed), resample_probability=0.0)["width"]
            seen.setdefault(start, set()).add(got)
    assert seen == {8: {8, 16}, 16: {8, 32}, 64: {32, 64}}  # one step either way; the ends stay put going out


def test_perturb_scales_numbers_by_exactly_0_8_or_1_2():
    from automl.pbt import perturb

    space = automl.SearchSpace({"lr": automl.uniform(0.0, 10.0)})
    got = {round(perturb(space, {"lr": 1.0}, np.random.default_rng(s), 0.0)["lr"], 12) for s in range(40)}
    assert got == {0.8, 1.2}
