"""`unit_seed`: one seed per (run seed, config, epoch, partition, kind), the same in every process; `seed_everything`,
what a unit seeds with it."""

from __future__ import annotations

import itertools
import subprocess
import sys

from framework.scheduling.units import unit_seed


def test_unit_seed_is_a_pure_function_of_its_arguments():
    assert unit_seed(7, 1, 2, 3, 1) == unit_seed(7, 1, 2, 3, 1)
    assert isinstance(unit_seed(7, 1, 2, 3, 1), int) and 0 <= unit_seed(7, 1, 2, 3, 1) < 2**63


def test_unit_seed_differs_for_every_unit_of_a_run():
    # what a run seeds: each (config, epoch, partition, kind) unit, and each config's construction
    units = [unit_seed(0, *parts) for parts in itertools.product(range(4), range(3), range(3), range(2))]
    construction = [unit_seed(0, c) for c in range(4)]
    assert len(set(units + construction)) == len(units) + len(construction)


def test_unit_seed_depends_on_the_order_of_its_parts():
    assert unit_seed(0, 1, 2, 0, 1) != unit_seed(0, 2, 1, 0, 1)  # config 1 epoch 2 vs config 2 epoch 1
    assert unit_seed(0, 0, 0, 1, 1) != unit_seed(0, 0, 1, 0, 1)  # epoch and partition swapped


def test_unit_seed_differs_between_run_seeds():
    assert len({unit_seed(s, 1, 0, 0, 1) for s in range(50)}) == 50


def test_unit_seed_is_the_same_in_a_fresh_process():
    code = "from framework.scheduling.units import unit_seed; print(unit_seed(123, 4, 5, 6, 1))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == unit_seed(123, 4, 5, 6, 1)


def test_unit_seed_tells_a_shorter_tuple_from_one_padded_with_zeros():
    assert unit_seed(0, 1) != unit_seed(0, 1, 0)
    assert unit_seed(0, 0) != unit_seed(0)


def test_seed_everything_gives_the_draws_torch_manual_seed_gives_and_seeds_random_and_numpy():
    import random

    import numpy as np
    import torch

    from framework.engine.runner import seed_everything

    for seed in (0, 7, 2**40 + 3):
        torch.manual_seed(seed)
        want = torch.randn(5), torch.rand(3)
        seed_everything(seed)
        got = torch.randn(5), torch.rand(3)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        seed_everything(seed)
        a = random.random(), np.random.rand()
        seed_everything(seed)
        assert (random.random(), np.random.rand()) == a
